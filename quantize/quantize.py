"""`quantize_artifact`: the quantize stage as small steps, each with one job.

1. `check_request`: the method, the FP32 source, the output folder and the fidelity targets.
2. `calibrated.plan_request`: every input checked up front (the source's files against their sizes
   and sha256, the calibration folder, INT4/auto options, the gate) -> the calibrated methods' `Plan`;
   `calibrate_kv_cache`: `--kv-cache int8` only, the cache scales from that calibration folder.
3. `SourceGraphs.prepare`: the graphs to quantize, linked into a scratch folder (legacy static: pre-processed).
4. `GraphQuantizer`: runs the method's onnxruntime quantizer on the GPT and the code head, and
   remembers per graph its options record and the nodes kept in FP32.
5. `quantize_and_measure`: quantizes once (auto: after its search; and rebuilds or quantizes the
   fused fast GPT) or runs the accuracy-driven fallback loop, measuring fidelity against the FP32 source.
6. `finish_meta`: the quantized artifact.json, written once at the end through `ArtifactMeta`.

The record layout is documented in `chattts_forge.quantize` (the package docstring).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chattts_forge.artifact import (
    ARTIFACT_JSON,
    DECODER,
    DECODER_WEIGHTS,
    FAST_GPT,
    FAST_GPT_FILE,
    KV_CACHES,
    METHOD_PRECISION,
    QUANTIZE_METHODS,
    VOCODER,
    ArtifactMeta,
    quantized_variant,
)
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_output_dir, portable_path, recorded_path, sha256_file
from chattts_forge.graph_storage import store_components_externally, store_externally
from chattts_forge.log import get_logger
from chattts_forge.quantize.artifact import (
    component_record,
    copy_metadata_props,
    copy_unchanged,
    graph_summary,
    require_fp32_source,
)
from chattts_forge.quantize.calibrated import Plan, plan_request
from chattts_forge.quantize.fallback import Targets, check_method, producers_of, run_fallback
from chattts_forge.quantize.fidelity import Trajectory, measure_fidelity, record_trajectories, summary_line

log = get_logger(__name__)

NOT_QUANTIZED = {
    "embed": "fp32 (Gather lookups; no integer kernel gain)",
    "head_text": "fp32 (text head: only used by text refinement)",
    "decoder": "fp32 (--decoder fp32)",
    "dvae": "fp32 (convolutions)",
    "dvae_encoder": "fp32, copied byte for byte (voice cloning: its codes must equal ChatTTS's exactly)",
    "vocos": "fp32, copied byte for byte",
}


@dataclass(frozen=True)
class QuantizeConfig:
    """How the graphs are quantized (the CLI's options, checked)."""

    method: str
    per_channel: bool
    calibrate_method: str = "minmax"
    symmetric_activations: bool = False
    activation_type: str = "uint8"
    exclude: tuple[str, ...] = ()
    block_size: int = 128
    accuracy_level: int = 4
    quantize_head: bool = True
    seed: int = 0
    kv_cache: str = "fp32"  # the fused GPT's KV cache: fp32 or int8 (calibrated scales)
    decoder: str = "int8"  # the Decoder's MatMuls: weight-only int8 (quantize/decoder.py) or fp32

    @property
    def components(self) -> list[str]:
        """The graphs quantized: the GPT, and the code head unless --no-head."""
        return ["gpt"] + (["head_code"] if self.quantize_head else [])

    @property
    def precision(self) -> str:
        return METHOD_PRECISION[self.method]

    @property
    def variant(self) -> str:
        """An INT8 KV cache names its own variant (int8-dynamic-kv8), published beside the float one."""
        return quantized_variant(self.method, self.kv_cache)


@dataclass(frozen=True)
class FidelityConfig:
    """How fidelity against the FP32 source is measured, and the fallback's targets."""

    enabled: bool = True
    corpus: str = "builtin:evaluation"
    sentences: int = 8
    steps: int = 48
    seed: int = 0
    threads: int | None = None
    progress: bool | None = None
    targets: Targets = field(default_factory=lambda: Targets(None, None, None))
    step_nodes: int | None = None


# ---- 1. the request ----------------------------------------------------------------------------


def check_request(src: Path, out: Path, method: str, targets: Targets) -> ArtifactMeta:
    """The FP32 source's artifact.json, once method, folders and targets are known to be usable."""
    if method not in QUANTIZE_METHODS:
        raise ForgeError(f"unknown method '{method}' (choose from: {', '.join(QUANTIZE_METHODS)})")
    meta = ArtifactMeta.load(src)
    require_fp32_source(meta, src)
    if out.resolve() == src.resolve():
        raise ForgeError("--out must differ from --artifact (the FP32 source is never modified)")
    check_method(method, targets)
    for name, value in (("min-agreement", targets.min_agreement), ("min-cosine", targets.min_cosine)):
        if value is not None and not (0.0 <= value <= 1.0):
            raise ForgeError(f"--{name} must lie in [0, 1], got {value}")
    return meta


# ---- 2. the KV cache's calibration ----------------------------------------------------------


def calibrate_kv_cache(cfg: QuantizeConfig, calibration: str | os.PathLike[str] | None, src: Path,
                       meta: ArtifactMeta, targets: Targets, out: Path, plan: Plan) -> dict[str, Any] | None:
    """`--kv-cache int8`: the per-channel cache scales from the calibration set and their record
    ({"scales", "record"}); None for a float32 cache."""
    if cfg.kv_cache not in KV_CACHES:
        raise ForgeError(f"unknown KV cache '{cfg.kv_cache}' (choose from: {', '.join(KV_CACHES)})")
    if cfg.kv_cache == "fp32":
        return None
    if cfg.method in plan.handles or plan.legacy_static:
        raise ForgeError("--kv-cache int8 applies to the fused graph dynamic and rtn int4 rebuild; static, auto and "
                         "calibrated int4 quantize theirs with calibrated activations and a float cache, legacy "
                         "static drops it (use dynamic or int4 --algorithm rtn)")
    if targets.any():
        raise ForgeError("--kv-cache int8 cannot be combined with fallback targets (they drop the fused GPT graph)")
    if not meta.has_component(FAST_GPT):
        raise ForgeError(f"--kv-cache int8: artifact {src} has no {FAST_GPT_FILE} (convert with --fast-gpt)")
    if calibration is None:
        raise ForgeError("--kv-cache int8 needs --calibration CALIB_DIR: its scales are calibrated from it")
    from chattts_forge.quantize.inputs import open_calibration
    from chattts_forge.quantize.kv_cache import kv_cache_scales

    store = open_calibration(calibration, src, meta)
    scales, record = kv_cache_scales(calibration, meta.require_dims().num_hidden_layers)
    corpus = store.manifest.get("corpus") or {}
    record["calibration"] = {"path": portable_path(store.path, out), "corpus": corpus.get("name"),
                             "corpus_sha256": corpus.get("sha256")}
    log.info("int8 KV cache: scales calibrated from %s (%d decode steps, max |key| %.3g, max |value| %.3g)",
             calibration, record["calibration_samples"], record["max_abs"]["key"], record["max_abs"]["value"])
    return {"scales": scales, "record": record}


# ---- 3. the source graphs ----------------------------------------------------------------------


@dataclass
class SourceGraphs:
    """The FP32 graphs of the source and the graphs each component is quantized from."""

    files: dict[str, Path]  # component -> its FP32 graph in the source artifact
    base: dict[str, Path]  # component -> the graph handed to the quantizer (in the scratch folder)
    preprocess: dict[str, dict[str, Any]]  # static: what quant_pre_process did, per component

    @classmethod
    def prepare(cls, src: Path, meta: ArtifactMeta, cfg: QuantizeConfig, work: Path,
                preprocess: bool = False) -> SourceGraphs:
        """Link the source graphs into `work` (`preprocess`: legacy static, pre-process them once).

        onnxruntime's quantizers write temporary "-inferred" models next to their input, and the
        source artifact must stay untouched (it may be read-only), hence the scratch folder.
        """
        files = {c: meta.component_file(src, c) for c in ("gpt", "head_code")}
        base = {}
        for c, path in files.items():
            base[c] = work / path.name
            for f in meta.component_files(src, c):  # the graph and its external data, if any
                os.symlink(f.resolve(), work / f.name)
        pre: dict[str, dict[str, Any]] = {}
        if preprocess:
            from chattts_forge.quantize.static import preprocess as quant_pre_process

            for c in cfg.components:
                base[c] = work / f"{c}.pre.onnx"
                pre[c] = quant_pre_process(files[c], base[c])
        return cls(files, base, pre)


def files_to_skip(src: Path, meta: ArtifactMeta, cfg: QuantizeConfig) -> set[str]:
    """Source files not copied as they are: the graphs quantized and any fused fast GPT graph.

    The fast graph of the source (runtime.fast_gpt_graph) is FP32, and the runtime would prefer it over
    the quantized gpt.onnx; dynamic/RTN int4 rebuild it quantized (`rebuild_fast_gpt`), static/calibrated
    int4/auto quantize it with the same choices as gpt.onnx (`calibrated.Plan.write_fast_graph`).
    """
    names = [*cfg.components, *([FAST_GPT] if meta.has_component(FAST_GPT) else [])]
    if cfg.decoder == "int8" and meta.has_component(DECODER):
        names.append(DECODER)
    return {p.relative_to(src).as_posix() for c in names for p in meta.component_files(src, c)}


# ---- 4. quantizing the graphs ------------------------------------------------------------------


class GraphQuantizer:
    """Writes the quantized GPT (and code head) into the output folder; keeps, per component, the
    quantizer's options record and the nodes it left in FP32 (both go into artifact.json)."""

    def __init__(self, cfg: QuantizeConfig, graphs: SourceGraphs, out_dir: Path, work: Path, plan: Plan) -> None:
        from chattts_forge.quantize.static import resolve_excludes

        self.cfg, self.graphs, self.out_dir, self.work, self.plan = cfg, graphs, out_dir, work, plan
        self.store = plan.store
        self.user_nodes = {c: resolve_excludes(graphs.base[c], list(cfg.exclude)) for c in cfg.components}
        self.options: dict[str, dict[str, Any]] = {}
        self.excluded_nodes: dict[str, list[str]] = {}

    def output(self, component: str) -> Path:
        return self.out_dir / self.graphs.files[component].name

    def quantize_graph(self, c: str, nodes: list[str]) -> None:
        """Quantize component `c` with the method, keeping `nodes` in FP32."""
        cfg, base, dst = self.cfg, self.graphs.base[c], self.output(c)
        if cfg.method == "dynamic":
            from chattts_forge.quantize.dynamic import quantize_dynamic_graph

            self.options[c] = quantize_dynamic_graph(base, dst, per_channel=cfg.per_channel, exclude_nodes=nodes)
        elif cfg.method in self.plan.handles:  # static (minmax), calibrated int4, auto
            self.options[c] = self.plan.quantize_graph(c, base, dst, nodes, self.work)
        elif cfg.method == "static":  # legacy: onnxruntime's quantize_static
            from chattts_forge.quantize.static import quantize_static_graph

            self.options[c] = quantize_static_graph(
                self.graphs.files[c], dst, self.store, c, calibrate_method=cfg.calibrate_method,
                per_channel=cfg.per_channel, symmetric_activations=cfg.symmetric_activations,
                activation_type=cfg.activation_type, exclude_nodes=nodes,
                cache_path=self.work / f"{c}.calib-cache.json", preprocessed=base,
            )
            self.options[c].update(self.graphs.preprocess[c])
        else:  # int4, round to nearest
            from chattts_forge.quantize.int4 import quantize_int4_graph

            self.options[c] = quantize_int4_graph(base, dst, block_size=cfg.block_size,
                                                  accuracy_level=cfg.accuracy_level, exclude_nodes=nodes)
        copy_metadata_props(self.graphs.files[c], dst, cfg.precision)
        self.excluded_nodes[c] = nodes

    def __call__(self, excluded_tensors: list[str], keep_head_fp32: bool) -> None:
        """Quantize every component, keeping the producers of `excluded_tensors` (and, if asked, the
        whole code head) in FP32: the fallback loop's callback."""
        nodes = sorted(set(self.user_nodes["gpt"]) | set(producers_of(self.graphs.base["gpt"], excluded_tensors)))
        self.quantize_graph("gpt", nodes)
        if "head_code" not in self.cfg.components:
            return
        if keep_head_fp32:
            shutil.copyfile(self.graphs.files["head_code"], self.output("head_code"))
            self.options["head_code"] = {"kept": "fp32 (fallback)"}
            self.excluded_nodes["head_code"] = ["<whole graph>"]
        else:
            self.quantize_graph("head_code", self.user_nodes["head_code"])


def rebuild_fast_gpt(src: Path, out_dir: Path, cfg: QuantizeConfig, qmeta: ArtifactMeta,
                     kv: dict[str, Any] | None = None) -> str:
    """Quantized `gpt_fast.onnx` for dynamic/RTN int4 (same onnxruntime quantizers), dropped for legacy
    static (the calibrated methods quantize it themselves: `Plan.write_fast_graph`); `kv`: an int8 KV
    cache (`calibrate_kv_cache`). Returns the note artifact.json records."""
    if cfg.method == "static":
        return "dropped: no QDQ fast graph (its inputs differ from the calibrated plain graph); runtime uses gpt.onnx"
    from chattts_forge.quantize.fast_gpt import optimize_gpt

    kv_args: dict[str, Any] = {}
    if kv is not None:
        kv_args = {"kv_cache": "int8", "kv_scales": kv["scales"], "kv_record": kv["record"]}
    try:
        record = optimize_gpt(src, out_dir / FAST_GPT_FILE, quantize=cfg.method, weights_from=src,
                              block_size=cfg.block_size, accuracy_level=cfg.accuracy_level,
                              per_channel=cfg.per_channel, **kv_args)
    except ForgeError as e:
        if kv is not None:  # the asked-for cache cannot silently become "no fast graph"
            raise ForgeError(f"could not build the fast GPT graph with an int8 KV cache: {e}") from None
        log.warning("could not rebuild the fast GPT graph quantized (%s); the artifact uses gpt.onnx", e)
        return f"dropped: rebuild failed ({e})"
    qmeta.components[FAST_GPT] = record
    # Recorded in artifact.json: the wording predates the builder's move out of convert and is kept
    # so that published artifacts stay byte-identical.
    cache = " with an int8 KV cache" if kv is not None else ""
    return f"rebuilt with convert.optimize.optimize_gpt(quantize='{cfg.method}') from the FP32 weights{cache}"


# ---- 5. quantize, measure, fall back -----------------------------------------------------------


@dataclass
class Outcome:
    """What `quantize_and_measure` found: fidelity, the fallback record, the fast-GPT note."""

    fidelity: dict[str, Any] | None = None
    fallback: dict[str, Any] | None = None
    fast_gpt_note: str | None = None
    decoder: dict[str, Any] | None = None  # `write_decoder`'s record (None: the Decoder kept FP32)


def record_fp32_runs(src: Path, fid: FidelityConfig, needed: bool = False) -> list[Trajectory] | None:
    """The FP32 trajectories fidelity (and auto's search, `needed`) replays; None when nothing asks."""
    if not (fid.enabled or fid.targets.any() or needed):
        return None
    log.info("fidelity: running the FP32 artifact on %s (%d sentences)", fid.corpus, fid.sentences)
    from chattts_forge.calibration_data.corpus import load_corpus

    return record_trajectories(src, load_corpus(fid.corpus), fid.sentences, fid.steps, fid.seed, fid.threads,
                               progress=fid.progress)


def quantize_and_measure(quantizer: GraphQuantizer, src: Path, out_dir: Path, qmeta: ArtifactMeta,
                         fid: FidelityConfig, has_fast: bool, kv: dict[str, Any] | None = None) -> Outcome:
    """Quantize (with the fallback loop when targets are set) and measure fidelity on `qmeta`,
    the output's artifact.json as it will be written (fidelity reads it in memory)."""
    plan = quantizer.plan
    trajs = record_fp32_runs(src, fid, plan.needs_trajectories)

    def measure(keep_all: bool = False) -> dict[str, Any]:
        return measure_fidelity(src, out_dir, fid.corpus, max_sentences=fid.sentences, max_new_token=fid.steps,
                                seed=fid.seed, threads=fid.threads, trajectories=trajs,
                                keep_all_tensors=keep_all, quant_meta=qmeta)

    outcome = Outcome()
    if fid.targets.any():
        if has_fast:
            outcome.fast_gpt_note = "dropped: fallback exclusions apply to gpt.onnx only; the runtime uses gpt.onnx"
        bench = next((s for t in trajs or [] for s in t.full_samples[1:]), None)
        outcome.fallback = run_fallback(quantizer, lambda: measure(True), quantizer.output("gpt"), bench,
                                        fid.targets, head_quantized="head_code" in quantizer.cfg.components,
                                        step_nodes=fid.step_nodes)
        outcome.fidelity = outcome.fallback.pop("final_fidelity")
    else:
        plan.before_quantizing(quantizer.work, trajs)  # auto: the search
        quantizer([], False)
        if has_fast and quantizer.cfg.method in plan.handles:  # the same choices on the fused graph
            outcome.fast_gpt_note = plan.write_fast_graph(out_dir, qmeta)
        elif has_fast:  # before measuring: fidelity also replays the fast graph the runtime prefers
            outcome.fast_gpt_note = rebuild_fast_gpt(src, out_dir, quantizer.cfg, qmeta, kv)
        if fid.enabled:
            outcome.fidelity = measure()
    if outcome.fidelity is not None and "per_tensor" in outcome.fidelity:
        outcome.fidelity["per_tensor"].pop("all_local", None)
    return outcome


# ---- 6. artifact.json --------------------------------------------------------------------------


def start_meta(meta: ArtifactMeta, src: Path, out: Path) -> ArtifactMeta:
    """The output's artifact.json before quantizing: the source's, without its fast GPT graph."""
    qmeta = copy.deepcopy(meta)
    qmeta.components.pop(FAST_GPT, None)
    if (qmeta.source or {}).get("asset_dir"):  # recorded relative to the FP32 folder: rebase
        qmeta.source["asset_dir"] = portable_path(recorded_path(meta.source["asset_dir"], src), out)
    return qmeta


def per_op_precision(summary: dict[str, Any], method: str) -> dict[str, str]:
    """Which op types ended up in which precision in one quantized graph."""
    out: dict[str, str] = {}
    q = summary["quantized_ops"]
    if "MatMulNBits" in q:
        out["MatMulNBits"] = "int4 weights, int8 compute (accuracy_level 4)" if method in ("int4", "auto") else "int4"
    if "MatMulInteger" in q:
        out["MatMulInteger"] = "int8 weights x uint8 activations (dynamic)"
    if "QuantizeLinear" in q or "DequantizeLinear" in q:
        out["QDQ MatMul"] = "int8 weights, calibrated activations (QDQ, fused by onnxruntime)"
    left = summary["float_ops_left"]
    if left:
        out.update({f"{k} (remaining {v})": "fp32" for k, v in left.items()})
    return out


def check_vocoder_copied(src: Path, out_dir: Path, meta: ArtifactMeta) -> bool | None:
    """The vocoder is copied byte for byte, graph and weights (None when the artifact has none)."""
    if not meta.has_component(VOCODER):
        return None
    for a in meta.component_files(src, VOCODER):
        if sha256_file(a) != sha256_file(out_dir / a.name):
            raise ForgeError(f"internal error: {a.name} changed while copying")
    return True


def write_decoder(src: Path, meta: ArtifactMeta, cfg: QuantizeConfig, out_dir: Path,
                  qmeta: ArtifactMeta) -> dict[str, Any] | None:
    """`--decoder int8`: the Decoder with weight-only INT8 MatMuls (quantize/decoder.py), written
    before fidelity is measured (its mel is part of it); its options record, or None when kept FP32."""
    if cfg.decoder == "fp32" or not meta.has_component(DECODER):
        return None
    from chattts_forge.quantize.decoder import quantize_decoder

    source = meta.component_file(src, DECODER)
    dst = out_dir / source.name
    record = quantize_decoder(source, dst)
    copy_metadata_props(source, dst, "int8")
    store_externally(dst)  # as the runtime maps it (graph_storage); fidelity then runs the final files
    qmeta.components[DECODER] = component_record(dst, meta.components[DECODER], "int8")
    log.info("decoder: %d MatMuls weight-only int8 (%.1f -> %.1f MB)", record["matmuls_quantized"],
             sum(f.stat().st_size for f in meta.component_files(src, DECODER)) / 1e6,
             sum(f.stat().st_size for f in qmeta.component_files(out_dir, DECODER)) / 1e6)
    return record


def finish_meta(qmeta: ArtifactMeta, meta: ArtifactMeta, src: Path, out: Path, out_dir: Path,
                quantizer: GraphQuantizer, outcome: Outcome, copied: list[str]) -> None:
    """Fill the output's artifact.json: component records, `quantization`, `fidelity`, stamps.

    `out` is the final folder (recorded paths are relative to it), `out_dir` the temporary one
    being written.
    """
    from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

    cfg, plan, store = quantizer.cfg, quantizer.plan, quantizer.store
    int4_blocks = cfg.method in ("int4", "auto")  # auto's INT4 MatMuls use the block size too
    summaries = {}
    for c in cfg.components:
        path = quantizer.output(c)
        precision = "fp32" if quantizer.options[c].get("kept") else cfg.precision
        qmeta.components[c] = component_record(path, meta.components[c], precision)
        summaries[c] = graph_summary(path)
    if outcome.decoder is not None:
        summaries[DECODER] = graph_summary(qmeta.component_path(out_dir, DECODER))
    vocos_equal = check_vocoder_copied(src, out_dir, meta)
    # The fused GPT, which several writers produce inline, as the runtime maps it (the Decoder is
    # stored so by `write_decoder`; copied graphs keep the source's files).
    store_components_externally(out_dir, qmeta, [FAST_GPT])
    fp32_gpt_bytes = quantizer.graphs.files["gpt"].stat().st_size
    gpt_bytes = quantizer.output("gpt").stat().st_size
    excluded_nodes = quantizer.excluded_nodes
    qmeta.variant = cfg.variant
    qmeta.quantization = {
        "method": cfg.method,
        "variant": cfg.variant,
        "tool": "onnxruntime.quantization",
        "source_artifact": {
            "path": portable_path(src, out),
            "variant": meta.variant,
            "artifact_json_sha256": sha256_file(src / ARTIFACT_JSON),
            "gpt_sha256": meta.components["gpt"].get("sha256"),
        },
        "options": {
            "per_channel": cfg.per_channel,
            "calibrate_method": cfg.calibrate_method if cfg.method == "static" else None,
            "activation_type": cfg.activation_type if cfg.method == "static" else None,
            "symmetric_activations": cfg.symmetric_activations if cfg.method == "static" else None,
            "block_size": cfg.block_size if int4_blocks else None,
            "accuracy_level": cfg.accuracy_level if int4_blocks else None,
            **({"algorithm": plan.algorithm} if cfg.method == "int4" else {}),
            "quantize_head": cfg.quantize_head,
            "decoder": cfg.decoder,
            "exclude_patterns": list(cfg.exclude),
            "seed": cfg.seed,
        },
        "components": {
            c: {**quantizer.options[c], "excluded_nodes": excluded_nodes.get(c, []), "ops": summaries[c],
                "per_op_precision": per_op_precision(summaries[c], cfg.method)}
            for c in cfg.components
        } | ({} if outcome.decoder is None else {DECODER: {
            **outcome.decoder, "ops": summaries[DECODER],
            "per_op_precision": {"MatMulNBits": "int8 weights, int8 compute (accuracy_level 4)"}
            | {f"{k} (remaining {v})": "fp32" for k, v in summaries[DECODER]["float_ops_left"].items()},
        }}),
        "not_quantized": {k: v for k, v in NOT_QUANTIZED.items()
                          if k in meta.components and not (k == DECODER and outcome.decoder is not None)}
        | ({} if cfg.quantize_head else {"head_code": "fp32 (--no-head)"}),
        FAST_GPT: outcome.fast_gpt_note,
        # Top-level copies for quantize.fast_gpt.optimize_artifact(quantize="auto").
        "per_channel": cfg.per_channel,
        "block_size": cfg.block_size if cfg.method == "int4" else None,
        "accuracy_level": cfg.accuracy_level if cfg.method == "int4" else None,
        "excluded_nodes": sorted({n for v in excluded_nodes.values() for n in v}),
        "calibration": store.describe(relative_to=out) if store else None,
        **plan.record(out),  # int4: algorithm; auto: its search
        "fallback": outcome.fallback,
        "sizes": {
            "gpt_fp32_bytes": fp32_gpt_bytes,
            "gpt_bytes": gpt_bytes,
            "gpt_ratio": round(gpt_bytes / fp32_gpt_bytes, 4),
        },
        "vocos_sha256_equal": vocos_equal,
        "copied_files": copied,
    }
    kv_record = (qmeta.components.get(FAST_GPT) or {}).get("kv_cache")
    if kv_record is not None:  # absent: a float32 cache (fp32-cache artifacts keep their bytes)
        qmeta.quantization["kv_cache"] = kv_record
    fid = outcome.fidelity
    if fid is not None and fid.get("reference"):
        fid["reference"] = portable_path(fid["reference"], out)
    qmeta.fidelity = fid
    qmeta.versions = library_versions()
    qmeta.toolchain = toolchain_info()
    qmeta.created_at = build_timestamp()


# ---- the stage ---------------------------------------------------------------------------------


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
    kv_cache: str = "fp32",
    algorithm: str | None = None,
    gate: str | os.PathLike[str] | None = None,
    decoder: str = "int8",
) -> Path:
    """Write a quantized copy of the FP32 artifact at `artifact_dir` to `out_dir` (see `chattts_forge.quantize`).

    `kv_cache="int8"` (dynamic/int4, needs `calibration`): the rebuilt `gpt_fast.onnx` keeps its KV
    cache in int8 with per-channel scales calibrated from the calibration set (`kv_cache.py`); its
    fidelity is measured with the rest (`fidelity.gpt_fast`, the graph the runtime runs).
    `decoder="int8"` (default): the Decoder's MatMuls become weight-only INT8 (`decoder.py`);
    "fp32" copies it as it is."""
    src, out = Path(artifact_dir), Path(out_dir)
    targets = Targets(min_agreement, min_cosine, max_kl)
    meta = check_request(src, out, method, targets)
    if decoder not in DECODER_WEIGHTS:
        raise ForgeError(f"unknown decoder weights '{decoder}' (choose from: {', '.join(DECODER_WEIGHTS)})")
    cfg = QuantizeConfig(
        method=method,
        per_channel=method == "static" if per_channel is None else per_channel,  # dynamic: per tensor measured faster (18 vs 23 ms)
        calibrate_method=calibrate_method, symmetric_activations=symmetric_activations,
        activation_type=activation_type, exclude=tuple(exclude), block_size=block_size,
        accuracy_level=accuracy_level, quantize_head=quantize_head, seed=seed, kv_cache=kv_cache,
        decoder=decoder,
    )
    fid = FidelityConfig(enabled=fidelity, corpus=fidelity_corpus, sentences=fidelity_sentences,
                         steps=fidelity_steps, seed=seed, threads=threads, progress=progress,
                         targets=targets, step_nodes=step_nodes)
    plan = plan_request(src, meta, cfg, calibration, algorithm, gate, threads)
    kv = calibrate_kv_cache(cfg, calibration, src, meta, targets, out, plan)
    skip = files_to_skip(src, meta, cfg)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="forge-quant-") as work_s, atomic_output_dir(out) as tmp:
        work = Path(work_s)
        copied = copy_unchanged(src, tmp, skip)
        qmeta = start_meta(meta, src, out)
        decoder_record = write_decoder(src, meta, cfg, tmp, qmeta)
        graphs = SourceGraphs.prepare(src, meta, cfg, work, preprocess=plan.legacy_static)
        quantizer = GraphQuantizer(cfg, graphs, tmp, work, plan)
        outcome = quantize_and_measure(quantizer, src, tmp, qmeta, fid, meta.has_component(FAST_GPT), kv)
        outcome.decoder = decoder_record
        finish_meta(qmeta, meta, src, out, tmp, quantizer, outcome, copied)
        qmeta.write(tmp)
    sizes = qmeta.quantization["sizes"]
    log.info("%s artifact written to %s in %.0f s (gpt %.1f MB = %.0f%% of FP32)", cfg.variant, out,
             time.time() - started, sizes["gpt_bytes"] / 1e6, 100 * sizes["gpt_bytes"] / sizes["gpt_fp32_bytes"])
    if outcome.fidelity is not None:
        log.info("fidelity vs FP32: %s", summary_line(outcome.fidelity))
    if outcome.fallback is not None:
        log.info("fallback: %s", outcome.fallback["message"])
    return out
