"""quantize stage: FP32 artifact -> dynamic INT8, static INT8 (QDQ) or INT4 weight-only artifact.

Library::

    from chattts_forge.quantize import quantize_artifact, measure_fidelity
    quantize_artifact("artifacts/fp32", "artifacts/int8-dynamic", method="dynamic")
    quantize_artifact("artifacts/fp32", "artifacts/int8-static", method="static",
                      calibration="build/calib", min_agreement=0.99)       # accuracy-driven fallback
    quantize_artifact("artifacts/fp32", "artifacts/int4", method="int4", block_size=128)
    fid = measure_fidelity("artifacts/fp32", "artifacts/int4", corpus="builtin:evaluation")

What is quantized: the GPT's constant-weight MatMuls (q/k/v/o, gate/up/down) and the code head
(`head_code`, one MatMul; `quantize_head=False` keeps it FP32). Attention MatMuls (both inputs are
activations), the embeddings (Gathers), the text head (unused by the code stage) and the conv
components (decoder, dvae: dynamic ConvInteger is a slow CPU path) stay FP32; vocos.onnx is copied
byte for byte and its sha256 is checked. Method details: `dynamic.py`, `static.py`, `int4.py`.
A fused `gpt_fast.onnx` in the source (runtime.fast_gpt_graph) is FP32 and never copied: dynamic/int4
rebuild it with the same quantizer (`quantize.fast_gpt.optimize_gpt`), static and fallback runs drop
it so the runtime uses the quantized `gpt.onnx`. Calibration: `chattts-forge calibrate`
(`chattts_forge.calibration_data`). Decode-step timing of the results:
`python -m chattts_forge.quantize.stepbench FP32_DIR QUANT_DIR...`.

The output is a complete artifact folder (written atomically) that `chattts-forge synth` runs. Its
artifact.json gets: `variant` (int8-dynamic | int8-static | int4), per-component `precision`/
`sha256`/`bytes`, `"quantization"` (method, options, per-graph op summary and per-op precision,
excluded nodes, calibration corpus hash and sample counts, fallback steps, sizes, library versions;
like Optimum's ort_config.json) and `"fidelity"`.

`measure_fidelity(fp32_dir, quant_dir, corpus="builtin:evaluation", max_sentences=8,
max_new_token=48, seed=0, threads=None, per_tensor=True, top_tensors=10)` returns (and
artifact.json stores under "fidelity")::

    {
      "reference": str,                          # the FP32 artifact folder
      "corpus": {"name": str, "sha256": str, "sentences_used": int},
      "method": "teacher-forced replay of FP32 runtime trajectories (raw code logits)",
      "settings": {"max_sentences": int, "max_new_token": int, "seed": int},
      "teacher_forced": {
        "top1_agreement": {"mean": float, "min_stream": float, "per_stream": [float] * num_vq},
        "kl": {"mean": float, "max_stream": float, "per_stream": [float] * num_vq},   # nats, KL(fp32||q)
        "steps": int},                           # GPT steps x rows compared
      "hidden_cosine": {"mean": float, "min": float},   # GPT last hidden state, per step
      "mel": {"snr_db": float, "lsd_db": float, "frames": int},   # after each artifact's Decoder
      "per_tensor": {                            # absent when per_tensor=False
        "graph": "gpt", "samples": int, "tensors_compared": int,
        "worst_local": [{"node", "op_type", "tensor", "rel_error", "cosine", "input_rel_error",
                         "local_error", "producer_of_input"}],   # sorted by error the node adds
        "worst_output": [{"node", "rel_error", "cosine"}],       # sorted by output error
        "all_local": None | [...],               # every row, when keep_all_tensors=True
        "head_code_rel_error": float},           # the code head alone, on FP32 hidden states
      "gpt_fast": {"teacher_forced": {...as above}, "hidden_cosine": {...}}   # only when the artifact
    }                                            # has a fused gpt_fast graph (replayed by FastGptStep)

Fidelity is weight-agnostic: it compares the quantized graphs with their own FP32 source on the
held-out split, so it means the same on synthetic (random) checkpoints as on the released one.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import (
    atomic_output_dir,
    atomic_write_json,
    portable_path,
    recorded_path,
    sha256_file,
)
from chattts_forge.log import get_logger
from chattts_forge.quantize.fidelity import measure_fidelity, record_trajectories, summary_line

log = get_logger(__name__)

METHODS = ("dynamic", "static", "int4")
FAST_GPT = "gpt_fast"
VARIANTS = {"dynamic": "int8-dynamic", "static": "int8-static", "int4": "int4"}
PRECISIONS = {"dynamic": "int8", "static": "int8", "int4": "int4"}
NOT_QUANTIZED = {
    "embed": "fp32 (Gather lookups; no integer kernel gain)",
    "head_text": "fp32 (text head: only used by text refinement)",
    "decoder": "fp32 (convolutions: dynamic ConvInteger is a slow onnxruntime CPU path)",
    "dvae": "fp32 (convolutions)",
    "vocos": "fp32, copied byte for byte",
}

__all__ = ["METHODS", "measure_fidelity", "quantize_artifact"]


def _per_op_precision(summary: dict[str, Any], method: str) -> dict[str, str]:
    """Which op types ended up in which precision in one quantized graph."""
    out: dict[str, str] = {}
    q = summary["quantized_ops"]
    if "MatMulNBits" in q:
        out["MatMulNBits"] = "int4 weights, int8 compute (accuracy_level 4)" if method == "int4" else "int4"
    if "MatMulInteger" in q:
        out["MatMulInteger"] = "int8 weights x uint8 activations (dynamic)"
    if "QuantizeLinear" in q or "DequantizeLinear" in q:
        out["QDQ MatMul"] = "int8 weights, calibrated activations (QDQ, fused by onnxruntime)"
    left = summary["float_ops_left"]
    if left:
        out.update({f"{k} (remaining {v})": "fp32" for k, v in left.items()})
    return out


def _rebuild_fast_gpt(src: Path, tmp: Path, method: str, block_size: int, accuracy_level: int,
                      per_channel: bool, qmeta: dict[str, Any]) -> str:
    """Quantized `gpt_fast.onnx` for dynamic/int4 (same onnxruntime quantizers), dropped for static."""
    if method == "static":
        return "dropped: no QDQ fast graph (its inputs differ from the calibrated plain graph); runtime uses gpt.onnx"
    from chattts_forge.quantize.fast_gpt import optimize_gpt
    from chattts_forge.runtime.fast_gpt_graph import FAST_GPT_FILE

    try:
        record = optimize_gpt(src, tmp / FAST_GPT_FILE, quantize=method, weights_from=src, block_size=block_size,
                              accuracy_level=accuracy_level, per_channel=per_channel)
    except ForgeError as e:
        log.warning("could not rebuild the fast GPT graph quantized (%s); the artifact uses gpt.onnx", e)
        return f"dropped: rebuild failed ({e})"
    qmeta["components"][FAST_GPT] = record
    # Recorded in artifact.json: the wording predates the builder's move out of convert and is kept
    # so that published artifacts stay byte-identical.
    return f"rebuilt with convert.optimize.optimize_gpt(quantize='{method}') from the FP32 weights"


def quantize_artifact(
    artifact_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    method: str,
    *,
    calibration: str | os.PathLike[str] | None = None,
    per_channel: bool | None = None,
    calibrate_method: str = "minmax",
    symmetric_activations: bool = False,
    activation_type: str = "uint8",
    exclude: tuple[str, ...] | list[str] = (),
    block_size: int = 128,
    accuracy_level: int = 4,
    quantize_head: bool = True,
    min_agreement: float | None = None,
    min_cosine: float | None = None,
    max_kl: float | None = None,
    step_nodes: int | None = None,
    fidelity: bool = True,
    fidelity_corpus: str = "builtin:evaluation",
    fidelity_sentences: int = 8,
    fidelity_steps: int = 48,
    seed: int = 0,
    threads: int | None = None,
    progress: bool | None = None,
) -> Path:
    """Write a quantized copy of the FP32 artifact at `artifact_dir` to `out_dir` (see module docstring)."""
    from chattts_forge.quantize.artifact import (
        component_file,
        component_files,
        component_record,
        copy_metadata_props,
        copy_unchanged,
        graph_summary,
        read_artifact_json,
        require_fp32_source,
    )
    from chattts_forge.quantize.fallback import Targets, check_method, producers_of, run_fallback
    from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

    src = Path(artifact_dir)
    out = Path(out_dir)
    if method not in METHODS:
        raise ForgeError(f"unknown method '{method}' (choose from: {', '.join(METHODS)})")
    meta = read_artifact_json(src)
    require_fp32_source(meta, src)
    if out.resolve() == src.resolve():
        raise ForgeError("--out must differ from --artifact (the FP32 source is never modified)")
    targets = Targets(min_agreement, min_cosine, max_kl)
    check_method(method, targets)
    for name, value in (("min-agreement", min_agreement), ("min-cosine", min_cosine)):
        if value is not None and not (0.0 <= value <= 1.0):
            raise ForgeError(f"--{name} must lie in [0, 1], got {value}")
    if per_channel is None:
        per_channel = method == "static"  # dynamic: per-tensor measured faster (18 vs 23 ms)
    store = None
    if method == "static":
        if calibration is None:
            raise ForgeError("--method static needs --calibration CALIB_DIR (make one with `chattts-forge calibrate`)")
        from chattts_forge.calibration_data.store import CalibrationStore

        store = CalibrationStore(calibration)
        recorded = (store.manifest.get("artifact") or {}).get("gpt_sha256")
        current = meta["components"]["gpt"].get("sha256") or sha256_file(component_file(src, meta, "gpt"))
        if recorded and current and recorded != current:
            raise ForgeError(f"calibration {calibration} was recorded from a different artifact (gpt sha256 differs)")
        if quantize_head and store.count("head_code") == 0:
            raise ForgeError(f"calibration {calibration} has no head_code samples; re-run calibrate or use --no-head")
    elif calibration is not None:
        log.info("--calibration is only used by --method static; ignoring it for %s", method)

    comps = ["gpt"] + (["head_code"] if quantize_head else [])
    src_files = {c: component_file(src, meta, c) for c in ("gpt", "head_code")}
    skip = {p.relative_to(src).as_posix() for c in comps for p in component_files(src, meta, c)}
    # A fused fast GPT graph of the source (runtime.fast_gpt_graph) is FP32: never carry it into a
    # quantized artifact, the runtime would prefer it. dynamic/int4 rebuild it quantized below.
    has_fast = FAST_GPT in meta["components"]
    if has_fast:
        skip |= {p.relative_to(src).as_posix() for p in component_files(src, meta, FAST_GPT)}
    started = time.time()

    with tempfile.TemporaryDirectory(prefix="forge-quant-") as work_s, atomic_output_dir(out) as tmp:
        work = Path(work_s)
        copied = copy_unchanged(src, tmp, skip)
        qmeta = copy.deepcopy(meta)
        qmeta["components"].pop(FAST_GPT, None)
        if (qmeta.get("source") or {}).get("asset_dir"):  # recorded relative to the FP32 folder: rebase
            qmeta["source"]["asset_dir"] = portable_path(recorded_path(meta["source"]["asset_dir"], src), out)
        atomic_write_json(tmp / "artifact.json", qmeta)  # provisional: fidelity reads component files

        # The graph each component is quantized from (static: quant_pre_process'ed once). Linked
        # into the work folder: onnxruntime's quantizers write temporary "-inferred" models next
        # to their input, and the source artifact must stay untouched (it may be read-only).
        base = {}
        for c, path in src_files.items():
            base[c] = work / path.name
            for f in component_files(src, meta, c):  # the graph and its external data, if any
                os.symlink(f.resolve(), work / f.name)
        pre_records: dict[str, Any] = {}
        if method == "static":
            from chattts_forge.quantize.static import preprocess

            for c in comps:
                base[c] = work / f"{c}.pre.onnx"
                pre_records[c] = preprocess(src_files[c], base[c])

        from chattts_forge.quantize.static import resolve_excludes

        user_nodes = {c: resolve_excludes(base[c], list(exclude)) for c in comps}
        options: dict[str, dict[str, Any]] = {}
        excluded_nodes: dict[str, list[str]] = {}

        def quantize_component(c: str, nodes: list[str]) -> None:
            dst = tmp / src_files[c].name
            if method == "dynamic":
                from chattts_forge.quantize.dynamic import quantize_dynamic_graph

                options[c] = quantize_dynamic_graph(base[c], dst, per_channel=per_channel, exclude_nodes=nodes)
            elif method == "static":
                from chattts_forge.quantize.static import quantize_static_graph

                options[c] = quantize_static_graph(
                    src_files[c], dst, store, c, calibrate_method=calibrate_method, per_channel=per_channel,
                    symmetric_activations=symmetric_activations, activation_type=activation_type,
                    exclude_nodes=nodes, cache_path=work / f"{c}.calib-cache.json", preprocessed=base[c],
                )
                options[c].update(pre_records[c])
            else:
                from chattts_forge.quantize.int4 import quantize_int4_graph

                options[c] = quantize_int4_graph(base[c], dst, block_size=block_size,
                                                 accuracy_level=accuracy_level, exclude_nodes=nodes)
            copy_metadata_props(src_files[c], dst, PRECISIONS[method])
            excluded_nodes[c] = nodes

        def quantize_with(excluded_tensors: list[str], keep_head_fp32: bool) -> None:
            nodes = sorted(set(user_nodes["gpt"]) | set(producers_of(base["gpt"], excluded_tensors)))
            quantize_component("gpt", nodes)
            if "head_code" in comps:
                if keep_head_fp32:
                    shutil.copyfile(src_files["head_code"], tmp / src_files["head_code"].name)
                    options["head_code"] = {"kept": "fp32 (fallback)"}
                    excluded_nodes["head_code"] = ["<whole graph>"]
                else:
                    quantize_component("head_code", user_nodes["head_code"])

        trajs = None
        if fidelity or targets.any():
            log.info("fidelity: running the FP32 artifact on %s (%d sentences)", fidelity_corpus, fidelity_sentences)
            from chattts_forge.calibration_data.corpus import load_corpus

            trajs = record_trajectories(src, load_corpus(fidelity_corpus), fidelity_sentences, fidelity_steps,
                                        seed, threads, progress=progress)

        def measure(keep_all: bool = False) -> dict[str, Any]:
            return measure_fidelity(src, tmp, fidelity_corpus, max_sentences=fidelity_sentences,
                                    max_new_token=fidelity_steps, seed=seed, threads=threads,
                                    trajectories=trajs, keep_all_tensors=keep_all)

        fallback = None
        fid = None
        fast_note = None
        if has_fast and targets.any():
            fast_note = "dropped: fallback exclusions apply to gpt.onnx only; the runtime uses gpt.onnx"
        if targets.any():
            bench = next((s for t in trajs for s in t.full_samples[1:]), None)
            fallback = run_fallback(quantize_with, lambda: measure(True), tmp / src_files["gpt"].name, bench,
                                    targets, head_quantized="head_code" in comps, step_nodes=step_nodes)
            fid = fallback.pop("final_fidelity")
        else:
            quantize_with([], False)
            if has_fast:  # before measuring: fidelity also replays the fast graph the runtime prefers
                fast_note = _rebuild_fast_gpt(src, tmp, method, block_size, accuracy_level, per_channel, qmeta)
                atomic_write_json(tmp / "artifact.json", qmeta)
            if fidelity:
                fid = measure()
        if fid is not None and "per_tensor" in fid:
            fid["per_tensor"].pop("all_local", None)

        # ---- artifact.json -----------------------------------------------------------------
        summaries = {}
        for c in comps:
            path = tmp / src_files[c].name
            kept = options[c].get("kept")
            precision = "fp32" if kept else PRECISIONS[method]
            qmeta["components"][c] = component_record(path, meta["components"][c], precision)
            summaries[c] = graph_summary(path)
        vocos_equal = None
        if "vocos" in meta["components"]:
            a, b = component_file(src, meta, "vocos"), tmp / component_file(src, meta, "vocos").name
            vocos_equal = sha256_file(a) == sha256_file(b)
            if not vocos_equal:
                raise ForgeError("internal error: vocos.onnx changed while copying")
        fp32_gpt_bytes = src_files["gpt"].stat().st_size
        gpt_bytes = (tmp / src_files["gpt"].name).stat().st_size
        qmeta["variant"] = VARIANTS[method]
        qmeta["quantization"] = {
            "method": method,
            "variant": VARIANTS[method],
            "tool": "onnxruntime.quantization",
            "source_artifact": {
                "path": portable_path(src, out),
                "variant": meta.get("variant"),
                "artifact_json_sha256": sha256_file(src / "artifact.json"),
                "gpt_sha256": meta["components"]["gpt"].get("sha256"),
            },
            "options": {
                "per_channel": per_channel,
                "calibrate_method": calibrate_method if method == "static" else None,
                "activation_type": activation_type if method == "static" else None,
                "symmetric_activations": symmetric_activations if method == "static" else None,
                "block_size": block_size if method == "int4" else None,
                "accuracy_level": accuracy_level if method == "int4" else None,
                "quantize_head": quantize_head,
                "exclude_patterns": list(exclude),
                "seed": seed,
            },
            "components": {
                c: {**options[c], "excluded_nodes": excluded_nodes.get(c, []), "ops": summaries[c],
                    "per_op_precision": _per_op_precision(summaries[c], method)}
                for c in comps
            },
            "not_quantized": {k: v for k, v in NOT_QUANTIZED.items() if k in meta["components"]}
            | ({} if quantize_head else {"head_code": "fp32 (--no-head)"}),
            "gpt_fast": fast_note,
            # Top-level copies for quantize.fast_gpt.optimize_artifact(quantize="auto").
            "per_channel": per_channel,
            "block_size": block_size if method == "int4" else None,
            "accuracy_level": accuracy_level if method == "int4" else None,
            "excluded_nodes": sorted({n for v in excluded_nodes.values() for n in v}),
            "calibration": store.describe(relative_to=out) if store else None,
            "fallback": fallback,
            "sizes": {
                "gpt_fp32_bytes": fp32_gpt_bytes,
                "gpt_bytes": gpt_bytes,
                "gpt_ratio": round(gpt_bytes / fp32_gpt_bytes, 4),
            },
            "vocos_sha256_equal": vocos_equal,
            "copied_files": copied,
        }
        if fid is not None and fid.get("reference"):
            fid["reference"] = portable_path(fid["reference"], out)
        qmeta["fidelity"] = fid
        qmeta["versions"] = library_versions()
        qmeta["toolchain"] = toolchain_info()
        qmeta["created_at"] = build_timestamp()
        atomic_write_json(tmp / "artifact.json", qmeta)
    log.info("%s artifact written to %s in %.0f s (gpt %.1f MB = %.0f%% of FP32)", VARIANTS[method], out,
             time.time() - started, gpt_bytes / 1e6, 100 * gpt_bytes / fp32_gpt_bytes)
    if fid is not None:
        log.info("fidelity vs FP32: %s", summary_line(fid))
    if fallback is not None:
        log.info("fallback: %s", fallback["message"])
    return out
