"""Timing: the one place where chattts-forge measures speed and memory.

The evaluate stage's latency metrics (the gate), `chattts-forge bench` and the quantize stage's
step timings (`quantize.stepbench`, the fallback's price per step) all measure through this module,
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
- peak RSS: the kernel's high-water mark of the process's resident memory (getrusage `ru_maxrss`;
  per phase, `/proc/self/status` VmHWM reset at the phase's start, see `RssSampler`).

Engines (same `run(texts, request)` / `first_audio(text, request)` interface, same spans):
`OnnxEngine` (the torch-free runtime) and `TorchEngine` (ChatTTS's own PyTorch code through
`chattts_forge.torch_ref`; torch is imported when one is built, never by importing this module).
"""

from __future__ import annotations

import math
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger, quiet_logger

log = get_logger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")

# ChatTTS's Decoder/DVAE turn T codes into 2T mel frames (docs/artifact-format.md), each `hop` samples.
MEL_FRAMES_PER_CODE = 2
# Decode steps whose context is at most this many positions are also reported apart (gpt_step_ms_ctx400).
CONTEXT_LIMIT = 400


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


class _TimedGpt:
    """Wraps the runtime's GPT step object (plain or fast) and times every call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int, float]] = []  # (new positions, context, seconds)

    def reset(self, batch: int) -> None:
        self.inner.reset(batch)

    @property
    def past_length(self) -> int:
        return self.inner.past_length

    def __call__(self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.inner(inputs_embeds, attention_mask, position_ids)
        self.calls.append((inputs_embeds.shape[1], attention_mask.shape[1], time.perf_counter() - t0))
        return out


# ------------------------------------------------------------------------------------------------
# The ONNX engine (chattts_forge.runtime)
# ------------------------------------------------------------------------------------------------


class OnnxEngine:
    """The artifact's runtime (`Pipeline`) with its GPT step timed. `engine`: the runtime's GPT
    engine choice (auto | fast | plain, see `runtime.pipeline.ENGINES`); `stream_lookahead`: mel
    frames of right context the stream waits for (None: the exact stream)."""

    name = "onnx"

    def __init__(
        self,
        artifact: str | os.PathLike[str],
        threads: int | None,
        engine: str = "auto",
        stream_lookahead: int | None = None,
        provider: str = "cpu",
    ) -> None:
        from chattts_forge.runtime import Pipeline

        t0 = time.perf_counter()
        self.pipe = Pipeline(artifact, provider=provider, threads=threads, engine=engine)
        self.timed = _TimedGpt(self.pipe.gpt)  # opens the GPT session: part of loading
        self.pipe.gpt = self.timed
        self.load_seconds = time.perf_counter() - t0
        self.gpt_engine = self.pipe.engine
        self.stream_lookahead = stream_lookahead
        self.sample_rate = self.pipe.sample_rate
        self.hop_length = self.pipe.hop

    @property
    def gpt_step(self) -> Any:
        """The runtime's own (untimed) GPT step object."""
        return self.timed.inner

    def _params(self, request: Request) -> Any:
        from chattts_forge.runtime import InferCodeParams, SynthParams

        spk = None if request.speaker_seed is None else self.pipe.random_speaker(request.speaker_seed)
        return SynthParams(code=InferCodeParams(
            spk_emb=spk, max_new_token=request.max_new_token, min_new_token=request.min_new_token,
            seed=request.seed, stream_batch=request.stream_batch,
        ))

    def run(self, texts: Sequence[str], request: Request, keep_audio: bool = False) -> RunFigures:
        """Time `synthesize`'s path (normalise, code stage, Decoder + Vocos) on one batch."""
        params = self._params(request)
        # With EOS masked every row hits max_new_token on purpose: the runtime's warning is noise.
        with quiet_logger("chattts_forge.runtime.pipeline", enabled=request.eos_masked):
            return self._run(list(texts), params, keep_audio)

    def _run(self, texts: list[str], params: Any, keep_audio: bool) -> RunFigures:
        fig = RunFigures(self.sample_rate, self.hop_length)
        self.timed.calls.clear()
        t0 = time.perf_counter()
        norm, _ = self.pipe.prepare_texts(texts, params)
        t_code = time.perf_counter()
        state = None
        last = None
        for step_state in self.pipe.iter_infer_code(norm, params.code):
            now = time.perf_counter()
            if last is not None:
                fig.full_step_ms.append((now - last) * 1e3)
            last, state = now, step_state
        if state is None:
            raise ForgeError("the runtime produced no generation step")
        gen = state.result()
        t_dec = time.perf_counter()
        wavs = self.pipe.decode(gen.hiddens, True)
        t_end = time.perf_counter()
        fig.code_stage_s = t_dec - t_code
        fig.e2e_s = t_end - t0
        fig.steps = int(state.steps)
        fig.row_codes = [len(ids) for ids in gen.ids]
        fig.add_gpt_calls(self.timed.calls)
        if any(len(w) == 0 for w in wavs):
            raise ForgeError("the runtime produced an empty waveform")
        if keep_audio:
            fig.wavs = [np.asarray(w, dtype=np.float32) for w in wavs]
        return fig

    def first_audio(self, text: str, request: Request) -> float:
        params = self._params(request)
        with quiet_logger("chattts_forge.runtime.pipeline", enabled=request.eos_masked):
            start = time.perf_counter()
            chunks = self.pipe.stream([text], params, lookahead_frames=self.stream_lookahead)
            return first_audio_seconds(chunks, lambda chunk: len(chunk[0]) > 0, start)


def decode_step_call(step: Any, hidden_size: int, past: int, batch: int = 1, seed: int = 0) -> Callable[[], object]:
    """One decode step (S = 1) of a plain GPT step object (`session.GptStep`) at a fixed past of
    `past` positions, repeatable: the cache is put back before every call. The values are random
    (seeded): a step's latency does not depend on them."""
    rng = np.random.default_rng(seed)
    step.reset(batch)
    shape = (batch, step.kv_heads, past, step.head_dim)
    cache = [rng.standard_normal(shape, dtype=np.float32) for _ in step.past]
    emb = rng.standard_normal((batch, 1, hidden_size), dtype=np.float32)
    mask = np.ones((batch, past + 1), dtype=np.int64)
    pos = np.full((batch, 1), past, dtype=np.int64)

    def call() -> object:
        step.past = cache
        return step(emb, mask, pos)

    return call


# ------------------------------------------------------------------------------------------------
# The PyTorch baseline (ChatTTS's own code)
# ------------------------------------------------------------------------------------------------


class TorchEngine:
    """ChatTTS's PyTorch FP32 pipeline on a checkpoint, the same spans as `OnnxEngine`: ChatTTS's
    normalizer, `Chat._infer_code` (timed GPT forwards via hooks on its LlamaModel) and
    `Chat._decode_to_wavs`, i.e. `Chat.infer` without refinement or sentence splitting. `chat`: an
    already loaded `Chat` of that checkpoint (left as it was after `close()`)."""

    name = "pytorch"

    def __init__(
        self, checkpoint: str | os.PathLike[str] | None, threads: int | None, chat: Any = None, device: str = "cpu"
    ) -> None:
        try:
            import torch

            from chattts_forge.torch_ref.chat import load_chat
        except ImportError as e:  # pragma: no cover - export extra missing
            raise ForgeError(f"the PyTorch baseline needs the export extra ({e}): pip install -e '.[export]'") from None

        if threads:
            torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process
            pass
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ForgeError(f"the PyTorch baseline on {device}: CUDA is not available to torch here")
        self.torch = torch
        # CUDA kernels run asynchronously: the hooks synchronize so a timed forward is its own work.
        self._sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.device = device
        t0 = time.perf_counter()
        self.chat = chat if chat is not None else load_chat(checkpoint, device=device)
        self.load_seconds = time.perf_counter() - t0
        extractor = self.chat.config.vocos.feature_extractor.init_args
        self.sample_rate = int(extractor.sample_rate)
        self.hop_length = int(extractor.hop_length)
        self.calls: list[tuple[int, int, float, float]] = []  # (new, context, start, seconds)
        llama = self.chat.gpt.gpt
        self._t0 = 0.0

        def pre(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            self._sync()
            self._t0 = time.perf_counter()

        def post(module: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
            self._sync()
            emb = kwargs.get("inputs_embeds")
            mask = kwargs.get("attention_mask")
            new = int(emb.shape[1]) if emb is not None else 1
            ctx = int(mask.shape[1]) if mask is not None else new
            self.calls.append((new, ctx, self._t0, time.perf_counter() - self._t0))

        self._hooks = [
            llama.register_forward_pre_hook(pre, with_kwargs=True),
            llama.register_forward_hook(post, with_kwargs=True),
        ]

    def close(self) -> None:
        """Remove the timing hooks (the Chat may be shared with the caller)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _params(self, request: Request) -> Any:
        from ChatTTS.core import Chat

        from chattts_forge.torch_ref.reference import sample_speaker

        spk = None if request.speaker_seed is None else sample_speaker(self.chat, request.speaker_seed)
        return Chat.InferCodeParams(
            spk_emb=spk, max_new_token=request.max_new_token, min_new_token=request.min_new_token,
            manual_seed=request.seed, stream_batch=request.stream_batch, show_tqdm=False,
        )

    def run(self, texts: Sequence[str], request: Request, keep_audio: bool = False) -> RunFigures:
        from chattts_forge.torch_ref.chat import quiet_chattts

        chat = self.chat
        params = self._params(request)
        fig = RunFigures(self.sample_rate, self.hop_length)
        self.calls.clear()
        with quiet_chattts(), self.torch.inference_mode():
            t0 = time.perf_counter()
            norm = [chat.normalizer(t, True, True, None) for t in texts]
            t_code = time.perf_counter()
            result = next(chat._infer_code(norm, False, chat.device, True, params))
            t_dec = time.perf_counter()
            row_codes = [int(ids.shape[0]) for ids in result.ids]  # _decode_to_wavs frees the rows
            wavs = chat._decode_to_wavs(result.hiddens, True)
            t_end = time.perf_counter()
        fig.code_stage_s = t_dec - t_code
        fig.e2e_s = t_end - t0
        fig.steps = row_codes[0] if row_codes else 0
        fig.row_codes = row_codes
        starts = [c[2] for c in self.calls]
        fig.full_step_ms = [(b - a) * 1e3 for a, b in zip(starts[1:], starts[2:], strict=False)]
        fig.add_gpt_calls((n, c, dt) for n, c, _, dt in self.calls)
        wav_rows = np.asarray(wavs, dtype=np.float32).reshape(len(row_codes), -1) if row_codes else np.zeros((0, 0))
        if wav_rows.size == 0:
            raise ForgeError("ChatTTS produced no waveform")
        if keep_audio:  # ChatTTS pads a batch to its longest row: cut each row to its own codes
            fig.wavs = [row[: max(MEL_FRAMES_PER_CODE * c - 1, 0) * self.hop_length] for row, c in
                        zip(wav_rows, row_codes, strict=True)]
        return fig

    def first_audio(self, text: str, request: Request) -> float:
        from chattts_forge.torch_ref.chat import quiet_chattts

        params = self._params(request)
        with quiet_chattts():
            start = time.perf_counter()
            chunks = self.chat.infer(text, stream=True, skip_refine_text=True, split_text=False,
                                     params_infer_code=params)
            # ChatTTS's stream yields zero-filled chunks before its first real audio
            return first_audio_seconds(chunks, lambda c: bool(np.asarray(c).size and np.abs(c).max() > 0), start)


# ------------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------------


def current_rss_bytes() -> int:
    """This process's resident memory now."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (getrusage ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if platform.system() == "Darwin" else int(peak) * 1024


class RssSampler:
    """Peak resident memory of this process per phase.

    On Linux the kernel's own high-water mark is used: writing "5" to /proc/self/clear_refs resets
    VmHWM to the current RSS at the start of a phase, and VmHWM is read at its end - exact, and with
    no sampling thread to steal a core (or the GIL) from the timed engines. Elsewhere a thread samples
    RSS every `interval` s. The resets lower getrusage's ru_maxrss too, so `process_peak` keeps the
    process's peak.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.phase: str | None = None
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.process_peak = peak_rss_bytes()  # before any reset: the peak of the process so far
        self.kernel_hwm = self._reset_hwm()
        self.method = "kernel VmHWM (reset per phase)" if self.kernel_hwm else f"sampled every {interval * 1e3:g} ms"

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return RssSampler._hwm() is not None
        except OSError:
            return False

    @staticmethod
    def _hwm() -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def rss(self) -> int:
        return current_rss_bytes()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.note()

    def note(self) -> None:
        if self.phase is not None:
            r = (self._hwm() or 0) if self.kernel_hwm else self.rss()
            r = max(r, self.rss())
            if r > self.peaks.get(self.phase, 0):
                self.peaks[self.phase] = r
            self.process_peak = max(self.process_peak, r)

    def peak_process(self) -> int:
        """The process's peak RSS so far (getrusage once no reset has lowered it)."""
        return self.process_peak if self.kernel_hwm else max(self.process_peak, peak_rss_bytes())

    def __enter__(self) -> RssSampler:
        if not self.kernel_hwm:
            self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        prev, self.phase = self.phase, phase
        if self.kernel_hwm:
            self._reset_hwm()
        self.note()
        try:
            yield
        finally:
            self.note()
            self.phase = prev


_RSS_PROBE = """
import json, sys
from chattts_forge.runtime.timing import OnnxEngine, Request, current_rss_bytes, peak_rss_bytes
art, text, threads, steps, provider = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
base = current_rss_bytes()
engine = OnnxEngine(art, threads or None, provider=provider)
loaded = current_rss_bytes()
engine.run([text], Request(max_new_token=steps, speaker_seed=0))
peak = peak_rss_bytes()
print(json.dumps({"python_baseline_mb": base / 2**20, "after_load_mb": loaded / 2**20, "peak_rss_mb": peak / 2**20}))
"""


def measure_memory(artifact_dir: str | os.PathLike[str], text: str, threads: int | None = 2,
                   max_new_token: int = 24, provider: str = "cpu") -> dict[str, Any]:
    """Peak RSS (host memory) of a fresh process that loads the artifact and synthesizes `text` once.

    In-process figures are confounded by whatever ran before (allocators keep freed memory), so each
    artifact gets its own short-lived interpreter; the result is what a server would need.
    """
    import json

    env = {**os.environ, "OMP_NUM_THREADS": str(threads or 1)}
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(artifact_dir), text, str(threads or 0), str(max_new_token), provider],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if proc.returncode != 0:
        log.warning("memory probe failed for %s: %s", artifact_dir, proc.stderr.strip().splitlines()[-1:])
        return {"peak_rss_mb": None, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["method"] = f"fresh process: load + one synthesis of {max_new_token} steps, getrusage ru_maxrss"
    return out


# ------------------------------------------------------------------------------------------------
# The machine
# ------------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; the platform's processor elsewhere)."""
    return _cpu_model()


def machine_info(threads: int | None, provider: str = "cpu") -> dict[str, Any]:
    """Where a measurement ran: CPU, cores, memory, threads, the onnxruntime provider the runtime used
    (`cpu` or `cuda`, resolved) and those available, platform, load, library versions and the
    toolchain's commit."""
    import onnxruntime as ort
    import psutil

    from chattts_forge.runtime.providers import EXECUTION_PROVIDERS
    from chattts_forge.versions import library_versions, toolchain_info

    return {
        "cpu_model": _cpu_model(),
        "processor": platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "cpu_count": os.cpu_count(),  # = logical_cores (bench's name for it)
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "threads": threads,
        "provider": EXECUTION_PROVIDERS[provider],
        "available_providers": ort.get_available_providers(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "versions": library_versions(),
        "toolchain": toolchain_info(),
    }
