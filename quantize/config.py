"""What `quantize_artifact` is asked to do: `QuantizeConfig` (the CLI's options, one field each) and
the fidelity settings and fallback targets derived from it.

Library::

    from chattts_forge.quantize import QuantizeConfig, quantize_artifact
    quantize_artifact("artifacts/fp32", "artifacts/int4",
                      QuantizeConfig("int4", calibration="build/calib", algorithm="gptq", block_size=32))

Light on purpose (no onnx, no onnxruntime): the driver and the CLI import it and the method registry
(`methods.py`) without loading the quantizers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from chattts_forge.artifact import GPT, HEAD_CODE
from chattts_forge.errors import ForgeError


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
                raise ForgeError(f"--{name} must lie in [0, 1], got {value}")

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
    targets: Targets = field(default_factory=Targets)
    step_nodes: int | None = None
    fp32_runs: str | os.PathLike[str] | None = None


@dataclass(frozen=True)
class QuantizeConfig:
    """One quantize run: the method (a name of the registry, `methods.METHODS`) and its options.

    Which options a method reads is the method's business (`methods.py`): static reads the
    activation settings, int4 the block settings and `algorithm`, auto the block settings and
    `gate`; `calibration` feeds static, auto, int4 gptq/k_quant and an int8 `kv_cache`.
    `per_channel=None` takes the method's default. `decoder` and `kv_cache` apply to every method
    whose graphs allow them.
    """

    method: str
    calibration: str | os.PathLike[str] | None = None
    per_channel: bool | None = None
    calibrate_method: str = "minmax"
    symmetric_activations: bool = False
    activation_type: str = "uint8"
    smooth_alpha: float | None = None  # static: SmoothQuant's alpha (quantize/smooth.py), None: the default
    smooth: bool = True  # static: the SmoothQuant migration at all
    percentile: float | None = None  # static --calibrate-method percentile: the |x| percentile (default 99.99)
    weight_bits: int = 7  # static: 7 (+-63: exact on every x86 CPU) or 8 (exact with VNNI/AMX only)
    exclude: tuple[str, ...] = ()
    block_size: int = 128
    accuracy_level: int = 4
    algorithm: str | None = None
    gate: str | os.PathLike[str] | None = None
    quantize_head: bool = True
    kv_cache: str = "fp32"  # the fused GPT's KV cache: fp32 or int8 (calibrated scales)
    decoder: str = "int8"  # the Decoder's MatMuls: weight-only int8 (quantize/decoder.py) or fp32
    seed: int = 0
    threads: int | None = None
    progress: bool | None = None
    # fidelity against the FP32 source, and the accuracy-driven fallback's targets
    fidelity: bool = True
    fidelity_corpus: str = "builtin:evaluation"
    fidelity_sentences: int = 8
    fidelity_steps: int = 48
    fp32_runs: str | os.PathLike[str] | None = None  # a trajectories.npz recorded once (fidelity.read_fp32_runs)
    min_agreement: float | None = None
    min_cosine: float | None = None
    max_kl: float | None = None
    step_nodes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", tuple(self.exclude))  # a list from Python callers

    @property
    def components(self) -> list[str]:
        """The graphs quantized: the GPT, and the code head unless --no-head."""
        return [GPT] + ([HEAD_CODE] if self.quantize_head else [])

    @property
    def targets(self) -> Targets:
        return Targets(self.min_agreement, self.min_cosine, self.max_kl)

    @property
    def fidelity_config(self) -> FidelityConfig:
        return FidelityConfig(enabled=self.fidelity, corpus=self.fidelity_corpus, sentences=self.fidelity_sentences,
                              steps=self.fidelity_steps, seed=self.seed, threads=self.threads, progress=self.progress,
                              fp32_runs=self.fp32_runs,
                              targets=self.targets, step_nodes=self.step_nodes)
