"""The quantization methods, one class each (`method_base.QuantizationMethod`), and the registry
that maps a method name to its class (`METHODS`, `method_class`, `open_method`).

`quantize.py` runs the steps every method shares (check the source, copy, the Decoder, the fallback
loop, fidelity, write). Nothing outside this module tests a method's name: callers look a method up
(`method_class(name)`, `open_method(config, src, meta)`) and ask it.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chattts_forge.artifact import (
    FAST_GPT,
    FAST_GPT_FILE,
    GPT,
    HEAD_CODE,
    KV_CACHE_VARIANTS,
    METHOD_VARIANT,
    QUANTIZE_METHODS,
    ArtifactMeta,
    KvCache,
    QuantizeMethod,
)
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.gate import recorded_gate_path
from chattts_forge.log import get_logger
from chattts_forge.quantize.config import (
    ActivationType,
    AutoConfig,
    CalibrateMethod,
    DynamicInt8Config,
    Int4Algorithm,
    Int4Config,
    QuantizeConfig,
    StaticInt8Config,
)
from chattts_forge.quantize.method_base import (
    DEFAULT_PERCENTILE,
    DEFAULT_SMOOTH_ALPHA,
    DEFAULT_WEIGHT_BITS,
    INT4_COMPUTE,
    QuantizationMethod,
)

if TYPE_CHECKING:
    from chattts_forge.quantize.fast_gpt_graph import GraphQuantizer
    from chattts_forge.quantize.quantize import SourceGraphs

log = get_logger(__name__)


class DynamicInt8(QuantizationMethod):
    """onnxruntime's dynamic INT8 (`dynamic.py`): no calibration; per tensor by default (the faster
    step on CPU: docs/measurements/2026-12-01/code-comment-figures.md); the fused graph rebuilt
    with the same quantizer."""

    name = QuantizeMethod.DYNAMIC
    config_type = DynamicInt8Config
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
    config_type = StaticInt8Config
    default_per_channel = True
    build_calibrates = True

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

        check_alpha(self.cfg.smooth_alpha)
        if self.cfg.smooth_alpha is not None and not self.cfg.smooth:
            raise BadInput("--smooth-alpha and --no-smooth contradict each other", param="smooth_alpha")
        if self.cfg.percentile is not None and self.cfg.calibrate_method != CalibrateMethod.PERCENTILE:
            raise BadInput("--percentile applies to --calibrate-method percentile", param="percentile")
        if self.cfg.smooth_alpha is not None and self.cfg.calibrate_method == CalibrateMethod.PERCENTILE:
            # No histogram of x / s is streamed (s is chosen here); clipping it by x's own percentile
            # cut real signal once the outlier channels had moved into the weights.
            raise BadInput("--smooth-alpha takes its ranges from the per-channel maxima: not with "
                           "--calibrate-method percentile", param="smooth_alpha")
        if self.percentile is not None and not 50.0 < self.percentile <= 100.0:
            raise BadInput(f"--percentile must be within 50..100, got {self.percentile}", param="percentile")
        if self.cfg.weight_bits not in (7, 8):
            raise BadInput(f"--weight-bits must be 7 or 8, got {self.cfg.weight_bits}", param="weight_bits")

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

    @property
    def percentile(self) -> float | None:
        return None  # onnxruntime's percentile calibrator keeps its own setting

    @property
    def smooth_alpha(self) -> float | None:
        return None

    def check_options(self) -> None:
        """onnxruntime's own quantize_static reads none of the streamed-statistics options."""
        cfg = self.cfg
        for name, flag, given in (("smooth_alpha", "--smooth-alpha", cfg.smooth_alpha is not None),
                                  ("smooth", "--no-smooth", not cfg.smooth),
                                  ("weight_bits", "--weight-bits", cfg.weight_bits != DEFAULT_WEIGHT_BITS)):
            if given:
                raise BadInput(f"{flag} applies to --method static with minmax or percentile ranges and "
                               f"asymmetric activations, not {self.request}", param=name)
        super().check_options()
        if cfg.percentile is not None:
            raise BadInput("--percentile reads the streamed histograms: not with --symmetric-activations "
                           "(onnxruntime's own quantize_static)", param="percentile")

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
    config_type = Int4Config
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
    config_type = AutoConfig
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
            # auto reads no static options: the head's activations are static's default type
            static = StaticSettings(activation_type=ActivationType.UINT8)
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
