"""What `quantize_artifact` is asked to do: one config type per method (`DynamicInt8Config`,
`StaticInt8Config`, `Int4Config`, `AutoConfig`, all `QuantizeConfig`s), each composed of the options
dataclasses that method reads (as onnxruntime has one config class per quantization algorithm), so an
option of another method cannot be held; and the fidelity settings and fallback targets derived from it.

`QuantizeConfig(method, **options)` builds the method's own type and refuses, with one rule
(`config_for`), any option given that belongs to no group of that method. Every keyword a Python caller
passes counts as given (even at its default value); the CLI passes only those given on its command line.

Each option is declared once, on its field (`chattts_forge.options.option`): its name, default,
type, closed set of choices (a `Choice` enum) and help. `quantize`'s click options
(`declared_options`), the build driver's step arguments (`options.changed_args`) and the record of
the options in artifact.json (`recorded_options`, each field's `record` key) are derived from them.

Library::

    from chattts_forge.quantize import QuantizeConfig, quantize_artifact
    quantize_artifact("artifacts/fp32", "artifacts/int4",
                      QuantizeConfig("int4", calibration="build/calib", algorithm="gptq", block_size=32))

Light on purpose (no onnx, no onnxruntime): the driver and the CLI import it and the method registry
(`methods.py`) without loading the quantizers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from chattts_forge.artifact import (
    GPT,
    HEAD_CODE,
    QUANTIZE_METHODS,
    DecoderWeights,
    KvCache,
    QuantizeMethod,
    quantized_variant,
)
from chattts_forge.choices import Choice, plain
from chattts_forge.errors import BadInput
from chattts_forge.options import option, parse_declared_choices, refuse_options_not_read


class CalibrateMethod(Choice):
    """Static: how activation ranges are chosen (entropy: onnxruntime's own quantize_static)."""

    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class ActivationType(Choice):
    """Static: the activations' integer type."""

    UINT8 = "uint8"
    INT8 = "int8"


class Int4Algorithm(Choice):
    """INT4: how MatMulNBits weights are chosen (int4.py; gptq: int4_gptq.py, importance:
    int4_importance.py)."""

    RTN = "rtn"
    K_QUANT = "k_quant"
    GPTQ = "gptq"
    IMPORTANCE = "importance"


# Where a field goes in artifact.json's `quantization.options` (its key); fields without one are
# not recorded there.
RECORD = "record"


def _declared(default: Any, flags: str, help: str | None = None, record: str | None = None, **spec: Any) -> Any:
    f = option(default, flags, help, **spec)
    if record is not None:  # dataclasses' metadata is read-only: a new field with both keys
        f = field(default=default, metadata={**f.metadata, RECORD: record})
    return f


# ---- the options, one dataclass per method or concern ---------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CommonOptions:
    """What every method reads. `per_channel=None` takes the method's default; `decoder` and
    `kv_cache` apply to every method whose graphs allow them."""

    calibration: str | os.PathLike[str] | None = _declared(
        None, "--calibration", "Calibration folder from `chattts-forge calibrate` (static, auto, int4 gptq).",
        kind="path")
    per_channel: bool | None = _declared(
        None, "--per-channel/--per-tensor",
        "Weight scales per output channel (default: per tensor for dynamic, per channel for static).",
        record="per_channel")
    exclude: tuple[str, ...] = _declared(
        (), "--exclude", "Keep nodes whose name matches this glob in FP32 (repeatable).", multiple=True,
        metavar="PATTERN", record="exclude_patterns")
    quantize_head: bool = _declared(True, "--head/--no-head", "Also quantize the code head (head_code.onnx).",
                                    show_default=True, record="quantize_head")
    seed: int = _declared(0, "--seed", kind=int, show_default=True, record="seed")
    threads: int | None = _declared(None, "--threads", "onnxruntime intra-op threads for fidelity runs.", kind=int)
    kv_cache: KvCache = _declared(
        KvCache.FP32, "--kv-cache",
        "KV cache of the fused GPT graph (dynamic/int4): int8 quarters its memory, scales calibrated from "
        "--calibration; its fidelity is measured like the weights'. It names its own variant "
        f"({quantized_variant('dynamic', 'int8')}, {quantized_variant('int4', 'int8')}).",
        choices=KvCache, show_default=True, noun="KV cache")
    decoder: DecoderWeights = _declared(
        DecoderWeights.INT8, "--decoder",
        "The Decoder's pointwise MatMuls: int8 = weight-only INT8 computed in float (MatMulNBits 8-bit, "
        "convolutions FP32; streams exactly), int8-a8 = the same with int8 activations (faster; streamed audio "
        "no longer equals whole-text audio), or fp32.",
        choices=DecoderWeights, show_default=True, record="decoder", noun="decoder weights")
    progress: bool | None = None  # progress bars (None: when the output is a terminal); no CLI option


@dataclass(frozen=True, kw_only=True)
class StaticInt8Options:
    """Static INT8's activation settings and SmoothQuant migration (methods.StaticInt8)."""

    calibrate_method: CalibrateMethod = _declared(
        CalibrateMethod.MINMAX, "--calibrate-method", "Static: how activation ranges are chosen.",
        choices=CalibrateMethod, show_default=True, record="calibrate_method")
    activation_type: ActivationType = _declared(
        ActivationType.UINT8, "--activation-type",
        "Static: activation type (int8 is a ~20x slower onnxruntime CPU path).", choices=ActivationType,
        show_default=True, record="activation_type")
    symmetric_activations: bool = _declared(False, "--symmetric-activations", "Static: symmetric activation ranges.",
                                            is_flag=True, record="symmetric_activations")
    percentile: float | None = _declared(
        None, "--percentile",
        "Static with --calibrate-method percentile: clip each activation range at this percentile of |x| "
        "(from the streamed histograms; default 99.99).", kind=float, record="percentile")
    # 7 (+-63: exact on every x86 CPU) or 8 (exact with VNNI/AMX only)
    weight_bits: int = _declared(
        7, "--weight-bits",
        "Static: weight bits per channel. 8 is finer, but onnxruntime's u8s8 kernels saturate on CPUs without "
        "AVX-512 VNNI, AVX-VNNI or AMX (the runtime warns there).",
        choices=("7", "8"), convert=int, show_default=True, record="weight_bits")
    smooth_alpha: float | None = _declared(
        None, "--smooth-alpha",
        "Static: SmoothQuant migration strength (0..1, default 0.75): each MatMul input's per-channel range "
        "moved into its weights, from the calibration statistics.", kind=float, record="smooth_alpha")
    smooth: bool = _declared(True, "--smooth/--no-smooth",
                             "Static: the SmoothQuant migration (off by itself with --calibrate-method percentile).",
                             show_default=True)


@dataclass(frozen=True, kw_only=True)
class BlockOptions:
    """MatMulNBits' block settings: int4's, and those of auto's INT4 MatMuls (int4 and auto read it)."""

    block_size: int = _declared(128, "--block-size",
                                "INT4 (and auto's INT4 MatMuls): weights per quantization block (16..256).",
                                kind=int, show_default=True, record="block_size")
    accuracy_level: int = _declared(4, "--accuracy-level",
                                    "INT4: MatMulNBits accuracy_level (4: int8 compute, fastest on CPU).",
                                    kind=int, show_default=True, record="accuracy_level")


@dataclass(frozen=True, kw_only=True)
class Int4Options:
    """INT4 weight-only's algorithm (methods.Int4; None: gptq with a calibration folder and a float KV
    cache, else rtn). auto's INT4 MatMuls are always rtn: it does not read this group."""

    algorithm: Int4Algorithm | None = _declared(
        None, "--algorithm",
        f"INT4: {', '.join(Int4Algorithm.values()[:-1])} or {Int4Algorithm.values()[-1]} "
        "(default: gptq with --calibration, else rtn).", choices=Int4Algorithm, record="algorithm",
        noun="INT4 algorithm")


@dataclass(frozen=True, kw_only=True)
class AutoOptions:
    """auto (methods.Auto): the gate its search meets."""

    gate: str | os.PathLike[str] | None = _declared(
        None, "--gate",
        "auto: GATE.toml whose fidelity thresholds the chosen assignment must meet (default: the shipped gate).",
        kind="path")


@dataclass(frozen=True)
class Targets:
    """The accuracy-driven fallback's fidelity targets (`fallback.py`); all None: no fallback."""

    min_agreement: float | None = None
    min_cosine: float | None = None
    max_kl: float | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.min_agreement, self.min_cosine, self.max_kl))

    def check_ranges(self) -> None:
        for name, value in (("min-agreement", self.min_agreement), ("min-cosine", self.min_cosine)):
            if value is not None and not (0.0 <= value <= 1.0):
                raise BadInput(f"--{name} must lie in [0, 1], got {value}", param=name.replace("-", "_"))

    def check(self, fid: dict[str, Any]) -> list[str]:
        """The targets `fid` misses, as short strings (empty: all met)."""
        missed = []
        agree = fid["teacher_forced"]["top1_agreement"]["mean"]
        cos = fid["hidden_cosine"]["mean"]
        kl = fid["teacher_forced"]["kl"]["mean"]
        if self.min_agreement is not None and agree < self.min_agreement:
            missed.append(f"agreement {agree:.4f} < {self.min_agreement}")
        if self.min_cosine is not None and cos < self.min_cosine:
            missed.append(f"cosine {cos:.6f} < {self.min_cosine}")
        if self.max_kl is not None and kl > self.max_kl:
            missed.append(f"KL {kl:.3e} > {self.max_kl}")
        return missed

    def to_dict(self) -> dict[str, float | None]:
        return {"min_agreement": self.min_agreement, "min_cosine": self.min_cosine, "max_kl": self.max_kl}


@dataclass(frozen=True, kw_only=True)
class FallbackOptions:
    """The accuracy-driven fallback (static and dynamic read it): its fidelity targets and step size."""

    min_agreement: float | None = _declared(
        None, "--min-agreement", "Fallback target: teacher-forced top-1 code agreement (0..1) on the held-out split.",
        kind=float)
    min_cosine: float | None = _declared(None, "--min-cosine", "Fallback target: mean hidden-state cosine.",
                                         kind=float)
    max_kl: float | None = _declared(None, "--max-kl", "Fallback target: mean KL divergence (nats).", kind=float)
    step_nodes: int | None = _declared(None, "--step-nodes", "Fallback: nodes excluded per step (default 10%).",
                                       kind=int)

    @property
    def targets(self) -> Targets:
        return Targets(self.min_agreement, self.min_cosine, self.max_kl)


@dataclass(frozen=True)
class FidelitySettings:
    """How `fidelity.measure_fidelity` measures: the first `max_sentences` sentences, `max_new_token`
    GPT steps each (sentence i seeded `seed + i`), on `threads`; `per_tensor`: the per-tensor error
    table (its `top_tensors` worst rows, every row with `keep_all_tensors`). The one fidelity
    settings type: quantize's options make one (`FidelityOptions.fidelity_settings`)."""

    max_sentences: int = 8
    max_new_token: int = 48
    seed: int = 0
    threads: int | None = None
    progress: bool | None = None
    per_tensor: bool = True
    top_tensors: int = 10
    keep_all_tensors: bool = False


@dataclass(frozen=True, kw_only=True)
class FidelityOptions:
    """Fidelity against the FP32 source, measured on a held-out corpus and stored in artifact.json."""

    fidelity: bool = _declared(True, "--fidelity/--no-fidelity",
                               "Measure fidelity against the FP32 source (stored in artifact.json).", show_default=True)
    fidelity_corpus: str = _declared("builtin:evaluation", "--fidelity-corpus",
                                     "Held-out corpus for fidelity and fallback.", show_default=True)
    fidelity_sentences: int = _declared(8, "--fidelity-sentences", kind=int, show_default=True)
    fidelity_steps: int = _declared(48, "--fidelity-steps", "GPT steps per sentence at most.", kind=int,
                                    show_default=True)
    # a trajectories.npz recorded once (fidelity.read_fp32_runs)
    fp32_runs: str | os.PathLike[str] | None = _declared(
        None, "--fp32-runs",
        "FP32 runs recorded once for the build (evaluate-reference's trajectories.npz): replayed instead of "
        "recorded again when their sentences, steps and seed are fidelity's.", kind="file")


# ---- one quantize run: one config type per method --------------------------------------------------


class _BuiltByMethod(type):
    """`QuantizeConfig(method, **options)` builds the method's own config type (`config_for`); a
    method's type is called as any dataclass."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is QuantizeConfig:
            return config_for(*args, **kwargs)
        return super().__call__(*args, **kwargs)


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig(CommonOptions, metaclass=_BuiltByMethod):
    """One quantize run: a method's own config type (a subclass: `METHOD_CONFIGS`), its `method` a
    class constant, every option keyword-only. Every method reads `CommonOptions` and
    `FidelityOptions`; the rest are the method's (static `StaticInt8Options`, int4 `BlockOptions` and
    `Int4Options`, auto `BlockOptions` and `AutoOptions`, static and dynamic `FallbackOptions`).
    `calibration` feeds static, auto, int4 gptq/k_quant and an int8 `kv_cache`. A closed option set
    given as its spelling becomes its Choice member here; any other spelling is a one-line BadInput.
    """

    method: ClassVar[QuantizeMethod]

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", tuple(self.exclude))  # a list from Python callers
        parse_declared_choices(self)

    @property
    def components(self) -> list[str]:
        """The graphs quantized: the GPT, and the code head unless --no-head."""
        return [GPT] + ([HEAD_CODE] if self.quantize_head else [])

    @property
    def targets(self) -> Targets:
        """The fallback's fidelity targets: none, unless the method reads `FallbackOptions` (which overrides this)."""
        return Targets()

    @property
    def fidelity_settings(self) -> FidelitySettings:
        """How fidelity (and the FP32 runs it replays) is measured for this run (every method's
        config holds `FidelityOptions`)."""
        fid: Any = self
        return FidelitySettings(max_sentences=fid.fidelity_sentences, max_new_token=fid.fidelity_steps,
                                seed=self.seed, threads=self.threads, progress=self.progress)


# The bases' order makes the fields' (and so a step command's) order, the union's order restricted
# to the method's groups: common, static, block, int4, fallback, fidelity, auto (dataclass fields
# follow the reversed MRO).
@dataclass(frozen=True, kw_only=True)
class DynamicInt8Config(FidelityOptions, FallbackOptions, QuantizeConfig):
    """--method dynamic (and its int8 KV cache variant): the common options, fallback and fidelity."""

    method: ClassVar[QuantizeMethod] = QuantizeMethod.DYNAMIC


@dataclass(frozen=True, kw_only=True)
class StaticInt8Config(FidelityOptions, FallbackOptions, StaticInt8Options, QuantizeConfig):
    """--method static (minmax/percentile ranges, or onnxruntime's own quantize_static): its
    activation and SmoothQuant options, fallback and fidelity."""

    method: ClassVar[QuantizeMethod] = QuantizeMethod.STATIC


@dataclass(frozen=True, kw_only=True)
class Int4Config(FidelityOptions, Int4Options, BlockOptions, QuantizeConfig):
    """--method int4 (and its int8 KV cache variant): the block settings, the algorithm and fidelity."""

    method: ClassVar[QuantizeMethod] = QuantizeMethod.INT4


@dataclass(frozen=True, kw_only=True)
class AutoConfig(AutoOptions, FidelityOptions, BlockOptions, QuantizeConfig):
    """--method auto: the block settings of its INT4 MatMuls (rtn: no --algorithm), the gate and fidelity."""

    method: ClassVar[QuantizeMethod] = QuantizeMethod.AUTO


METHOD_CONFIGS: dict[str, type[QuantizeConfig]] = {
    c.method.value: c for c in (DynamicInt8Config, StaticInt8Config, Int4Config, AutoConfig)
}
assert tuple(METHOD_CONFIGS) == QUANTIZE_METHODS, "one config type per method of the artifact contract"


@dataclass(frozen=True, kw_only=True)
class QuantizeCommandOptions(AutoOptions, FidelityOptions, FallbackOptions, Int4Options, BlockOptions,
                             StaticInt8Options, CommonOptions):
    """`chattts-forge quantize`'s options: the union of every method's (the command line takes them
    all; `config_for` refuses those the chosen method does not read). Not a config: nothing runs it."""


def fields_read_by(method: str) -> frozenset[str]:
    """The option fields `method`'s own config type holds (a `QuantizeMethod` spelling or member)."""
    return frozenset(f.name for f in fields(METHOD_CONFIGS[QuantizeMethod.parse(method, "method")]))


def options_read_by(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """Those of `options` (field -> value) that `method`'s config reads, in their order: a preset's
    options shared by several methods, each given only its own."""
    held = fields_read_by(method)
    return {name: value for name, value in options.items() if name in held}


def config_for(method: str, **options: Any) -> QuantizeConfig:
    """The config of `method` (a `QuantizeMethod` spelling) with `options`, of the method's own type.
    The one rule for an option of another method: a BadInput naming it, the method and the methods
    that read it. A name no method reads is Python's TypeError, as for any dataclass."""
    method = QuantizeMethod.parse(method, "method")  # the method is named first, as the registry names it
    read_by = {m: fields_read_by(m) for m in METHOD_CONFIGS}
    refuse_options_not_read(QuantizeCommandOptions, options, read_by, method, f"--method {method}")
    return METHOD_CONFIGS[method](**options)


def _record_keys(group: type) -> dict[str, str]:
    return {f.name: f.metadata[RECORD] for f in fields(group) if RECORD in f.metadata}


def recorded_options(config: QuantizeConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """`quantization.options`: the fields with a record key of `config` (those of the groups its
    method reads), the method's `resolved` value where it has one (e.g. the algorithm it chose), else
    the config's, Choice members as their spellings; the static, block and INT4 options of a method
    that does not read them are null."""
    out: dict[str, Any] = {key: None for g in (StaticInt8Options, BlockOptions, Int4Options)
                           for key in _record_keys(g).values()}
    for name, key in _record_keys(type(config)).items():
        value = resolved[name] if name in resolved else getattr(config, name)
        out[key] = list(value) if isinstance(value, tuple) else plain(value)
    return out
