"""`quantize_artifact`: the quantize stage as small steps, each with one job; what differs between
methods is the method object's (`methods.py`), so no step here asks which method runs.

1. `check_request`: the config (`config.QuantizeConfig`), the FP32 source and its files, the output
   folder, the method's options and inputs (calibration folder, gate), an int8 KV cache's scales.
2. `SourceGraphs.prepare`: the graphs to quantize, linked into a scratch folder (pre-processed when
   the method asks for it).
3. `ComponentQuantizer`: runs the method's quantizer on the GPT and the code head, and remembers
   per graph its options record and the nodes kept in FP32.
4. `quantize_and_measure`: quantizes once (after the method's preparation, e.g. auto's search; then
   the method's fused fast GPT) or runs the accuracy-driven fallback loop, measuring fidelity
   against the FP32 source.
5. `finish_meta`: the quantized artifact.json, its `quantization` written once by the method
   (`chattts_forge.artifact.Quantization`), the file written once at the end.

The record layout: `chattts_forge.artifact.Quantization`, docs/artifact-format.md, and the package
docstring (`chattts_forge.quantize`) for fidelity.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from chattts_forge.artifact import (
    DECODER,
    FAST_GPT,
    GPT,
    HEAD_CODE,
    VOCODER,
    ArtifactMeta,
    DecoderWeights,
)
from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_output_dir, portable_path, recorded_path
from chattts_forge.gate import stream_threshold_db
from chattts_forge.graph_storage import write_component
from chattts_forge.integrity import PUBLISHED_NAMES, verify_files
from chattts_forge.log import get_logger
from chattts_forge.quantize.config import QuantizeConfig
from chattts_forge.quantize.fallback import producers_of, run_fallback
from chattts_forge.quantize.fidelity import (
    Trajectory,
    fp32_runs_settings,
    measure_fidelity,
    read_fp32_runs,
    record_trajectories,
    summary_line,
)
from chattts_forge.quantize.graph_ops import graph_summary
from chattts_forge.quantize.inputs import check_input_artifact
from chattts_forge.quantize.method_base import GraphRun, QuantizationMethod
from chattts_forge.quantize.methods import method_class, open_method
from chattts_forge.quantize.variant_files import (
    component_fields,
    component_record,
    copy_metadata_props,
    copy_unchanged,
    require_fp32_source,
)
from chattts_forge.runtime.stream_lookahead import measure_artifact
from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

log = get_logger(__name__)


# ---- 1. the request ----------------------------------------------------------------------------


@dataclass
class Request:
    """A checked request: the method object, the source's artifact.json, an int8 KV cache's scales."""

    method: QuantizationMethod
    meta: ArtifactMeta
    kv: dict[str, Any] | None  # {"scales", "record"} of an int8 KV cache (None: float cache)


def check_request(src: Path, out: Path, cfg: QuantizeConfig) -> Request:
    """Everything checked before any work: a damaged input or a bad option is one line, nothing written."""
    method_class(cfg.method)  # an unknown method is named before the source is read
    meta = ArtifactMeta.load(src)
    require_fp32_source(meta, src)
    if out.resolve() == src.resolve():
        raise BadInput("--out must differ from --artifact (the FP32 source is never modified)")
    method = open_method(cfg, src, meta)
    targets = cfg.targets  # none unless the method reads FallbackOptions (its config type says)
    targets.check_ranges()
    check_input_artifact(src, meta)
    method.check_request()
    return Request(method, meta, method.calibrate_kv_cache(targets, out))


# ---- 2. the source graphs ----------------------------------------------------------------------


@dataclass
class SourceGraphs:
    """The FP32 graphs of the source and the graphs each component is quantized from."""

    files: dict[str, Path]  # component -> its FP32 graph in the source artifact
    base: dict[str, Path]  # component -> the graph handed to the quantizer (in the scratch folder)
    preprocess: dict[str, dict[str, Any]]  # legacy static: what quant_pre_process did, per component

    @classmethod
    def prepare(cls, src: Path, meta: ArtifactMeta, method: QuantizationMethod, work: Path) -> SourceGraphs:
        """Link the source graphs into `work` (and pre-process them once when the method asks).

        onnxruntime's quantizers write temporary "-inferred" models next to their input, and the
        source artifact must stay untouched (it may be read-only), hence the scratch folder.
        """
        files = {c: meta.component_file(src, c) for c in (GPT, HEAD_CODE)}
        base = {}
        for c, path in files.items():
            base[c] = work / path.name
            for f in meta.component_files(src, c):  # the graph and its external data, if any
                os.symlink(f.resolve(), work / f.name)
        pre: dict[str, dict[str, Any]] = {}
        if method.preprocesses:
            # quantize.static loads onnxruntime.quantization: only for the static method
            from chattts_forge.quantize.static import preprocess as quant_pre_process

            for c in method.cfg.components:
                base[c] = work / f"{c}.pre.onnx"
                pre[c] = quant_pre_process(files[c], base[c])
        return cls(files, base, pre)


def files_to_skip(src: Path, meta: ArtifactMeta, cfg: QuantizeConfig) -> set[str]:
    """Source files not copied as they are: the graphs quantized, any fused fast GPT graph, and what
    publish added when the source is a published folder (its manifest, sums, signature, card and
    report describe that folder, not the quantized one).

    The fast graph of the source (quantize.fast_gpt_graph) is FP32, and the runtime would prefer it over
    the quantized gpt.onnx; the method rebuilds or quantizes it, or drops it
    (`QuantizationMethod.write_fast_graph`).
    """
    names = [*cfg.components, *([FAST_GPT] if meta.has_component(FAST_GPT) else [])]
    if cfg.decoder != DecoderWeights.FP32 and meta.has_component(DECODER):
        names.append(DECODER)
    return {p.relative_to(src).as_posix() for c in names for p in meta.component_files(src, c)} | PUBLISHED_NAMES


# ---- 3. quantizing the graphs ------------------------------------------------------------------


class ComponentQuantizer:
    """Writes the quantized GPT (and code head) into the output folder; keeps, per component, the
    quantizer's options record and the nodes it left in FP32 (both go into artifact.json)."""

    def __init__(self, method: QuantizationMethod, graphs: SourceGraphs, out_dir: Path, work: Path) -> None:
        # quantize.static loads onnxruntime.quantization: only for the static method
        from chattts_forge.quantize.static import resolve_excludes

        self.method, self.cfg, self.graphs, self.out_dir, self.work = method, method.cfg, graphs, out_dir, work
        method.work = work
        self.user_nodes = {c: resolve_excludes(graphs.base[c], list(self.cfg.exclude)) for c in self.cfg.components}
        self.options: dict[str, dict[str, Any]] = {}
        self.excluded_nodes: dict[str, list[str]] = {}

    def output(self, component: str) -> Path:
        return self.out_dir / self.graphs.files[component].name

    def quantize_graph(self, c: str, nodes: list[str]) -> None:
        """Quantize component `c` with the method, keeping `nodes` in FP32."""
        dst = self.output(c)
        self.options[c] = self.method.quantize_graph(c, self.graphs, dst, nodes)
        copy_metadata_props(self.graphs.files[c], dst, self.method.precision)
        self.excluded_nodes[c] = nodes

    def __call__(self, excluded_tensors: list[str], keep_head_fp32: bool) -> None:
        """Quantize every component, keeping the producers of `excluded_tensors` (and, if asked, the
        whole code head) in FP32: the fallback loop's callback."""
        nodes = sorted(set(self.user_nodes[GPT]) | set(producers_of(self.graphs.base[GPT], excluded_tensors)))
        self.quantize_graph(GPT, nodes)
        if HEAD_CODE not in self.cfg.components:
            return
        if keep_head_fp32:
            shutil.copyfile(self.graphs.files[HEAD_CODE], self.output(HEAD_CODE))
            self.options[HEAD_CODE] = {"kept": "fp32 (fallback)"}
            self.excluded_nodes[HEAD_CODE] = ["<whole graph>"]
        else:
            self.quantize_graph(HEAD_CODE, self.user_nodes[HEAD_CODE])


# ---- 4. quantize, measure, fall back -----------------------------------------------------------


@dataclass
class Outcome:
    """What `quantize_and_measure` found: fidelity, the fallback record, the fast-GPT note."""

    fidelity: dict[str, Any] | None = None
    fallback: dict[str, Any] | None = None
    fast_gpt_note: str | None = None
    decoder: dict[str, Any] | None = None  # `write_decoder`'s record (None: the Decoder kept FP32)


def record_fp32_runs(src: Path, cfg: QuantizeConfig, needed: bool = False) -> list[Trajectory] | None:
    """The FP32 trajectories fidelity (and auto's search, `needed`) replays; None when nothing asks."""
    if not (cfg.fidelity or cfg.targets.any() or needed):
        return None

    corpus, st = load_corpus(cfg.fidelity_corpus), cfg.fidelity_settings
    if cfg.fp32_runs is not None:
        recorded = read_fp32_runs(Path(cfg.fp32_runs), fp32_runs_settings(src, corpus, st.max_sentences,
                                                                           st.max_new_token, st.seed))
        if recorded is not None:
            return recorded
    log.info("fidelity: running the FP32 artifact on %s (%d sentences)", cfg.fidelity_corpus, st.max_sentences)
    return record_trajectories(src, corpus, st)


def quantize_and_measure(quantizer: ComponentQuantizer, out_dir: Path, qmeta: ArtifactMeta,
                         kv: dict[str, Any] | None = None) -> Outcome:
    """Quantize (with the fallback loop when targets are set) and measure fidelity on `qmeta`,
    the output's artifact.json as it will be written (fidelity reads it in memory)."""
    method = quantizer.method
    src, cfg, has_fast = method.src, quantizer.cfg, method.meta.has_component(FAST_GPT)
    trajs = record_fp32_runs(src, cfg, method.needs_trajectories)
    # measured without progress bars, as before the settings were one type
    settings = replace(cfg.fidelity_settings, progress=None)

    def measure(keep_all: bool = False) -> dict[str, Any]:
        return measure_fidelity(src, out_dir, cfg.fidelity_corpus, settings, trajectories=trajs,
                                keep_all_tensors=keep_all, quant_meta=qmeta)

    outcome = Outcome()
    if cfg.targets.any():
        if has_fast:
            outcome.fast_gpt_note = "dropped: fallback exclusions apply to gpt.onnx only; the runtime uses gpt.onnx"
        bench = next((s for t in trajs or [] for s in t.full_samples[1:]), None)
        outcome.fallback = run_fallback(quantizer, lambda: measure(True), quantizer.output(GPT), bench,
                                        cfg.targets, head_quantized=HEAD_CODE in cfg.components,
                                        step_nodes=cfg.step_nodes)
        outcome.fidelity = outcome.fallback.pop("final_fidelity")
    else:
        method.prepare(quantizer.work, trajs)  # auto: the search
        quantizer([], False)
        if has_fast:  # before measuring: fidelity also replays the fast graph the runtime prefers
            outcome.fast_gpt_note = method.write_fast_graph(out_dir, qmeta, kv)
        if cfg.fidelity:
            outcome.fidelity = measure()
    if outcome.fidelity is not None and "per_tensor" in outcome.fidelity:
        outcome.fidelity["per_tensor"].pop("all_local", None)
    return outcome


# ---- 5. artifact.json --------------------------------------------------------------------------


def start_meta(meta: ArtifactMeta, src: Path, out: Path) -> ArtifactMeta:
    """The output's artifact.json before quantizing: the source's, without its fast GPT graph."""
    qmeta = copy.deepcopy(meta)
    qmeta.components.pop(FAST_GPT, None)
    # the source's look-ahead describes its own Decoder: this one's is measured when it is written, and
    # recorded last (after `fidelity`)
    qmeta.streaming = None
    qmeta.key_order = tuple(k for k in qmeta.key_order if k != "streaming")
    if (qmeta.source or {}).get("asset_dir"):  # recorded relative to the FP32 folder: rebase
        qmeta.source["asset_dir"] = portable_path(recorded_path(meta.source["asset_dir"], src), out)
    return qmeta


def check_vocoder_copied(out_dir: Path, meta: ArtifactMeta) -> bool | None:
    """The vocoder is copied byte for byte, graph and weights: the copies match the source's record
    (which `check_request` checked the source against); None when the artifact has none."""
    if not meta.has_component(VOCODER):
        return None
    problems = verify_files(out_dir, meta, components=(VOCODER,)).mismatches
    if problems:
        raise ForgeError(f"internal error: {problems[0].rel} changed while copying")
    return True


def write_decoder(src: Path, meta: ArtifactMeta, cfg: QuantizeConfig, out_dir: Path,
                  qmeta: ArtifactMeta) -> dict[str, Any] | None:
    """`--decoder int8|int8-a8`: the Decoder with weight-only INT8 MatMuls (quantize/decoder.py), written
    before fidelity is measured (its mel is part of it); its options record, or None when kept FP32."""
    if cfg.decoder == DecoderWeights.FP32 or not meta.has_component(DECODER):
        return None

    # quantize.decoder loads onnxruntime.quantization: only for the Decoder
    from chattts_forge.quantize.decoder import quantize_decoder

    source = meta.component_file(src, DECODER)
    dst = out_dir / source.name
    record = quantize_decoder(source, dst, int8_activations=cfg.decoder == DecoderWeights.INT8_A8)
    copy_metadata_props(source, dst, "int8")
    # Stored as the runtime maps it (graph_storage); fidelity then runs the final files.
    qmeta.components[DECODER] = write_component(onnx.load(str(dst)), out_dir, DECODER,
                                                component_fields(dst, meta.components[DECODER], "int8"))
    log.info("decoder: %d MatMuls weight-only int8, %s compute (%.1f -> %.1f MB)", record["matmuls_quantized"],
             record["compute"],
             sum(f.stat().st_size for f in meta.component_files(src, DECODER)) / 1e6,
             sum(f.stat().st_size for f in qmeta.component_files(out_dir, DECODER)) / 1e6)
    return record


def finish_meta(qmeta: ArtifactMeta, out: Path, out_dir: Path, quantizer: ComponentQuantizer, outcome: Outcome,
                copied: list[str]) -> None:
    """Fill the output's artifact.json: component records, `quantization` (the method's record),
    `fidelity`, stamps. `out` is the final folder (recorded paths are relative to it), `out_dir` the
    temporary one being written."""
    method = quantizer.method
    meta = method.meta
    summaries = {}
    for c in method.cfg.components:
        path = quantizer.output(c)
        precision = "fp32" if quantizer.options[c].get("kept") else method.precision
        qmeta.components[c] = component_record(path, meta.components[c], precision)
        summaries[c] = graph_summary(path)
    if outcome.decoder is not None:
        summaries[DECODER] = graph_summary(qmeta.component_path(out_dir, DECODER))
    vocos_equal = check_vocoder_copied(out_dir, meta)
    fp32_gpt_bytes = quantizer.graphs.files[GPT].stat().st_size
    gpt_bytes = quantizer.output(GPT).stat().st_size
    run = GraphRun(
        options=quantizer.options, excluded_nodes=quantizer.excluded_nodes, summaries=summaries,
        decoder=outcome.decoder, fast_gpt_note=outcome.fast_gpt_note, fallback=outcome.fallback,
        sizes={"gpt_fp32_bytes": fp32_gpt_bytes, "gpt_bytes": gpt_bytes,
               "gpt_ratio": round(gpt_bytes / fp32_gpt_bytes, 4)},
        vocos_sha256_equal=vocos_equal, copied_files=copied,
        # absent: a float32 cache (fp32-cache artifacts keep their bytes)
        kv_cache=(qmeta.components.get(FAST_GPT) or {}).get("kv_cache"),
    )
    qmeta.variant = method.variant
    qmeta.quantization = method.record(run, out).to_dict()
    fid = outcome.fidelity
    if fid is not None and fid.get("reference"):
        fid["reference"] = portable_path(fid["reference"], out)
    qmeta.fidelity = fid
    qmeta.versions = library_versions()
    qmeta.toolchain = toolchain_info()
    qmeta.created_at = build_timestamp()


# ---- the stage ---------------------------------------------------------------------------------


def quantize_artifact(artifact_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                      config: QuantizeConfig) -> Path:
    """Write a quantized copy of the FP32 artifact at `artifact_dir` to `out_dir` (see `chattts_forge.quantize`).

    `config.kv_cache="int8"` (dynamic/int4 rtn, needs `calibration`): the rebuilt `gpt_fast.onnx`
    keeps its KV cache in int8 with per-channel scales calibrated from the calibration set
    (`kv_cache.py`); its fidelity is measured with the rest (`fidelity.gpt_fast`, the graph the
    runtime runs). `config.decoder="int8"` (default): the Decoder's MatMuls become weight-only INT8
    (`decoder.py`); "fp32" copies it as it is."""
    src, out = Path(artifact_dir), Path(out_dir)
    request = check_request(src, out, config)
    method, meta = request.method, request.meta
    skip = files_to_skip(src, meta, config)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="forge-quant-") as work_s, atomic_output_dir(out) as tmp:
        work = Path(work_s)
        copied = copy_unchanged(src, tmp, skip)
        qmeta = start_meta(meta, src, out)
        decoder_record = write_decoder(src, meta, config, tmp, qmeta)
        quantizer = ComponentQuantizer(method, SourceGraphs.prepare(src, meta, method, work), tmp, work)
        outcome = quantize_and_measure(quantizer, tmp, qmeta, request.kv)
        outcome.decoder = decoder_record
        finish_meta(qmeta, out, tmp, quantizer, outcome, copied)
        # this variant's Decoder (INT8 by default) streams differently from the source's: measured again
        qmeta.streaming = measure_artifact(tmp, qmeta, threshold_db=stream_threshold_db(), threads=config.threads)
        qmeta.write(tmp)
    sizes = qmeta.quantization["sizes"]
    log.info("%s artifact written to %s in %.0f s (gpt %.1f MB = %.0f%% of FP32)", method.variant, out,
             time.time() - started, sizes["gpt_bytes"] / 1e6, 100 * sizes["gpt_bytes"] / sizes["gpt_fp32_bytes"])
    if outcome.fidelity is not None:
        log.info("fidelity vs FP32: %s", summary_line(outcome.fidelity))
    if outcome.fallback is not None:
        log.info("fallback: %s", outcome.fallback["message"])
    return out
