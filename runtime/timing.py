"""Timing: the definitions of chattts-forge's speed and memory figures and their statistics.

The evaluate stage's latency metrics (the gate), `chattts-forge bench` and the quantize stage's
step timings (`quantize.stepbench`, the fallback's price per step) all count through this module,
so a figure with the same name means the same measurement everywhere. Definitions (docs/bench.md,
"Definitions"):

- audio seconds of a row: the codes the engine generated for it (EOS excluded) times the audio one
  code encodes, `codes * MEL_FRAMES_PER_CODE * hop_length / sample_rate` (1/46.875 s at 24 kHz,
  hop 256). Counted from codes, not from waveform samples: Vocos returns one hop less than the mel
  frames span, and ChatTTS pads a batch to its longest row and trims near-silent samples, so sample
  counts are not the same quantity in both engines.
- RTF = compute seconds / audio seconds (< 1: faster than real time), with two compute spans:
  end-to-end (`e2e_s`: normalisation + code stage + Decoder + Vocos, what `synthesize` does) and
  code stage (`code_stage_s`: prompt, prefill and every generation step). A batch is as long as its
  longest row.
- first audio: seconds from the call to the first streamed chunk holding at least one sample.
- streams: the audio seconds of all rows of a batch per wall second (concurrent real-time streams);
  its inverse is the aggregate RTF.
- peak RSS: the kernel's high-water mark of the process's resident memory (`/proc/self/status`
  VmHWM on Linux, else getrusage `ru_maxrss`; per phase, VmHWM reset at the phase's start, see
  `memory_probe.RssSampler`). A variant's memory is measured in a process of its own
  (`memory_probe.measure_memory`): load + synthesis of `BENCH_TEXT` at `BENCH_STEPS` steps a row.

Where the rest of the measuring lives: the timed engines, same `run(texts, request)` /
`first_audio(text, request)` interface and spans: `runtime.timed_engine.OnnxEngine` (the torch-free
runtime) and `torch_ref.engine.TorchEngine` (ChatTTS's own PyTorch code; the torch side);
`runtime.memory_probe` (per-phase peak RSS, a fresh-process probe); `runtime.machine` (where a
measurement ran).
"""

from __future__ import annotations

import math
import platform
import resource
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

Clock = Callable[[], float]
CLOCK: Clock = time.perf_counter  # the one clock every harness times with (tests pass a fake one)
T = TypeVar("T")

# ChatTTS's Decoder/DVAE turn T codes into 2T mel frames (docs/artifact-format.md), each `hop` samples.
MEL_FRAMES_PER_CODE = 2
# Decode steps whose context is at most this many positions are also reported apart (gpt_step_ms_ctx400).
CONTEXT_LIMIT = 400
# `bench`'s default workload, which a variant's memory figures are measured on too (memory_probe), so
# that `chattts-forge bench --artifact DIR --batch 1` and the report agree: 9 s of audio at 24 kHz, hop 256.
BENCH_STEPS = 422
BENCH_TEXT = "你好，欢迎使用语音合成服务。今天天气很好，我们一起去公园散步吧。"


# ------------------------------------------------------------------------------------------------
# Definitions
# ------------------------------------------------------------------------------------------------


def audio_seconds(codes: int, sample_rate: int, hop_length: int) -> float:
    """Seconds of audio that `codes` generated codes encode."""
    return codes * MEL_FRAMES_PER_CODE * hop_length / sample_rate


def codes_per_audio_second(sample_rate: int, hop_length: int) -> float:
    """Generated codes per second of audio (46.875 at 24 kHz, hop 256)."""
    return sample_rate / (MEL_FRAMES_PER_CODE * hop_length)


def rtf(compute_seconds: float, audio_s: float) -> float | None:
    """Real-time factor: compute seconds per audio second (None without audio)."""
    return compute_seconds / audio_s if audio_s else None


def per_second(amount: float, seconds: float) -> float | None:
    """`amount` per wall second (streams: audio seconds per second; steps/s: steps per second)."""
    return amount / seconds if seconds else None


def first_audio_seconds(
    chunks: Iterable[T], has_audio: Callable[[T], bool], start: float, clock: Clock = time.perf_counter
) -> float:
    """Seconds from `start` (taken before the streaming call) to the first chunk with audio; NaN if
    none comes. The stream is closed after that chunk (nothing more is generated)."""
    try:
        for chunk in chunks:
            if has_audio(chunk):
                return clock() - start
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return float("nan")


# ------------------------------------------------------------------------------------------------
# Statistics and timed calls
# ------------------------------------------------------------------------------------------------


def _measured(values: Iterable[float | None]) -> np.ndarray:
    """The values that were measured (None and NaN mean "not measured")."""
    return np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)


def quantiles(values: Iterable[float | None], percents: Sequence[float]) -> list[float] | None:
    """The given percentiles (0-100, linear interpolation) of the measured values; None if none was."""
    v = _measured(values)
    return [float(q) for q in np.percentile(v, percents)] if v.size else None


def spread(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """Median, p10, p90, min and count of a sample (None figures for an empty sample)."""
    v = _measured(values)
    if v.size == 0:
        return {"median": None, "p10": None, "p90": None, "min": None, "n": 0}
    p10, p50, p90 = quantiles(v, [10, 50, 90]) or []
    return {"median": float(p50), "p10": float(p10), "p90": float(p90), "min": float(v.min()), "n": int(v.size)}


def median(values: Iterable[float | None]) -> float | None:
    """The median of the measured values (None when nothing was measured)."""
    arr = _measured(values)
    return float(np.median(arr)) if arr.size else None


def percentiles(values: Iterable[float | None]) -> dict[str, float | None]:
    """p50, p95, p99, mean, min and max of a sample (None figures for an empty sample)."""
    v = _measured(values)
    if v.size == 0:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "min": None, "max": None}
    p50, p95, p99 = quantiles(v, [50, 95, 99]) or []
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(v.mean()),
            "min": float(v.min()), "max": float(v.max())}


def time_interleaved(
    calls: Sequence[Callable[[], object]], runs: int, warmup: int = 0, clock: Clock = time.perf_counter
) -> list[list[float]]:
    """Seconds of each of `runs` calls of every callable, called round by round (a, b, a, b, ...)
    so that background load on a shared machine hits all of them alike; `warmup` untimed rounds first."""
    for _ in range(warmup):
        for call in calls:
            call()
    out: list[list[float]] = [[] for _ in calls]
    for _ in range(runs):
        for times, call in zip(out, calls, strict=True):
            t0 = clock()
            call()
            times.append(clock() - t0)
    return out


def time_calls(call: Callable[[], object], runs: int, warmup: int = 0, clock: Clock = time.perf_counter) -> list[float]:
    """Seconds of each of `runs` calls of `call`, after `warmup` untimed ones."""
    return time_interleaved([call], runs, warmup, clock)[0]


# ------------------------------------------------------------------------------------------------
# One timed synthesis
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What one timed synthesis asks of an engine; both engines read it the same way."""

    max_new_token: int
    min_new_token: int = 0  # = max_new_token: EOS masked, every row generates exactly that many codes
    seed: int = 0  # sampling seed (the runtime's `seed`, ChatTTS's `manual_seed`)
    speaker_seed: int | None = None  # None: no speaker (ChatTTS's default); else a random speaker of this seed
    stream_batch: int = 24  # steps between streamed chunks

    @classmethod
    def fixed_steps(cls, steps: int, seed: int = 0) -> Request:
        """Exactly `steps` codes per row (EOS masked): every engine does the same work."""
        return cls(max_new_token=steps, min_new_token=steps, seed=seed)

    @property
    def eos_masked(self) -> bool:
        return self.min_new_token >= self.max_new_token


@dataclass
class RunFigures:
    """One timed synthesis of one engine on a batch of texts (one row per text)."""

    sample_rate: int
    hop_length: int
    gpt_step_ms: list[float] = field(default_factory=list)  # every decode step: one GPT forward alone
    gpt_step_ms_ctx400: list[float] = field(default_factory=list)  # the decode steps with context <= 400
    full_step_ms: list[float] = field(default_factory=list)  # between two generation steps
    prefill_ms: float | None = None  # the prompt's GPT forward
    code_stage_s: float = 0.0
    e2e_s: float = 0.0
    steps: int = 0  # generation steps of the batch
    row_codes: list[int] = field(default_factory=list)  # codes generated per row (EOS excluded)
    wavs: list[np.ndarray] | None = None  # per row, when the caller keeps the audio

    @property
    def row_audio_s(self) -> list[float]:
        return [audio_seconds(c, self.sample_rate, self.hop_length) for c in self.row_codes]

    @property
    def audio_s(self) -> float:
        """Audio seconds of the batch: its longest row (the batch is done when that row is)."""
        return max(self.row_audio_s, default=0.0)

    @property
    def total_audio_s(self) -> float:
        return sum(self.row_audio_s)

    @property
    def e2e_rtf(self) -> float | None:
        return rtf(self.e2e_s, self.audio_s)

    @property
    def code_rtf(self) -> float | None:
        return rtf(self.code_stage_s, self.audio_s)

    @property
    def streams(self) -> float | None:
        return per_second(self.total_audio_s, self.e2e_s)

    @property
    def code_streams(self) -> float | None:
        return per_second(self.total_audio_s, self.code_stage_s)

    @property
    def aggregate_rtf(self) -> float | None:
        """Wall seconds per second of audio of all rows together (1 / streams)."""
        return rtf(self.e2e_s, self.total_audio_s)

    def add_gpt_calls(self, calls: Iterable[tuple[int, int, float]]) -> None:
        """Sort timed GPT forwards (new positions, context, seconds) into prefill and decode steps."""
        for new, ctx, seconds in calls:
            ms = seconds * 1e3
            if new > 1:
                self.prefill_ms = ms if self.prefill_ms is None else self.prefill_ms + ms
            else:
                self.gpt_step_ms.append(ms)
                if ctx <= CONTEXT_LIMIT:
                    self.gpt_step_ms_ctx400.append(ms)


# ------------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------------


def current_rss_bytes() -> int:
    """This process's resident memory now."""
    # psutil: only when memory is read; 11 ms to import
    import psutil

    return int(psutil.Process().memory_info().rss)


def hwm_bytes() -> int | None:
    """The kernel's high-water mark of this process's own memory map (Linux `/proc/self/status` VmHWM;
    None elsewhere). It starts afresh at exec, and writing "5" to /proc/self/clear_refs resets it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident memory: VmHWM where the kernel gives it, else getrusage ru_maxrss
    (KiB on Linux, bytes on macOS). Not ru_maxrss on Linux: exec keeps the larger of the old and the
    new map's peak, so a child started from a large process (fork or vfork, then exec) reports its
    parent's memory as its own: exec keeps the old map's high-water mark, and a child's old map is its
    parent's (vfork) or a copy of it (fork). Issue 50: every variant of a build reported the peak of
    the latency process that started its probe."""
    hwm = hwm_bytes()
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if platform.system() == "Darwin" else int(peak) * 1024
