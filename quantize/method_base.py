"""What every quantization method is: `QuantizationMethod` (its defaults, checks, graph quantizers
and record) and `GraphRun` (what quantizing produced, for the record). The methods themselves and
the registry that maps a name to its class: `methods.py`.

A method owns everything that differs between methods (as onnxruntime's `matmul_nbits_quantizer`
has one config class per algorithm):

- its options: its own config type (`config_type`, config.py), so it never sees another method's;
- what it needs: calibration samples or not (`calibration_components`), the FP32 trajectories
  (auto's search), a gate (auto), its option checks (`check_options`);
- how it quantizes `gpt.onnx` and `head_code.onnx` (`quantize_graph`) and what becomes of the
  fused `gpt_fast.onnx`: rebuilt from the FP32 weights with the method's own quantizer
  (`rebuilds_fast_graph`: dynamic, int4 rtn; the only ones an int8 KV cache fits), quantized from
  the source's FP32 fused graph with the same choices as gpt.onnx (static minmax, int4
  k_quant/gptq, auto) or dropped (legacy static);
- its record: the `Quantization` block of artifact.json (`chattts_forge.artifact`), written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from chattts_forge.artifact import (
    ARTIFACT_JSON,
    DECODER,
    DVAE,
    DVAE_ENCODER,
    EMBED,
    FAST_GPT,
    FAST_GPT_FILE,
    GPT,
    HEAD_CODE,
    HEAD_TEXT,
    METHOD_PRECISION,
    METHOD_VARIANT,
    VOCODER,
    ArtifactMeta,
    KvCache,
    Quantization,
    QuantizationOptions,
    QuantizeMethod,
    quantized_variant,
)
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import portable_path
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger
from chattts_forge.quantize.config import (
    QuantizeConfig,
    Targets,
    recorded_options,
)

if TYPE_CHECKING:
    import numpy as np

    from chattts_forge.calibration_data.statistics import Statistics
    from chattts_forge.calibration_data.store import CalibrationStore
    from chattts_forge.quantize.fast_gpt_graph import GraphQuantizer
    from chattts_forge.quantize.quantize import SourceGraphs

log = get_logger(__name__)

PARITY_SAMPLES = 8  # recorded samples the quantized fused graph is compared with gpt.onnx on
DEFAULT_PERCENTILE = 99.99  # static --calibrate-method percentile: the |x| percentile of each range
DEFAULT_WEIGHT_BITS = 7  # static: +-63 weights, exact in every x86 u8s8 kernel (quantize/static_fused.py)
# static: SmoothQuant's migration strength, the best of those measured with 7-bit weights at full size
# (docs/measurements/2026-12-02-xeon).
DEFAULT_SMOOTH_ALPHA = 0.75
NOT_QUANTIZED = {
    EMBED: "fp32 (Gather lookups; no integer kernel gain)",
    HEAD_TEXT: "fp32 (text head: only used by text refinement)",
    DECODER: "fp32 (--decoder fp32)",
    DVAE: "fp32 (convolutions)",
    DVAE_ENCODER: "fp32, copied byte for byte (voice cloning: its codes must equal ChatTTS's exactly)",
    VOCODER: "fp32, copied byte for byte",
}
INT4_COMPUTE = "int4 weights, int8 compute (accuracy_level 4)"


@dataclass
class GraphRun:
    """What quantizing produced, for the record: per graph the quantizer's options record, the nodes
    kept in FP32 and the op summary; the Decoder's record; the fused graph's fate; the fallback."""

    options: dict[str, dict[str, Any]]
    excluded_nodes: dict[str, list[str]]
    summaries: dict[str, dict[str, Any]]
    decoder: dict[str, Any] | None
    fast_gpt_note: str | None
    fallback: dict[str, Any] | None
    sizes: dict[str, Any]
    vocos_sha256_equal: bool | None
    copied_files: list[str]
    kv_cache: dict[str, Any] | None


class QuantizationMethod:
    """A method's defaults, checks, graph quantizers and record (the subclasses fill them in)."""

    name: ClassVar[QuantizeMethod]
    # The method's own config type (config.py): the options it reads, and so those its record holds;
    # an option of another method never reaches it (`config.config_for` refuses it).
    config_type: ClassVar[type[QuantizeConfig]]
    default_per_channel: ClassVar[bool] = False
    # It times the machine (auto's interleaved decode-step timings): the build runs it with nothing beside it.
    times_the_machine: ClassVar[bool] = False
    preprocesses: ClassVar[bool] = False  # onnxruntime's quant_pre_process on the graphs first
    can_rebuild_fast_graph: ClassVar[bool] = False  # `fast_graph_quantizer` exists
    # The build hands it the calibration folder (static's ranges, int4's GPTQ, auto's search).
    build_calibrates: ClassVar[bool] = False
    nbits_label: ClassVar[str] = "int4"  # per_op_precision of MatMulNBits ops

    def __init__(self, cfg: QuantizeConfig, src: Path, meta: ArtifactMeta) -> None:
        self.cfg, self.src, self.meta = cfg, src, meta
        self.store: CalibrationStore | None = None
        self.threads = cfg.threads or 2
        self.work = Path(".")  # the run's scratch folder (set by quantize.ComponentQuantizer)
        self._samples: dict[str, list[dict[str, np.ndarray]]] = {}

    # -- what it is ------------------------------------------------------------------------------

    @property
    def variant(self) -> str:
        """An INT8 KV cache names its own variant (int8-dynamic-kv8), published beside the float one."""
        return quantized_variant(self.name, self.cfg.kv_cache)

    @property
    def precision(self) -> str:
        return METHOD_PRECISION[self.name]

    @property
    def per_channel(self) -> bool:
        return self.default_per_channel if self.cfg.per_channel is None else self.cfg.per_channel

    @property
    def rebuilds_fast_graph(self) -> bool:
        """The fused graph is rebuilt from the FP32 weights with `fast_graph_quantizer` (an int8 KV
        cache fits only then); otherwise it is quantized with the same choices as gpt.onnx."""
        return False

    @property
    def needs_trajectories(self) -> bool:
        """The FP32 runs on the held-out corpus are needed before quantizing (auto's search)."""
        return False

    @property
    def calibration_components(self) -> tuple[str, ...]:
        """The components whose calibration samples the method reads (when given a folder)."""
        return (GPT, HEAD_CODE) if self.cfg.quantize_head else (GPT,)

    @property
    def needs_calibration(self) -> bool:
        return False

    @property
    def request(self) -> str:
        """The options that make the method need calibration, as the user typed them."""
        return f"--method {self.name}"

    # -- checks, before any work -----------------------------------------------------------------

    def check_options(self) -> None:
        """The method's own options (calibration folder still unopened); its config holds no other."""

    def check_gate(self) -> None:
        """The gate a search meets (auto: read and checked here)."""

    def open_calibration(self) -> None:
        """Open and check the calibration folder the method reads (`cfg.calibration` is set)."""
        from chattts_forge.quantize.inputs import open_calibration

        self.store = open_calibration(self.cfg.calibration, self.src, self.meta,  # type: ignore[arg-type]
                                      self.calibration_components)

    def check_request(self) -> None:
        """Every option and input the method reads, checked up front (the source's files already were)."""
        self.check_options()
        if self.needs_calibration and self.cfg.calibration is None:
            raise BadInput(f"{self.request} needs --calibration CALIB_DIR (make one with `chattts-forge calibrate`)",
                           param="calibration")
        self.check_gate()
        if self.cfg.calibration is not None:
            self.open_calibration()

    def calibrate_kv_cache(self, targets: Targets, out: Path) -> dict[str, Any] | None:
        """`--kv-cache int8`: the per-channel cache scales from the calibration set and their record
        ({"scales", "record"}); None for a float32 cache."""
        cfg = self.cfg
        if cfg.kv_cache == KvCache.FP32:
            return None
        if not self.rebuilds_fast_graph:
            raise BadInput("--kv-cache int8 applies to the fused graph dynamic and rtn int4 rebuild; static, auto "
                           "and calibrated int4 quantize theirs with calibrated activations and a float cache, "
                           "legacy static drops it (use dynamic or int4 --algorithm rtn)", param="kv_cache")
        if targets.any():
            raise BadInput("--kv-cache int8 cannot be combined with fallback targets (they drop the fused GPT graph)",
                           param="kv_cache")
        if not self.meta.has_component(FAST_GPT):
            raise ForgeError(f"--kv-cache int8: artifact {self.src} has no {FAST_GPT_FILE} (convert with --fast-gpt)")
        if cfg.calibration is None:
            raise BadInput("--kv-cache int8 needs --calibration CALIB_DIR: its scales are calibrated from it",
                           param="calibration")
        from chattts_forge.quantize.inputs import open_calibration
        from chattts_forge.quantize.kv_cache import kv_cache_scales

        store = open_calibration(cfg.calibration, self.src, self.meta)
        scales, record = kv_cache_scales(store, self.meta.require_dims().num_hidden_layers)
        corpus = store.manifest.get("corpus") or {}
        record["calibration"] = {"path": portable_path(store.path, out), "corpus": corpus.get("name"),
                                 "corpus_sha256": corpus.get("sha256")}
        log.info("int8 KV cache: scales calibrated from %s (%d decode steps, max |key| %.3g, max |value| %.3g)",
                 cfg.calibration, record["calibration_samples"], record["max_abs"]["key"], record["max_abs"]["value"])
        return {"scales": scales, "record": record}

    # -- quantizing ------------------------------------------------------------------------------

    def statistics(self, graph: str) -> Statistics:
        """calibrate's streamed statistics, checked to be of this source's `graph` (by sha256)."""
        from chattts_forge.quantize.inputs import check_statistics_graph

        assert self.store is not None
        stats = self.store.statistics
        check_statistics_graph(self.store, graph, self.meta, self.src)
        return stats

    def samples(self, component: str) -> list[dict[str, np.ndarray]]:
        if component not in self._samples:
            assert self.store is not None
            self._samples[component] = list(self.store.iter_samples(component))
        return self._samples[component]

    def prepare(self, work: Path, trajectories: Any) -> None:
        """Before the graphs are quantized (auto: its search)."""
        self.work = work

    def quantize_graph(self, component: str, graphs: SourceGraphs, dst: Path, exclude: list[str]) -> dict[str, Any]:
        """Quantize one plain graph (gpt or head_code) of `graphs` into `dst`,
        keeping the nodes `exclude` in FP32; returns the quantizer's options record."""
        raise NotImplementedError

    @classmethod
    def fast_graph_quantizer(cls, *, block_size: int = 128, accuracy_level: int = 4,
                             per_channel: bool = False) -> GraphQuantizer:
        """The quantizer `quantize.fast_gpt_graph.optimize_gpt` rebuilds the fused graph with."""
        # Only a class with `can_rebuild_fast_graph` has one (fast_gpt.fast_gpt_quantizer checks first).
        raise ForgeError(f"--method {cls.name} does not rebuild the fused graph (it quantizes or drops it)")

    def quantize_fast_graph(self, src: Path, dst: Path) -> dict[str, Any]:
        """Quantize the FP32 fused graph `src` with the choices gpt.onnx got (not `rebuilds_fast_graph`)."""
        raise NotImplementedError

    @property
    def fast_graph_precision(self) -> str:
        """The fused graph's precision label (as the rebuilt graphs record theirs: the variant)."""
        return METHOD_VARIANT[self.name]

    def write_fast_graph(self, out_dir: Path, qmeta: ArtifactMeta, kv: dict[str, Any] | None) -> str:
        """The quantized `gpt_fast.onnx` in `out_dir`, recorded in `qmeta`; returns the note
        artifact.json records about it (`kv`: an int8 KV cache, from `calibrate_kv_cache`)."""
        if self.rebuilds_fast_graph:
            return self._rebuild_fast_graph(out_dir, qmeta, kv)
        from chattts_forge.quantize.fused import write_fast_graph

        precision = self.fast_graph_precision
        record = write_fast_graph(self.src, self.meta, out_dir, precision, self.quantize_fast_graph,
                                  self.samples(GPT)[:PARITY_SAMPLES], threads=self.threads)
        qmeta.components[FAST_GPT] = record
        return f"quantized from the FP32 {FAST_GPT_FILE} with the same choices as gpt.onnx ({precision})"

    def _rebuild_fast_graph(self, out_dir: Path, qmeta: ArtifactMeta, kv: dict[str, Any] | None) -> str:
        from chattts_forge.quantize.fast_gpt_graph import FusedGraphOptions, optimize_gpt

        quantizer = self.fast_graph_quantizer(**self.rebuild_options(), per_channel=self.per_channel)
        kv_args: dict[str, Any] = {}
        if kv is not None:
            kv_args = {"kv_cache": KvCache.INT8.value, "kv_scales": kv["scales"], "kv_record": kv["record"]}
        try:
            record = optimize_gpt(self.src, out_dir / FAST_GPT_FILE,
                                  FusedGraphOptions(quantizer=quantizer, weights_from=self.src, **kv_args))
        except ForgeError as e:
            if kv is not None:  # the asked-for cache cannot silently become "no fast graph"
                raise ForgeError(f"could not build the fast GPT graph with an int8 KV cache: {e}") from None
            log.warning("could not rebuild the fast GPT graph quantized (%s); the artifact uses gpt.onnx", e)
            return f"dropped: rebuild failed ({e})"
        qmeta.components[FAST_GPT] = record
        # Recorded in artifact.json (quantization.gpt_fast): the wording names the builder's former
        # module (now quantize.fast_gpt_graph.optimize_gpt) and is kept so that the records stay identical.
        cache = " with an int8 KV cache" if kv is not None else ""
        return f"rebuilt with convert.optimize.optimize_gpt(quantize='{self.name}') from the FP32 weights{cache}"

    # -- the record ------------------------------------------------------------------------------

    def resolved_options(self) -> dict[str, Any]:
        """The options the method resolves itself (a default it chooses), recorded instead of the
        config's value."""
        return {"per_channel": self.per_channel}

    def rebuild_options(self) -> dict[str, Any]:
        """Top-level `block_size`/`accuracy_level`: what a fast-graph rebuild of the variant takes."""
        return {}

    def extra_record(self, out: Path) -> dict[str, Any]:
        """The method's own part of the record (int4: `algorithm`; auto: its search)."""
        return {}

    def per_op_precision(self, summary: dict[str, Any]) -> dict[str, str]:
        """Which op types ended up in which precision in one quantized graph."""
        out: dict[str, str] = {}
        q = summary["quantized_ops"]
        if "MatMulNBits" in q:
            out["MatMulNBits"] = self.nbits_label
        if "MatMulInteger" in q:
            out["MatMulInteger"] = "int8 weights x uint8 activations (dynamic)"
        if "QuantizeLinear" in q or "DequantizeLinear" in q:
            out["QDQ MatMul"] = "int8 weights, calibrated activations (QDQ, fused by onnxruntime)"
        out.update({f"{k} (remaining {v})": "fp32" for k, v in summary["float_ops_left"].items()})
        return out

    def options_record(self) -> QuantizationOptions:
        """`quantization.options`: the recorded options of every options dataclass the method reads
        (config.py's `record` keys); those of the others are null (or left out where optional)."""
        return QuantizationOptions(**recorded_options(self.cfg, self.resolved_options()))

    def components_record(self, run: GraphRun) -> dict[str, dict[str, Any]]:
        out = {
            c: {**run.options[c], "excluded_nodes": run.excluded_nodes.get(c, []), "ops": run.summaries[c],
                "per_op_precision": self.per_op_precision(run.summaries[c])}
            for c in self.cfg.components
        }
        if run.decoder is not None:
            ops = run.summaries[DECODER]
            out[DECODER] = {**run.decoder, "ops": ops, "per_op_precision": {
                "MatMulNBits": "int8 weights, int8 compute (accuracy_level 4)"
            } | {f"{k} (remaining {v})": "fp32" for k, v in ops["float_ops_left"].items()}}
        return out

    def record(self, run: GraphRun, out: Path) -> Quantization:
        """artifact.json's `quantization` of the artifact written to `out` (recorded paths are relative to it)."""
        cfg, meta = self.cfg, self.meta
        not_quantized = {k: v for k, v in NOT_QUANTIZED.items()
                         if k in meta.components and not (k == DECODER and run.decoder is not None)}
        if not cfg.quantize_head:
            not_quantized[HEAD_CODE] = "fp32 (--no-head)"
        rebuild = {"block_size": None, "accuracy_level": None} | self.rebuild_options()
        return Quantization(
            method=self.name.value,
            variant=self.variant,
            tool="onnxruntime.quantization",
            source_artifact={
                "path": portable_path(self.src, out),
                "variant": meta.variant,
                "artifact_json_sha256": sha256_file(self.src / ARTIFACT_JSON),
                "gpt_sha256": meta.components[GPT].get("sha256"),
            },
            options=self.options_record(),
            components=self.components_record(run),
            not_quantized=not_quantized,
            gpt_fast=run.fast_gpt_note,
            per_channel=self.per_channel,
            **rebuild,
            excluded_nodes=sorted({n for v in run.excluded_nodes.values() for n in v}),
            calibration=self.store.describe(relative_to=out) if self.store else None,
            **self.extra_record(out),
            fallback=run.fallback,
            sizes=run.sizes,
            vocos_sha256_equal=run.vocos_sha256_equal,
            copied_files=run.copied_files,
            kv_cache=run.kv_cache,
        )


