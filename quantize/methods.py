"""The quantization methods, one class each, and the registry that maps a method name to its class.

A method owns everything that differs between methods (as onnxruntime's `matmul_nbits_quantizer`
has one config class per algorithm):

- what it needs: calibration samples or not (`calibration_components`), the FP32 trajectories
  (auto's search), a gate (auto), its option checks (`check_options`);
- how it quantizes `gpt.onnx` and `head_code.onnx` (`quantize_graph`) and what becomes of the
  fused `gpt_fast.onnx`: rebuilt from the FP32 weights with the method's own quantizer
  (`rebuilds_fast_graph`: dynamic, int4 rtn; the only ones an int8 KV cache fits), quantized from
  the source's FP32 fused graph with the same choices as gpt.onnx (static minmax, int4
  k_quant/gptq, auto) or dropped (legacy static);
- its record: the `Quantization` block of artifact.json (`chattts_forge.artifact`), written once.

`quantize.py` runs the steps every method shares (check the source, copy, the Decoder, the fallback
loop, fidelity, write). Nothing outside this module tests a method's name: callers look a method up
(`method_class(name)`, `open_method(config, src, meta)`) and ask it.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
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
    KV_CACHE_VARIANTS,
    METHOD_PRECISION,
    METHOD_VARIANT,
    QUANTIZE_METHODS,
    VOCODER,
    ArtifactMeta,
    KvCache,
    Quantization,
    QuantizationOptions,
    QuantizeMethod,
    quantized_variant,
)
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import portable_path
from chattts_forge.gate import recorded_gate_path
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger
from chattts_forge.quantize.config import (
    AutoOptions,
    CalibrateMethod,
    Int4Algorithm,
    Int4Options,
    QuantizeConfig,
    StaticInt8Options,
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
    # The options dataclasses the method reads besides `CommonOptions` (config.py): what its record
    # of the options holds.
    option_groups: ClassVar[tuple[type, ...]] = ()
    default_per_channel: ClassVar[bool] = False
    supports_fallback: ClassVar[bool] = False  # fidelity targets: the fallback loop excludes nodes
    takes_gate: ClassVar[bool] = False  # --gate: a search meets the gate's fidelity thresholds
    # It times the machine (auto's interleaved decode-step timings): the build runs it with nothing beside it.
    times_the_machine: ClassVar[bool] = False
    preprocesses: ClassVar[bool] = False  # onnxruntime's quant_pre_process on the graphs first
    can_rebuild_fast_graph: ClassVar[bool] = False  # `fast_graph_quantizer` exists
    # The build hands it the calibration folder (static's ranges, int4's GPTQ, auto's search).
    build_calibrates: ClassVar[bool] = False
    # Static INT8 from the streamed statistics: reads --smooth-alpha/--no-smooth (quantize/smooth.py)
    # and --weight-bits.
    statistics_static: ClassVar[bool] = False
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

    def check_targets(self, targets: Targets) -> None:
        if targets.any() and not self.supports_fallback:
            raise ForgeError("fidelity targets (--min-agreement/--min-cosine/--max-kl) apply to static and dynamic, "
                             f"not {self.name}")

    def check_options(self) -> None:
        """The method's own options (calibration folder still unopened)."""
        if self.cfg.algorithm is not None:
            raise ForgeError(f"--algorithm applies to --method int4, not {self.name}")

    def check_gate(self) -> None:
        if self.cfg.gate is not None:
            raise ForgeError("--gate applies to --method auto")

    def open_calibration(self) -> None:
        """Open and check the calibration folder the method reads (`cfg.calibration` is set)."""
        from chattts_forge.quantize.inputs import open_calibration

        self.store = open_calibration(self.cfg.calibration, self.src, self.meta,  # type: ignore[arg-type]
                                      self.calibration_components)

    def check_request(self) -> None:
        """Every option and input the method reads, checked up front (the source's files already were)."""
        for flag, given in (("--smooth-alpha", self.cfg.smooth_alpha is not None), ("--no-smooth", not self.cfg.smooth),
                            ("--weight-bits", self.cfg.weight_bits != DEFAULT_WEIGHT_BITS)):
            if given and not self.statistics_static:
                raise ForgeError(f"{flag} applies to --method static with minmax or percentile ranges and "
                                 f"asymmetric activations, not {self.request}")
        self.check_options()
        if self.needs_calibration and self.cfg.calibration is None:
            raise ForgeError(f"{self.request} needs --calibration CALIB_DIR (make one with `chattts-forge calibrate`)")
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
            raise ForgeError("--kv-cache int8 applies to the fused graph dynamic and rtn int4 rebuild; static, auto "
                             "and calibrated int4 quantize theirs with calibrated activations and a float cache, "
                             "legacy static drops it (use dynamic or int4 --algorithm rtn)")
        if targets.any():
            raise ForgeError("--kv-cache int8 cannot be combined with fallback targets (they drop the fused GPT graph)")
        if not self.meta.has_component(FAST_GPT):
            raise ForgeError(f"--kv-cache int8: artifact {self.src} has no {FAST_GPT_FILE} (convert with --fast-gpt)")
        if cfg.calibration is None:
            raise ForgeError("--kv-cache int8 needs --calibration CALIB_DIR: its scales are calibrated from it")
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
        rebuilding = ", ".join(m for m in QUANTIZE_METHODS if METHODS[m].can_rebuild_fast_graph)
        raise ForgeError(f"unknown quantization method '{cls.name}' (choose from: {rebuilding})")

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

        cfg = self.cfg
        quantizer = self.fast_graph_quantizer(block_size=cfg.block_size, accuracy_level=cfg.accuracy_level,
                                              per_channel=self.per_channel)
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
        return QuantizationOptions(**recorded_options(self.cfg, self.resolved_options(), self.option_groups))

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


class DynamicInt8(QuantizationMethod):
    """onnxruntime's dynamic INT8 (`dynamic.py`): no calibration; per tensor by default (the faster
    step on CPU: docs/measurements/2026-12-01/code-comment-figures.md); the fused graph rebuilt
    with the same quantizer."""

    name = QuantizeMethod.DYNAMIC
    supports_fallback = True
    can_rebuild_fast_graph = True

    @property
    def rebuilds_fast_graph(self) -> bool:
        return True

    def open_calibration(self) -> None:
        # an int8 KV cache reads the folder itself (`calibrate_kv_cache`)
        if self.cfg.kv_cache == KvCache.FP32:
            log.info("--calibration is only used by --kv-cache int8 with --method dynamic; ignoring it")

    def quantize_graph(self, component: str, graphs: SourceGraphs, dst: Path, exclude: list[str]) -> dict[str, Any]:
        from chattts_forge.quantize.dynamic import quantize_dynamic_graph

        return quantize_dynamic_graph(graphs.base[component], dst, per_channel=self.per_channel, exclude_nodes=exclude)

    @classmethod
    def fast_graph_quantizer(cls, *, block_size: int = 128, accuracy_level: int = 4,
                             per_channel: bool = False) -> GraphQuantizer:
        """INT8 MatMulInteger, per tensor unless `per_channel`; per-tensor INT8 keeps the projections
        unpacked (packing would share one scale across matrices)."""
        from chattts_forge.quantize.dynamic import quantize_dynamic_graph
        from chattts_forge.quantize.fast_gpt_graph import GraphQuantizer

        return GraphQuantizer(cls.name, METHOD_VARIANT[cls.name], pack_projections=per_channel,
                              quantize=functools.partial(quantize_dynamic_graph, per_channel=per_channel))


class StaticInt8(QuantizationMethod):
    """Static INT8 from calibration samples with minmax ranges (`static_fused.py`), on gpt.onnx, the
    code head and the fused graph alike. Other range options select `LegacyStaticInt8`."""

    name = QuantizeMethod.STATIC
    option_groups = (StaticInt8Options,)
    default_per_channel = True
    supports_fallback = True
    build_calibrates = True
    statistics_static = True

    @property
    def needs_calibration(self) -> bool:
        return True

    def resolved_options(self) -> dict[str, Any]:
        weight_bits = self.cfg.weight_bits
        return super().resolved_options() | {
            "smooth_alpha": self.smooth_alpha, "percentile": self.percentile,
            "weight_bits": None if weight_bits == DEFAULT_WEIGHT_BITS else weight_bits}  # recorded when not 7

    @property
    def percentile(self) -> float | None:
        """The |x| percentile ranges are clipped at (`--calibrate-method percentile`), else None."""
        if self.cfg.calibrate_method != CalibrateMethod.PERCENTILE:
            return None
        return DEFAULT_PERCENTILE if self.cfg.percentile is None else self.cfg.percentile

    @property
    def smooth_alpha(self) -> float | None:
        """SmoothQuant's alpha: --smooth-alpha, else the default, except with --no-smooth and with
        percentile ranges (which it does not combine with)."""
        if not self.cfg.smooth or (self.cfg.smooth_alpha is None and self.percentile is not None):
            return None
        return DEFAULT_SMOOTH_ALPHA if self.cfg.smooth_alpha is None else self.cfg.smooth_alpha

    def check_options(self) -> None:
        from chattts_forge.quantize.smooth import check_alpha

        if self.cfg.algorithm is not None:
            raise ForgeError(f"--algorithm applies to --method int4, not {self.name}")
        check_alpha(self.cfg.smooth_alpha)
        if self.cfg.smooth_alpha is not None and not self.cfg.smooth:
            raise ForgeError("--smooth-alpha and --no-smooth contradict each other")
        if self.cfg.percentile is not None and self.cfg.calibrate_method != CalibrateMethod.PERCENTILE:
            raise ForgeError("--percentile applies to --calibrate-method percentile")
        if self.cfg.smooth_alpha is not None and self.cfg.calibrate_method == CalibrateMethod.PERCENTILE:
            # No histogram of x / s is streamed (s is chosen here); clipping it by x's own percentile
            # cut real signal once the outlier channels had moved into the weights.
            raise ForgeError("--smooth-alpha takes its ranges from the per-channel maxima: not with "
                             "--calibrate-method percentile")
        if self.percentile is not None and not 50.0 < self.percentile <= 100.0:
            raise ForgeError(f"--percentile must be within 50..100, got {self.percentile}")
        if self.cfg.weight_bits not in (7, 8):
            raise ForgeError(f"--weight-bits must be 7 or 8, got {self.cfg.weight_bits}")

    def _static(self, src: Path, dst: Path, graph: str, exclude: list[str] | None = None) -> dict[str, Any]:
        """Ranges from calibrate's streamed statistics of `graph` (gpt, gpt_fast, head_code)."""
        from chattts_forge.quantize.static_fused import StaticSettings, quantize_static_inputs

        extra = {} if exclude is None else {"exclude_nodes": exclude}
        settings = StaticSettings(activation_type=self.cfg.activation_type, reduce_range=self.cfg.weight_bits == 7,
                                  smooth_alpha=self.smooth_alpha, percentile=self.percentile)
        return quantize_static_inputs(src, dst, settings=settings, threads=self.threads,
                                      statistics=(self.statistics(graph), graph), **extra)

    def quantize_graph(self, component: str, graphs: SourceGraphs, dst: Path, exclude: list[str]) -> dict[str, Any]:
        return self._static(graphs.base[component], dst, component, exclude)

    def quantize_fast_graph(self, src: Path, dst: Path) -> dict[str, Any]:
        return self._static(src, dst, FAST_GPT)


class LegacyStaticInt8(StaticInt8):
    """Static INT8 with entropy ranges or symmetric activations: onnxruntime's own
    `quantize_static` (`static.py`) on pre-processed plain graphs; the fused graph is dropped."""

    preprocesses = True
    statistics_static = False  # onnxruntime's own quantize_static

    @property
    def percentile(self) -> float | None:
        return None  # onnxruntime's percentile calibrator keeps its own setting

    @property
    def smooth_alpha(self) -> float | None:
        return None

    def check_options(self) -> None:
        super().check_options()
        if self.cfg.percentile is not None:
            raise ForgeError("--percentile reads the streamed histograms: not with --symmetric-activations "
                             "(onnxruntime's own quantize_static)")

    @property
    def request(self) -> str:
        cfg = self.cfg
        ranges = "" if cfg.calibrate_method == CalibrateMethod.MINMAX else f" --calibrate-method {cfg.calibrate_method}"
        return f"--method static{ranges}" + (" --symmetric-activations" if cfg.symmetric_activations else "")

    def quantize_graph(self, component: str, graphs: SourceGraphs, dst: Path, exclude: list[str]) -> dict[str, Any]:
        from chattts_forge.quantize.static import StaticOptions, quantize_static_graph

        cfg = self.cfg
        options = StaticOptions(calibrate_method=cfg.calibrate_method, per_channel=self.per_channel,
                                symmetric_activations=cfg.symmetric_activations,
                                activation_type=cfg.activation_type, exclude_nodes=exclude)
        assert self.store is not None
        record = quantize_static_graph(graphs.files[component], dst, self.store, component, options,
                                       cache_path=self.work / f"{component}.calib-cache.json",
                                       preprocessed=graphs.base[component])
        record.update(graphs.preprocess[component])
        return record

    def write_fast_graph(self, out_dir: Path, qmeta: ArtifactMeta, kv: dict[str, Any] | None) -> str:
        return "dropped: no QDQ fast graph (its inputs differ from the calibrated plain graph); runtime uses gpt.onnx"


class Int4(QuantizationMethod):
    """MatMulNBits 4-bit weight-only (`int4.py`) with its algorithm: rtn (round to nearest, no
    calibration; the fused graph rebuilt), k_quant, or gptq (calibrated; the default when a
    calibration folder is given without an int8 KV cache); calibrated ones quantize the fused graph
    with the same choices."""

    name = QuantizeMethod.INT4
    option_groups = (Int4Options,)
    can_rebuild_fast_graph = True
    build_calibrates = True
    nbits_label = INT4_COMPUTE

    def __init__(self, cfg: QuantizeConfig, src: Path, meta: ArtifactMeta) -> None:
        super().__init__(cfg, src, meta)
        # With --kv-cache int8 the calibration folder serves the cache scales of the rebuilt (rtn) fused graph.
        calibrated = cfg.calibration is not None and cfg.kv_cache == KvCache.FP32
        self.algorithm = cfg.algorithm or (Int4Algorithm.GPTQ if calibrated else Int4Algorithm.RTN)
        self._gptq_memo: Any = None

    @property
    def gptq_memo(self) -> Any:
        """The GPTQ columns solved for gpt.onnx, looked up again by the fused graph (int4_gptq.GptqMemo)."""
        if self._gptq_memo is None:
            from chattts_forge.quantize.int4_gptq import GptqMemo

            self._gptq_memo = GptqMemo()
        return self._gptq_memo

    @property
    def gptq(self) -> bool:
        return self.algorithm == Int4Algorithm.GPTQ

    @property
    def rebuilds_fast_graph(self) -> bool:
        return self.algorithm == Int4Algorithm.RTN

    @property
    def needs_calibration(self) -> bool:
        return self.gptq or self.algorithm == Int4Algorithm.IMPORTANCE

    @property
    def request(self) -> str:
        return f"--method {self.name} --algorithm {self.algorithm}"

    @property
    def calibration_components(self) -> tuple[str, ...]:
        return super().calibration_components if self.gptq else (GPT,)

    def check_options(self) -> None:
        from chattts_forge.quantize.int4 import check_int4_options

        check_int4_options(self.cfg.block_size, self.cfg.accuracy_level, self.algorithm)

    def open_calibration(self) -> None:
        super().open_calibration()
        if not self.gptq:
            return
        from chattts_forge.quantize.int4_gptq import graph_hessians

        for c in self.calibration_components:  # GPTQ reads calibrate's streamed X^T X: checked up front
            graph_hessians(self.statistics(c), c)

    def _int4(self, src: Path, dst: Path, exclude: list[str] | None = None, graph: str = GPT) -> dict[str, Any]:
        from chattts_forge.quantize.int4 import quantize_int4_graph

        extra = {} if exclude is None else {"exclude_nodes": exclude}
        if self.algorithm == Int4Algorithm.IMPORTANCE:  # per-channel mean squares of this graph's MatMul inputs
            from chattts_forge.quantize.int4_importance import quantize_importance_int4_graph

            stats = self.statistics(graph).tensors(graph)
            return quantize_importance_int4_graph(src, dst, {t: st.mean_square for t, st in stats.items()},
                                                  self.cfg.block_size, self.cfg.accuracy_level, **extra)
        if self.gptq:  # from the Hessians calibrate streamed (int4_gptq.py), not raw inputs
            from chattts_forge.quantize.int4_gptq import graph_hessians, quantize_gptq_int4_graph

            hessians, rows = graph_hessians(self.statistics(graph), graph)
            return quantize_gptq_int4_graph(src, dst, hessians, self.cfg.block_size, self.cfg.accuracy_level,
                                            rows=rows, memo=self.gptq_memo, **extra)
        return quantize_int4_graph(src, dst, self.cfg.block_size, self.cfg.accuracy_level, algorithm=self.algorithm,
                                   **extra)

    def quantize_graph(self, component: str, graphs: SourceGraphs, dst: Path, exclude: list[str]) -> dict[str, Any]:
        return self._int4(graphs.base[component], dst, exclude, graph=component)

    def quantize_fast_graph(self, src: Path, dst: Path) -> dict[str, Any]:
        return self._int4(src, dst, graph=FAST_GPT)

    @classmethod
    def fast_graph_quantizer(cls, *, block_size: int = 128, accuracy_level: int = 4,
                             per_channel: bool = False) -> GraphQuantizer:
        """MatMulNBits (rtn) at `block_size`, `accuracy_level`; projections packed."""
        from chattts_forge.quantize.fast_gpt_graph import GraphQuantizer
        from chattts_forge.quantize.int4 import quantize_int4_graph

        return GraphQuantizer(cls.name, METHOD_VARIANT[cls.name], pack_projections=True,
                              quantize=functools.partial(quantize_int4_graph, block_size=block_size,
                                                         accuracy_level=accuracy_level))

    def resolved_options(self) -> dict[str, Any]:
        return super().resolved_options() | {"algorithm": self.algorithm}

    def rebuild_options(self) -> dict[str, Any]:
        return {"block_size": self.cfg.block_size, "accuracy_level": self.cfg.accuracy_level}

    def extra_record(self, out: Path) -> dict[str, Any]:
        return {"algorithm": self.algorithm.value}


class Auto(QuantizationMethod):
    """Per-MatMul FP32 / dynamic INT8 / INT4 (rtn), the fastest assignment that meets a gate's
    fidelity thresholds (`auto.py`: sensitivity + search on the fused graph, from calibration
    samples and the FP32 trajectories); the code head static INT8 when a candidate meets the gate
    with it."""

    name = QuantizeMethod.AUTO
    option_groups = (AutoOptions,)
    takes_gate = True
    times_the_machine = True
    build_calibrates = True
    nbits_label = INT4_COMPUTE

    def __init__(self, cfg: QuantizeConfig, src: Path, meta: ArtifactMeta) -> None:
        super().__init__(cfg, src, meta)
        self.gate: Path | None = None
        self.search: dict[str, Any] | None = None
        self._head_record: dict[str, Any] = {}

    @property
    def needs_calibration(self) -> bool:
        return True

    @property
    def needs_trajectories(self) -> bool:
        return True

    @property
    def fast_graph_precision(self) -> str:
        return self.precision  # "mixed"

    def check_options(self) -> None:
        from chattts_forge.quantize.int4 import check_int4_options

        check_int4_options(self.cfg.block_size, self.cfg.accuracy_level, Int4Algorithm.RTN)
        if self.cfg.algorithm not in (None, Int4Algorithm.RTN):
            raise ForgeError("--algorithm applies to --method int4 (auto's INT4 MatMuls use rtn)")

    def check_gate(self) -> None:
        if not self.meta.has_component(FAST_GPT):
            raise ForgeError(f"--method auto searches on the fused {FAST_GPT_FILE}, which {self.src} lacks "
                             "(re-run convert)")
        from chattts_forge.quantize.auto import fidelity_targets

        self.gate = fidelity_targets(self.cfg.gate)["path"]

    def prepare(self, work: Path, trajectories: Any) -> None:
        from chattts_forge.quantize.auto import SearchSettings, search
        from chattts_forge.quantize.static_fused import StaticSettings, quantize_static_inputs

        super().prepare(work, trajectories)
        # The code head is static INT8 in every candidate: quantize it first, so that the search
        # measures what the gate will judge (the artifact's own head, not the FP32 one).
        head = self.meta.component_file(self.src, HEAD_CODE)
        if self.cfg.quantize_head:
            static = StaticSettings(activation_type=self.cfg.activation_type)
            self._head_record = quantize_static_inputs(head, work / "head_code.auto.onnx", settings=static,
                                                       threads=self.threads,
                                                       statistics=(self.statistics(HEAD_CODE), HEAD_CODE))
            head = work / "head_code.auto.onnx"
        settings = SearchSettings(block_size=self.cfg.block_size, accuracy_level=self.cfg.accuracy_level,
                                  threads=self.threads)
        self.search = search(self.src, self.meta, work, self.samples(GPT), trajectories, self.gate, head=head,
                             settings=settings)

    def quantize_graph(self, component: str, graphs: SourceGraphs, dst: Path, exclude: list[str]) -> dict[str, Any]:
        from chattts_forge.quantize.auto import FP32

        assert self.search is not None
        if component == HEAD_CODE:  # quantized before the search
            if self.search[HEAD_CODE] == FP32:
                shutil.copyfile(graphs.base[component], dst)
                return {"kept": "fp32 (auto: no candidate met the gate with the INT8 code head)"}
            shutil.copyfile(self.work / "head_code.auto.onnx", dst)
            return dict(self._head_record)
        return self._mixed(graphs.base[component], dst, plain=True)

    def quantize_fast_graph(self, src: Path, dst: Path) -> dict[str, Any]:
        return self._mixed(src, dst, plain=False)

    def _mixed(self, src: Path, dst: Path, plain: bool) -> dict[str, Any]:
        from chattts_forge.quantize.auto import CHOICES, plain_assignment, quantize_mixed

        assert self.search is not None
        assignment = self.search["assignment"]
        if plain:  # the search assigned the fused graph's (packed) projections: gpt.onnx's MatMuls
            assignment = plain_assignment(src, assignment)
        rec = quantize_mixed(src, dst, assignment, self.work, block_size=self.cfg.block_size,
                             accuracy_level=self.cfg.accuracy_level)
        return {"format": "mixed: dynamic INT8 (DynamicQuantizeMatMul, per-projection weight scales) + "
                          "INT4 MatMulNBits (rtn) + FP32",
                "assignment": {c: sum(1 for v in assignment.values() if v == c) for c in CHOICES},
                **rec}

    def extra_record(self, out: Path) -> dict[str, Any]:
        assert self.search is not None
        search = dict(self.search)
        gate = dict(search["gate"])  # by its builtin name or file name (and sha256), as evaluate records it
        search["gate"] = gate | {"path": recorded_gate_path(gate["path"])}
        return {"auto": search}


# ---- the registry ------------------------------------------------------------------------------

METHODS: dict[str, type[QuantizationMethod]] = {m.name: m for m in (DynamicInt8, StaticInt8, Int4, Auto)}
assert tuple(METHODS) == QUANTIZE_METHODS, "the registry and the artifact contract list the same methods"


def calibrated_variants() -> tuple[str, ...]:
    """The variants the build quantizes from the calibration set: those of the methods that take it
    (`build_calibrates`), and every INT8 KV cache variant (its scales)."""
    return (*(METHOD_VARIANT[name] for name, cls in METHODS.items() if cls.build_calibrates), *KV_CACHE_VARIANTS)


def method_class(name: str) -> type[QuantizationMethod]:
    """The class of a method name (`QUANTIZE_METHODS`); a one-line ForgeError for any other."""
    try:
        return METHODS[name]
    except KeyError:
        raise ForgeError(f"unknown method '{name}' (choose from: {', '.join(METHODS)})") from None


def open_method(cfg: QuantizeConfig, src: Path, meta: ArtifactMeta) -> QuantizationMethod:
    """The method object `cfg` asks for (static with entropy ranges or symmetric activations:
    onnxruntime's own quantize_static path)."""
    cls: Callable[..., QuantizationMethod] = method_class(cfg.method)
    if cls is StaticInt8 and (cfg.calibrate_method == CalibrateMethod.ENTROPY or cfg.symmetric_activations):
        cls = LegacyStaticInt8
    return cls(cfg, src, meta)
