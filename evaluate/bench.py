"""`bench`: the artifact's runtime against ChatTTS's own PyTorch FP32 pipeline, in one process.

Both engines synthesize the same text with the same number of GPT steps (EOS masked with
`min_new_token = max_new_token = steps`, so every row has exactly `steps` codes), after a warm-up,
for several repetitions, interleaved (onnx, pytorch, onnx, pytorch, ...) so that the load of a
shared machine hits both alike. Every figure is a median with its p10/p90 spread, and every ONNX
figure also appears as a ratio to the PyTorch figure of the same run. JSON keys: docs/bench.md.

What is timed (per engine, per batch size):
- `gpt_step_ms`: one decode forward of the GPT alone (ONNX: the runtime's GPT step incl. its
  cache handling; PyTorch: `LlamaModel.forward` via hooks), at every context; `gpt_step_ms_ctx400`
  only the steps whose context is <= 400 positions;
- `full_step_ms`: one whole generation step: embedding, GPT, code heads, logits processing and
  sampling (ONNX: between two steps of the runtime's loop; PyTorch: between two GPT calls of
  ChatTTS's `GPT.generate`);
- `code_stage_s` / `code_rtf`: the code stage (prompt, prefill, `steps` steps) per audio second of
  one row, `steps / 46.875` s (9 s for the default 422 steps);
- `e2e_s` / `e2e_rtf`: normalisation + code stage + Decoder + Vocos (ChatTTS `_infer` without
  refinement; the runtime's `synthesize` path);
- `streams`: rows * audio seconds / e2e seconds - concurrent real-time streams at that batch;
- `first_audio_s` (batch 1): from the call to the first non-empty audio chunk when streaming,
  each engine with its own default streaming schedule.

Library use::

    from chattts_forge.evaluate.bench import run_bench
    report = run_bench("artifacts/int4", baseline="pytorch", checkpoint="ckpt/", batches=(1, 8),
                       steps=422, threads=2, reps=3, json_out="bench.json")

torch is imported only when the PyTorch baseline is asked for.
"""

from __future__ import annotations

import gc
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.latency import peak_rss_bytes
from chattts_forge.log import get_logger, quiet_logger

log = get_logger(__name__)

SCHEMA = "chattts-forge/bench/1"
STEPS_PER_AUDIO_SECOND = 46.875  # 24000 Hz / 256 hop / 2 mel frames per code step
DEFAULT_STEPS = 422  # 9 s of audio
DEFAULT_TEXT = "你好，欢迎使用语音合成服务。今天天气很好，我们一起去公园散步吧。"
CONTEXT_LIMIT = 400


# ------------------------------------------------------------------------------------------------
# Measurement helpers
# ------------------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, p10, p90, min and count of a sample (None figures for an empty sample)."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return {"median": None, "p10": None, "p90": None, "min": None, "n": 0}
    return {
        "median": float(np.median(v)),
        "p10": float(np.percentile(v, 10)),
        "p90": float(np.percentile(v, 90)),
        "min": float(v.min()),
        "n": int(v.size),
    }


class RssSampler:
    """Peak resident memory of this process per phase.

    On Linux the kernel's own high-water mark is used: writing "5" to /proc/self/clear_refs resets
    VmHWM to the current RSS at the start of a phase, and VmHWM is read at its end - exact, and with
    no sampling thread to steal a core (or the GIL) from the timed engines. Elsewhere a thread samples
    RSS every `interval` s.
    """

    def __init__(self, interval: float = 0.02) -> None:
        import psutil

        self._proc = psutil.Process()
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
        return int(self._proc.memory_info().rss)

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


@dataclass
class RunFigures:
    """One timed synthesis of one engine at one batch size."""

    gpt_step_ms: list[float] = field(default_factory=list)
    gpt_step_ms_ctx400: list[float] = field(default_factory=list)
    full_step_ms: list[float] = field(default_factory=list)
    prefill_ms: float | None = None
    code_stage_s: float = 0.0
    e2e_s: float = 0.0
    steps: int = 0


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


def _split_calls(calls: list[tuple[int, int, float]], run: RunFigures) -> None:
    for new, ctx, dt in calls:
        if new > 1:
            run.prefill_ms = dt * 1e3 if run.prefill_ms is None else run.prefill_ms + dt * 1e3
        else:
            run.gpt_step_ms.append(dt * 1e3)
            if ctx <= CONTEXT_LIMIT:
                run.gpt_step_ms_ctx400.append(dt * 1e3)


# ------------------------------------------------------------------------------------------------
# The ONNX engine (chattts_forge.runtime)
# ------------------------------------------------------------------------------------------------




class OnnxEngine:
    name = "onnx"

    def __init__(
        self, artifact: str | os.PathLike[str], threads: int, engine: str = "auto", stream_lookahead: int | None = None
    ) -> None:
        from chattts_forge.runtime import Pipeline

        # The runtime chooses the GPT engine (runtime.choose_engine), as for `synth`.
        self.pipe = Pipeline(artifact, provider="cpu", threads=threads, engine=engine)
        self.stream_lookahead = stream_lookahead  # None: the exact stream
        self.gpt_engine = self.pipe.engine
        self.timed = _TimedGpt(self.pipe.gpt)
        self.pipe.gpt = self.timed

    def _params(self, steps: int, seed: int = 0) -> Any:
        from chattts_forge.runtime import InferCodeParams, SynthParams

        return SynthParams(code=InferCodeParams(max_new_token=steps, min_new_token=steps, seed=seed))

    def run(self, texts: list[str], steps: int) -> RunFigures:
        with quiet_logger("chattts_forge.runtime.pipeline"):
            return self._run(texts, steps)

    def _run(self, texts: list[str], steps: int) -> RunFigures:
        params = self._params(steps)
        fig = RunFigures()
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
        _split_calls(self.timed.calls, fig)
        if any(len(w) == 0 for w in wavs):
            raise ForgeError("the runtime produced an empty waveform")
        return fig

    def first_audio(self, text: str, steps: int) -> float:
        params = self._params(steps)
        with quiet_logger("chattts_forge.runtime.pipeline"):
            t0 = time.perf_counter()
            for chunk in self.pipe.stream([text], params, lookahead_frames=self.stream_lookahead):
                if len(chunk[0]):
                    return time.perf_counter() - t0
        return float("nan")


# ------------------------------------------------------------------------------------------------
# The PyTorch baseline (ChatTTS's own code)
# ------------------------------------------------------------------------------------------------


class TorchEngine:
    name = "pytorch"

    def __init__(self, checkpoint: str | os.PathLike[str] | None, threads: int, chat: Any = None) -> None:
        import torch

        from chattts_forge.torch_ref.chat import load_chat

        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process
            pass
        self.torch = torch
        self.chat = chat if chat is not None else load_chat(checkpoint)
        self.calls: list[tuple[int, int, float, float]] = []  # (new, context, start, seconds)
        llama = self.chat.gpt.gpt
        self._t0 = 0.0

        def pre(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            self._t0 = time.perf_counter()

        def post(module: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
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

    def _params(self, steps: int) -> Any:
        from ChatTTS.core import Chat

        return Chat.InferCodeParams(max_new_token=steps, min_new_token=steps, manual_seed=0, show_tqdm=False)

    def run(self, texts: list[str], steps: int) -> RunFigures:
        from chattts_forge.torch_ref.chat import quiet_chattts

        chat = self.chat
        params = self._params(steps)
        fig = RunFigures()
        self.calls.clear()
        with quiet_chattts(), self.torch.inference_mode():
            t0 = time.perf_counter()
            norm = [chat.normalizer(t, True, True, None) for t in texts]
            t_code = time.perf_counter()
            result = next(chat._infer_code(norm, False, chat.device, True, params))
            t_dec = time.perf_counter()
            wavs = chat._decode_to_wavs(result.hiddens, True)
            t_end = time.perf_counter()
        fig.code_stage_s = t_dec - t_code
        fig.e2e_s = t_end - t0
        fig.steps = int(result.ids[0].shape[0]) if result.ids else 0
        starts = [c[2] for c in self.calls]
        fig.full_step_ms = [(b - a) * 1e3 for a, b in zip(starts[1:], starts[2:], strict=False)]
        _split_calls([(n, c, dt) for n, c, _, dt in self.calls], fig)
        if np.asarray(wavs).size == 0:
            raise ForgeError("ChatTTS produced no waveform")
        return fig

    def first_audio(self, text: str, steps: int) -> float:
        from chattts_forge.torch_ref.chat import quiet_chattts

        params = self._params(steps)
        with quiet_chattts():
            t0 = time.perf_counter()
            gen = self.chat.infer(text, stream=True, skip_refine_text=True, split_text=False, params_infer_code=params)
            try:
                for chunk in gen:
                    if np.asarray(chunk).size and np.abs(chunk).max() > 0:
                        return time.perf_counter() - t0
            finally:
                gen.close()
        return float("nan")


# ------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------


def _summarize(runs: list[RunFigures], batch: int, steps: int, first_audio: list[float]) -> dict[str, Any]:
    audio_s = steps / STEPS_PER_AUDIO_SECOND
    pooled = lambda f: [x for r in runs for x in f(r)]  # noqa: E731 - tiny local helper
    out: dict[str, Any] = {
        "batch": batch,
        "steps": int(np.median([r.steps for r in runs])),
        "gpt_step_ms": spread(pooled(lambda r: r.gpt_step_ms)),
        "gpt_step_ms_ctx400": spread(pooled(lambda r: r.gpt_step_ms_ctx400)),
        "full_step_ms": spread(pooled(lambda r: r.full_step_ms)),
        "prefill_ms": spread([r.prefill_ms for r in runs]),
        "code_stage_s": spread([r.code_stage_s for r in runs]),
        "code_rtf": spread([r.code_stage_s / audio_s for r in runs]),
        "e2e_s": spread([r.e2e_s for r in runs]),
        "e2e_rtf": spread([r.e2e_s / audio_s for r in runs]),
        "aggregate_rtf_per_stream": spread([r.e2e_s / (batch * audio_s) for r in runs]),
        "streams": spread([batch * audio_s / r.e2e_s for r in runs]),
        "code_streams": spread([batch * audio_s / r.code_stage_s for r in runs]),
    }
    if first_audio:
        out["first_audio_s"] = spread(first_audio)
    return out


# figures where smaller is better (ratio = onnx / pytorch < 1 means faster than the baseline)
RATIO_KEYS = (
    "gpt_step_ms",
    "gpt_step_ms_ctx400",
    "full_step_ms",
    "prefill_ms",
    "code_stage_s",
    "code_rtf",
    "e2e_s",
    "e2e_rtf",
    "aggregate_rtf_per_stream",
    "first_audio_s",
)
# figures where larger is better (ratio = onnx / pytorch > 1 means more than the baseline)
RATIO_KEYS_HIGHER = ("streams", "code_streams")


def _ratios(onnx: dict[str, Any], torch: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS + RATIO_KEYS_HIGHER:
        a = (onnx.get(key) or {}).get("median")
        b = (torch.get(key) or {}).get("median")
        out[key] = float(a / b) if a is not None and b not in (None, 0) else None
    return out


def _goals(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def med(batch: int, key: str) -> float | None:
        return ((res.get(str(batch)) or {}).get(key) or {}).get("median")

    goals = {
        "code_rtf_b1": {"target": 0.5, "value": med(1, "code_rtf")},
        "gpt_step_ms_ctx400_b1": {"target": 15.0, "value": med(1, "gpt_step_ms_ctx400")},
        "streams_b8": {"target": 8.0, "value": med(8, "streams"), "higher_is_better": True},
        "first_audio_s_b1": {"target": 0.5, "value": med(1, "first_audio_s")},
    }
    for g in goals.values():
        v = g["value"]
        g["met"] = None if v is None else (v >= g["target"] if g.get("higher_is_better") else v <= g["target"])
    return goals


def _default_checkpoint(artifact: Path) -> Path | None:
    try:
        meta = ArtifactMeta.load(artifact)
    except ForgeError:
        return None
    src = (meta.source or {}).get("asset_dir")
    if not src:
        return None
    from chattts_forge.fsutil import recorded_path

    path = recorded_path(src, artifact)  # relative to the artifact folder
    return path if path.is_dir() else None


def run_bench(
    artifact: str | os.PathLike[str],
    *,
    baseline: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    batches: Sequence[int] = (1, 4, 8),
    steps: int = DEFAULT_STEPS,
    threads: int = 2,
    reps: int = 3,
    warmup_steps: int = 16,
    engine: str = "auto",
    text: str = DEFAULT_TEXT,
    first_audio: bool = True,
    stream_lookahead: int | None = None,
    json_out: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    chat: Any = None,
) -> dict[str, Any]:
    """Benchmark `artifact` (and ChatTTS's PyTorch FP32 on `checkpoint` when `baseline="pytorch"`).

    `chat`: an already loaded ChatTTS `Chat` of that checkpoint to use as the baseline (library
    use; it is left as it was). `stream_lookahead`: mel frames of right context the runtime's stream
    waits for before emitting (None: the exact stream; see `Pipeline.stream`). Returns the report
    dict (documented in docs/bench.md) and writes it to `json_out` if given.
    """
    from chattts_forge.fsutil import atomic_write_json
    from chattts_forge.runtime import check_engine
    from chattts_forge.versions import library_versions, toolchain_info

    art = Path(artifact).expanduser()
    ArtifactMeta.load(art)  # a folder that is not an artifact fails here, before anything is timed
    if baseline not in (None, "none", "pytorch"):
        raise ForgeError(f"unknown baseline '{baseline}' (pytorch or none)")
    if baseline == "none":
        baseline = None
    check_engine(engine)
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise ForgeError("batch sizes must be >= 1")
    if steps < 2:
        raise ForgeError("--steps must be >= 2")
    if reps < 1:
        raise ForgeError("--reps must be >= 1")
    if threads < 1:
        raise ForgeError("--threads must be >= 1")
    if not text.strip():
        raise ForgeError("empty benchmark text")
    ckpt: Path | None = None
    if baseline == "pytorch":
        ckpt = Path(checkpoint).expanduser() if checkpoint is not None else _default_checkpoint(art)
        if ckpt is None and chat is not None:
            ckpt = Path(str(getattr(chat, "forge_asset_dir", "<given Chat>")))
        if ckpt is None:
            raise ForgeError("the pytorch baseline needs --checkpoint (the artifact records no existing source folder)")
    say = progress or (lambda msg: log.info("%s", msg))

    engines: list[Any] = []
    try:
        with RssSampler() as rss:
            base_rss = rss.rss()
            with rss.during("onnx_load"):
                onnx_engine = OnnxEngine(art, threads, engine, stream_lookahead)
                engines.append(onnx_engine)
                onnx_engine.run([text], min(warmup_steps, steps))
            onnx_loaded = rss.rss()
            torch_loaded = None
            if ckpt is not None:
                with rss.during("pytorch_load"):
                    torch_engine = TorchEngine(ckpt, threads, chat=chat)
                    engines.append(torch_engine)
                    torch_engine.run([text], min(warmup_steps, steps))
                torch_loaded = rss.rss()
            runs: dict[str, dict[int, list[RunFigures]]] = {e.name: {b: [] for b in batches} for e in engines}
            firsts: dict[str, list[float]] = {e.name: [] for e in engines}
            for rep in range(reps):
                for b in batches:
                    for eng in engines:  # interleaved: both engines see the same machine load
                        say(f"rep {rep + 1}/{reps}: {eng.name} batch {b}, {steps} steps")
                        gc.collect()
                        with rss.during(eng.name):
                            runs[eng.name][b].append(eng.run([text] * b, steps))
                if first_audio and 1 in batches:
                    for eng in engines:
                        say(f"rep {rep + 1}/{reps}: {eng.name} first audio (streaming)")
                        with rss.during(eng.name):
                            firsts[eng.name].append(eng.first_audio(text, steps))
            peaks = dict(rss.peaks)
            process_peak = rss.process_peak if rss.kernel_hwm else peak_rss_bytes()  # resets lower ru_maxrss
    finally:
        for eng in engines:
            if isinstance(eng, TorchEngine):
                eng.close()

    results: dict[str, dict[str, Any]] = {}
    for name, per_batch in runs.items():
        results[name] = {
            str(b): _summarize(rs, b, steps, firsts[name] if b == 1 else []) for b, rs in per_batch.items()
        }
    ratios = None
    if "pytorch" in results:
        ratios = {str(b): _ratios(results["onnx"][str(b)], results["pytorch"][str(b)]) for b in batches}
    mb = 1 / (1 << 20)
    memory: dict[str, Any] = {
        "method": rss.method,
        "process_start_rss_mb": base_rss * mb,
        "process_peak_rss_mb": process_peak * mb if process_peak else None,
        "onnx": {
            "load_rss_mb": (onnx_loaded - base_rss) * mb,
            "peak_rss_mb": max(peaks.get("onnx", 0), peaks.get("onnx_load", 0)) * mb,
        },
    }
    if torch_loaded is not None:
        memory["pytorch"] = {
            "load_rss_mb": (torch_loaded - onnx_loaded) * mb,
            "peak_rss_mb": max(peaks.get("pytorch", 0), peaks.get("pytorch_load", 0)) * mb,
        }
        memory["ratio_load_rss"] = memory["onnx"]["load_rss_mb"] / memory["pytorch"]["load_rss_mb"] if memory["pytorch"]["load_rss_mb"] > 0 else None
    meta = onnx_engine.pipe.artifact.meta
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifact": {
            "path": str(art),
            "variant": meta.variant,
            "gpt_engine": onnx_engine.gpt_engine,
            "gpt_precision": meta.components.get(FAST_GPT if onnx_engine.gpt_engine == "fast" else "gpt", {}).get("precision"),
        },
        "baseline": None if ckpt is None else {"kind": "pytorch", "engine": "ChatTTS Chat (PyTorch FP32)", "checkpoint": str(ckpt)},
        "settings": {
            "steps": steps,
            "audio_seconds": steps / STEPS_PER_AUDIO_SECOND,
            "steps_per_audio_second": STEPS_PER_AUDIO_SECOND,
            "batches": batches,
            "threads": threads,
            "inter_op_threads": 1,
            "reps": reps,
            "warmup_steps": min(warmup_steps, steps),
            "text": text,
            "context_limit": CONTEXT_LIMIT,
            "stream_lookahead_frames": onnx_engine.stream_lookahead,  # null: exact streaming
            "stream_exact_lookahead_frames": onnx_engine.pipe.decoder_radius + onnx_engine.pipe.vocos_radius,
            "order": "interleaved per repetition and batch: onnx then pytorch",
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        "results": results,
        "ratios": ratios,
        "memory": memory,
        "goals": _goals(results["onnx"]),
        "versions": library_versions(),
        "toolchain": toolchain_info(),
    }
    if json_out is not None:
        atomic_write_json(json_out, report)
        log.info("wrote %s", json_out)
    return report


# ------------------------------------------------------------------------------------------------
# Text table
# ------------------------------------------------------------------------------------------------


def _fmt(stat: dict[str, Any] | None, digits: int = 2) -> str:
    if not stat or stat.get("median") is None:
        return "-"
    return f"{stat['median']:.{digits}f} [{stat['p10']:.{digits}f}-{stat['p90']:.{digits}f}]"


ROWS = (
    ("gpt_step_ms", "GPT step (ms)", 2),
    ("gpt_step_ms_ctx400", "GPT step ctx<=400 (ms)", 2),
    ("full_step_ms", "full step (ms)", 2),
    ("prefill_ms", "prefill (ms)", 1),
    ("code_rtf", "code-stage RTF", 3),
    ("e2e_rtf", "end-to-end RTF", 3),
    ("streams", "real-time streams", 2),
    ("first_audio_s", "first audio (s)", 3),
)


def format_table(report: dict[str, Any]) -> str:
    """A readable table: median [p10-p90] per engine and batch, and the ONNX/PyTorch ratio."""
    res = report["results"]
    lines = [
        f"artifact {report['artifact']['path']} ({report['artifact']['variant']}, GPT engine "
        f"{report['artifact']['gpt_engine']}), {report['settings']['steps']} steps = "
        f"{report['settings']['audio_seconds']:.2f} s audio, {report['settings']['threads']} threads, "
        f"{report['settings']['reps']} reps"
    ]
    for b in report["settings"]["batches"]:
        lines.append(f"\nbatch {b}")
        header = f"  {'figure':24s} {'onnx':>26s}"
        if "pytorch" in res:
            header += f" {'pytorch':>26s} {'onnx/pytorch':>12s}"
        lines.append(header)
        for key, label, d in ROWS:
            o = res["onnx"][str(b)].get(key)
            if o is None:
                continue
            row = f"  {label:24s} {_fmt(o, d):>26s}"
            if "pytorch" in res:
                r = (report["ratios"] or {}).get(str(b), {}).get(key)
                ratio = "-" if r is None else f"{r:.3f}"
                row += f" {_fmt(res['pytorch'][str(b)].get(key), d):>26s} {ratio:>12s}"
            lines.append(row)
    mem = report["memory"]
    line = f"\nmemory: onnx +{mem['onnx']['load_rss_mb']:.0f} MB loaded"
    if "pytorch" in mem:
        line += f", pytorch +{mem['pytorch']['load_rss_mb']:.0f} MB loaded"
    if mem.get("process_peak_rss_mb"):
        line += f"; process peak RSS {mem['process_peak_rss_mb']:.0f} MB"
    lines.append(line)
    parts = []
    for k, g in report["goals"].items():
        value = "-" if g["value"] is None else f"{g['value']:.3g}"
        verdict = "n/a" if g["met"] is None else "met" if g["met"] else "missed"
        parts.append(f"{k} {value} (target {g['target']:g}: {verdict})")
    goal_txt = ", ".join(parts)
    lines.append(f"goals: {goal_txt}")
    return "\n".join(lines)
