"""The convert stage: a ChatTTS checkpoint -> self-contained ONNX artifact folders (FP32, FP16).

Library use::

    from chattts_forge.convert.export import convert_checkpoint
    dirs = convert_checkpoint("build/checkpoint-tiny-seed0", "build/artifacts", precision="all")
    # {"fp32": Path("build/artifacts/fp32"), "fp16": Path("build/artifacts/fp16")}

What happens (see docs/artifact-format.md for the folder layout and graph interfaces):

1. ChatTTS's own `Chat` is loaded from the checkpoint (`chattts_forge.torch_ref.chat.load_chat`).
2. Every component (embed, gpt, head_code, head_text, decoder, dvae, dvae_encoder, vocos) is exported with the
   TorchScript exporter (opset 17, dynamic batch/sequence/past axes) from an export-friendly
   wrapper around ChatTTS's modules (`chattts_forge.convert.modules`), and written as the runtime
   maps it (`graph_storage.write_component`: external data for the per-request graphs), hashed once.
3. Parity, as Optimum validates exports: each graph runs in onnxruntime (CPU) against ChatTTS's
   PyTorch code path on several shapes (batch 1 and 3, past 0 and > 0, short and long); max
   abs/rel errors go into artifact.json; outside 1e-4 abs the conversion fails and writes nothing.
4. FP16 (`chattts_forge.convert.fp16`): every component but the vocoder and the DVAE encoder
   (voice cloning must give ChatTTS's exact codes) is converted with float32
   kept at the graph boundary; its error against the FP32 graph is measured and recorded (and must
   stay within `FP16_TOLERANCE_REL` of the output's scale); the FP16 folder's `vocos.onnx` and
   `dvae_encoder.onnx` are byte copies of the FP32 ones.
5. The fused GPT graph (`quantize.fast_gpt_graph.optimize_gpt`), the support files (tokenizer,
   speaker statistics, DVAE coefficients, homophone map) and artifact.json, written once; every folder is written through `fsutil.atomic_output_dir`, so a failed or
   killed conversion leaves no partial artifact folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import click
import torch

from chattts_forge.artifact import (
    COMPONENTS,
    EXTERNAL_DATA_SUFFIX,
    FAST_GPT,
    FAST_GPT_FILE,
    GPT,
    with_record_fields,
)
from chattts_forge.checkpoint.layout import Dims, load_dims, resolve_asset_dir
from chattts_forge.convert.components import SPEC_BUILDERS, ComponentSpec, SourceModules
from chattts_forge.convert.fp16 import convert_to_fp16
from chattts_forge.convert.metadata import (
    io_description,
    metadata_props,
    source_record,
    special_tokens,
    write_artifact_json,
    write_support_files,
)
from chattts_forge.convert.onnx_export import (
    OPSET,
    TORCHSCRIPT_CONVERTER,
    export_model,
    set_metadata,
)
from chattts_forge.convert.parity import ParityCase, check_parity, make_session
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_output_dir
from chattts_forge.graph_storage import write_component
from chattts_forge.log import get_logger
from chattts_forge.options import option
from chattts_forge.progress import Progress
from chattts_forge.quantize.fast_gpt_graph import FusedGraphOptions, optimize_gpt
from chattts_forge.torch_ref.chat import load_chat

log = get_logger(__name__)

PRECISIONS = ("fp32", "fp16", "all")
FP32_TOLERANCE_ABS = 1e-4
# FP16 graphs are checked against the FP32 graph: worst error relative to the output's scale.
FP16_TOLERANCE_REL = 5e-2
# fp16.converters entry of a component kept FP32 in the FP16 folder (vocos, dvae_encoder).
KEPT_FP32 = "none (kept FP32"


def _check_output_parent(out: Path) -> None:
    """Fail before any heavy work when `out` cannot be created or written."""
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise BadInput(f"output path {probe} exists and is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ForgeError(f"output folder {probe} is not writable")


def _load_sources(asset_dir: Path) -> tuple[Any, SourceModules]:
    try:
        chat = load_chat(asset_dir)
    except ForgeError:
        raise
    except Exception as e:  # safetensors/transformers raise many types on a broken file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ForgeError(f"{asset_dir}: cannot load the checkpoint ({type(e).__name__}: {first})") from None
    return chat, SourceModules.from_chat(chat)


@contextlib.contextmanager
def _scratch_dir(parent: Path) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix=".convert-fp32.", suffix=".partial", dir=parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """Temp folders/files are created private (0700/0600); an artifact is meant to be shared."""
    folder.chmod(0o755)
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o644)


@dataclass(frozen=True)
class _Targets:
    """Where and how the graphs are written: the folders (no FP16 one: None), opset, threads."""

    dims: Dims
    dir32: Path
    dir16: Path | None
    opset: int
    threads: int


def _base_record(spec: ComponentSpec, precision: str, converter: str, opset: int) -> dict[str, Any]:
    inputs, outputs = io_description(spec)
    return {"file": spec.file, "precision": precision, "opset": opset, "converter": converter, "inputs": inputs,
            "outputs": outputs}


def _export_fp32(spec: ComponentSpec, model: Any, cases: list[ParityCase], to: _Targets,
                 outputs32: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the FP32 graph, check it against ChatTTS's PyTorch code on `cases` (outputs kept in
    `outputs32` for the FP16 check); its component record."""
    t0 = time.perf_counter()
    set_metadata(model, metadata_props(spec, to.dims, "fp32", TORCHSCRIPT_CONVERTER))
    rec = write_component(model, to.dir32, spec.name, _base_record(spec, "fp32", TORCHSCRIPT_CONVERTER, to.opset))
    session = make_session(to.dir32 / spec.file, to.threads)
    parity = check_parity(session, cases, spec.tolerance_abs, f"{spec.name} (fp32)", collect=outputs32)
    del session
    rec = with_record_fields(rec, parity={"reference": "ChatTTS PyTorch (fp32)", **parity})
    log.info(
        "%s: fp32 %s (%.1f MB), parity max abs %.2e, max rel %.2e over %d cases (%.1fs)",
        spec.name, spec.file, rec["bytes"] / 1e6, parity["max_abs"], parity["max_rel"], len(cases),
        time.perf_counter() - t0,
    )  # fmt: skip
    return rec


def _export_fp16(spec: ComponentSpec, model: Any, cases: list[ParityCase], to: _Targets,
                 outputs32: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Convert the FP32 `model` to FP16, write it, check it against the FP32 graph's `outputs32`;
    (its component record, what the converter did)."""
    assert to.dir16 is not None
    t1 = time.perf_counter()
    model16, conv = convert_to_fp16(model, spec.name)
    set_metadata(model16, metadata_props(spec, to.dims, "fp16", conv["converter"]))
    rec16 = write_component(model16, to.dir16, spec.name, _base_record(spec, "fp16", conv["converter"], to.opset))
    del model16
    # FP16 against the FP32 graph, on the same inputs (padding masked out as for fp32).
    cases16 = [ParityCase(c.name, c.inputs, o, c.masks) for c, o in zip(cases, outputs32, strict=True)]
    session16 = make_session(to.dir16 / spec.file, to.threads)
    parity16 = check_parity(session16, cases16, None, f"{spec.name} (fp16)", tolerance_rel=FP16_TOLERANCE_REL)
    del session16
    extra = {"parity": {"reference": "FP32 ONNX graph", **parity16}, "op_block_list": conv["op_block_list"]}
    if "fallback_from" in conv:
        extra["converter_fallback_from"] = conv["fallback_from"]
    log.info(
        "%s: fp16 by %s (%.1f MB), vs fp32 max abs %.2e, max rel %.2e (%.1fs)",
        spec.name, conv["converter"], rec16["bytes"] / 1e6, parity16["max_abs"], parity16["max_rel"],
        time.perf_counter() - t1,
    )  # fmt: skip
    conv["error_vs_fp32"] = {"max_abs": parity16["max_abs"], "max_rel": parity16["max_rel"]}
    return with_record_fields(rec16, **extra), conv


def _fp16_summary(fp16_info: dict[str, Any]) -> None:
    """One line for readers of the contract's `fp16.converter`; per component in `converters`."""
    converted = {n: c for n, c in fp16_info["converters"].items() if not c.startswith(KEPT_FP32)}
    used = list(converted.values())
    main = max(set(used), key=used.count)
    others = [f"{n}: {c}" for n, c in converted.items() if c != main]
    fp16_info["converter"] = main + (f" ({'; '.join(others)})" if others else "")


def _export_all(src: SourceModules, to: _Targets) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Every component exported, written (as the runtime maps it), checked and recorded: (FP32
    records, FP16 records, the `fp16` section)."""
    comps32: dict[str, Any] = {}
    comps16: dict[str, Any] = {}
    fp16_info: dict[str, Any] = {"converter": "", "converters": {}, "op_block_list": [], "error_vs_fp32": {}}
    bar = Progress(len(COMPONENTS), "convert", "graph", leave=False)
    for name in COMPONENTS:
        bar.set_postfix_str(name)
        spec = SPEC_BUILDERS[name](src, to.dims)
        model = export_model(spec, to.opset)
        cases = spec.cases()
        outputs32: list[dict[str, Any]] = []
        comps32[name] = rec = _export_fp32(spec, model, cases, to, outputs32)
        if to.dir16 is not None and spec.fp16:
            comps16[name], conv = _export_fp16(spec, model, cases, to, outputs32)
            fp16_info["converters"][name] = conv["converter"]
            fp16_info["op_block_list"] = sorted(set(fp16_info["op_block_list"]) | set(conv["op_block_list"]))
            fp16_info["error_vs_fp32"][name] = conv["error_vs_fp32"]
        elif to.dir16 is not None:
            # The vocoder stays FP32: the very same bytes in both folders.
            for f in (to.dir32 / spec.file, to.dir32 / (spec.file + EXTERNAL_DATA_SUFFIX)):
                if f.is_file():
                    shutil.copyfile(f, to.dir16 / f.name)
            comps16[name] = dict(rec)
            fp16_info["converters"][name] = f"{KEPT_FP32}, byte-identical to fp32/)"
        # Free the graph and the cases now (the full GPT is ~0.8 GB in each form).
        del model, cases, outputs32, spec
        bar.update(1)
    bar.close()
    if to.dir16 is not None:
        _fp16_summary(fp16_info)
    return comps32, comps16, fp16_info


@dataclass(frozen=True)
class ConvertConfig:
    """One `chattts-forge convert` run, each option declared on its field (chattts_forge.options);
    `run` hands it to `convert_checkpoint`."""

    checkpoint: str = option(
        MISSING, "--checkpoint", "ChatTTS checkpoint: asset folder, snapshot root, HF cache, or 'hf' (default HF cache).")
    out: str = option(MISSING, "--out", "Output folder; artifacts go to OUT/fp32 and OUT/fp16.",
                      kind=click.Path(file_okay=False))
    precision: str = option("all", "--precision", "Which artifact folders to write.", choices=PRECISIONS,
                            show_default=True)
    threads: int = option(2, "--threads", "CPU threads for torch and onnxruntime.", kind=int, show_default=True)
    fast_gpt: bool = option(
        True, "--fast-gpt/--no-fast-gpt",
        "Also write gpt_fast.onnx (fused ops, in-place KV cache) into fp32/; the runtime prefers it on CPU.",
        show_default=True)

    def run(self) -> dict[str, Path]:
        return convert_checkpoint(self.checkpoint, self.out, precision=self.precision, threads=self.threads,
                                  fast_gpt=self.fast_gpt)


def convert_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    precision: str = "all",
    *,
    opset: int = OPSET,
    threads: int = 2,
    fast_gpt: bool = True,
) -> dict[str, Path]:
    """Convert the ChatTTS checkpoint at `checkpoint` into `out/fp32` and/or `out/fp16`.

    `precision`: "fp32", "fp16" or "all". Returns {"fp32": dir, "fp16": dir} for what was written.
    `fast_gpt`: also write `gpt_fast.onnx` into fp32/ (quantize.fast_gpt_graph: fused Llama ops with an
    in-place KV cache, checked against gpt.onnx); the runtime runs it by default on CPU.
    Raises ForgeError (nothing written) on a broken checkpoint, an unwritable output or a failed
    parity check.
    """
    if precision not in PRECISIONS:
        raise BadInput(f"unknown precision '{precision}' (choose from: {', '.join(PRECISIONS)})")
    t_start = time.perf_counter()
    asset_dir = resolve_asset_dir(checkpoint)
    out = Path(out).expanduser()
    _check_output_parent(out)
    dims = load_dims(asset_dir)
    chat, src = _load_sources(asset_dir)
    tokens = special_tokens(asset_dir / "tokenizer" / "tokenizer.json", dims)
    source = source_record(asset_dir, out / "fp32")  # fp32/ and fp16/ are siblings: one relative path

    created_out = not out.exists()
    want32 = precision in ("fp32", "all")
    want16 = precision in ("fp16", "all")
    result: dict[str, Path] = {}
    old_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        with contextlib.ExitStack() as stack:
            if want32:
                dir32 = stack.enter_context(atomic_output_dir(out / "fp32"))
            else:
                out.mkdir(parents=True, exist_ok=True)
                dir32 = stack.enter_context(_scratch_dir(out))
            dir16 = stack.enter_context(atomic_output_dir(out / "fp16")) if want16 else None
            log.info("converting %s -> %s (%s)", asset_dir, out, precision)
            comps32, comps16, fp16_info = _export_all(src, _Targets(dims, dir32, dir16, opset, threads))
            common = {"dims": dims, "tokens": tokens, "source": source}
            for folder in (d for d in (dir32, dir16) if d is not None):
                files = write_support_files(folder, asset_dir, chat)
                common["files"] = files
            if want32:
                if fast_gpt:
                    log.info("building the fused GPT graph (gpt_fast.onnx)")
                    comps32[FAST_GPT] = optimize_gpt(dir32 / comps32[GPT]["file"], dir32 / FAST_GPT_FILE,
                                                     FusedGraphOptions(threads=threads, dims=dims.to_dict()))
                write_artifact_json(dir32, variant="fp32", components=comps32, fp16=None, threads=threads, **common)
                _make_readable(dir32)
                result["fp32"] = out / "fp32"
            if dir16 is not None:
                write_artifact_json(dir16, variant="fp16", components=comps16, fp16=fp16_info, threads=threads,
                                    **common)
                _make_readable(dir16)
                result["fp16"] = out / "fp16"
    except BaseException:
        if created_out and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        torch.set_num_threads(old_threads)
    for variant, folder in result.items():
        log.info("wrote %s artifact to %s", variant, folder)
    log.info("conversion finished in %.1fs", time.perf_counter() - t_start)
    return result
