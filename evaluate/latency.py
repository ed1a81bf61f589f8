"""Latency, throughput and memory of an artifact (and, on request, ChatTTS's PyTorch FP32 pipeline).

`measure_artifact(artifact_dir, sentences, threads=2, max_new_token=96, seed=0, batch_sizes=(1, 4, 8))`
loads the runtime (`load_seconds`), runs `warmup` untimed syntheses, then synthesizes every
sentence alone (batch 1) and records per utterance: wall seconds, audio seconds, GPT steps and RTF
(seconds / audio seconds); RTF p50/p95/p99; end-to-end steps per second; first-audio latency when
streaming (seconds until the first non-empty chunk, `stream_batch` steps); throughput at each batch
size (one call with B sentences: aggregate audio seconds per wall second, steps/s); resident
memory after load and after the run (psutil) and the process peak (getrusage); bytes on disk.
The waveforms are returned too (the evaluate stage scores them with the ASR).

`measure_pytorch(checkpoint, sentences, ...)` measures ChatTTS's own `Chat.infer` (text refinement
off, same speaker seed and token budget) the same way; torch is imported only there.

`machine_info(threads)` describes where it ran: CPU model, logical/physical cores, threads,
onnxruntime providers, platform, library versions.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.log import get_logger

log = get_logger(__name__)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "min": None, "max": None}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int | None) -> dict[str, Any]:
    import onnxruntime as ort
    import psutil

    from chattts_forge.versions import library_versions, toolchain_info

    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "threads": threads,
        "provider": "CPUExecutionProvider",
        "available_providers": ort.get_available_providers(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "toolchain": toolchain_info(),
    }


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux (bytes on macOS).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if platform.system() == "Darwin" else peak / 1024


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def _summary(utterances: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sum(u["seconds"] for u in utterances)
    steps = sum(u["steps"] for u in utterances)
    return {
        "rtf": percentiles([u["rtf"] for u in utterances]),
        "seconds": percentiles([u["seconds"] for u in utterances]),
        "seconds_per_step": percentiles([u["seconds"] / max(u["steps"], 1) for u in utterances]),
        "steps_per_second": steps / seconds if seconds else None,
        "total_seconds": seconds,
        "total_audio_seconds": sum(u["audio_seconds"] for u in utterances),
        "total_steps": steps,
    }


def measure_artifact(
    artifact_dir: str | os.PathLike[str],
    sentences: list[str],
    threads: int | None = 2,
    max_new_token: int = 96,
    seed: int = 0,
    batch_sizes: tuple[int, ...] = (1, 4, 8),
    warmup: int = 1,
    stream_batch: int = 24,
    first_audio_runs: int = 3,
    progress: bool = True,
    desc: str = "synth",
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, int]]]:
    """(latency record, {utterance id: (waveform, sample_rate)}) of the artifact; see module doc."""
    from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
    from tqdm import tqdm

    rss_before = _rss_mb()
    t0 = time.perf_counter()
    pipe = Pipeline(artifact_dir, threads=threads)
    load_seconds = time.perf_counter() - t0
    rss_loaded = _rss_mb()

    def params(i: int) -> SynthParams:
        return SynthParams(
            code=InferCodeParams(
                spk_emb=pipe.random_speaker(seed + i), seed=seed + i, max_new_token=max_new_token,
                stream_batch=stream_batch,
            )
        )

    t0 = time.perf_counter()
    for _ in range(warmup):
        pipe.synthesize(sentences[0], params(0))
    warmup_seconds = time.perf_counter() - t0

    utterances: list[dict[str, Any]] = []
    waves: dict[str, tuple[np.ndarray, int]] = {}
    for i, text in enumerate(tqdm(sentences, desc=desc, unit="utt", disable=not progress, leave=False)):
        t0 = time.perf_counter()
        [res] = pipe.synthesize(text, params(i))
        dt = time.perf_counter() - t0
        audio_seconds = res.wav.shape[-1] / res.sample_rate
        utt_id = f"{i + 1:03d}"
        waves[utt_id] = (res.wav, res.sample_rate)
        utterances.append(
            {
                "id": utt_id,
                "text": text,
                "seconds": dt,
                "audio_seconds": audio_seconds,
                "steps": int(res.codes.shape[0]),
                "rtf": dt / audio_seconds if audio_seconds else None,
            }
        )

    first_audio = []
    for i in range(min(first_audio_runs, len(sentences))):
        t0 = time.perf_counter()
        for chunk in pipe.stream(sentences[i], params(i)):
            if chunk and chunk[0].size:
                first_audio.append(time.perf_counter() - t0)
                break

    throughput = {}
    for b in batch_sizes:
        texts = [sentences[j % len(sentences)] for j in range(b)]
        t0 = time.perf_counter()
        results = pipe.synthesize(texts, params(0))
        dt = time.perf_counter() - t0
        audio = sum(r.wav.shape[-1] / r.sample_rate for r in results)
        steps = sum(int(r.codes.shape[0]) for r in results)
        throughput[str(b)] = {
            "batch": b,
            "seconds": dt,
            "audio_seconds": audio,
            "steps": steps,
            "aggregate_rtf": dt / audio if audio else None,  # wall seconds per second of audio
            "realtime_streams": audio / dt if dt else None,  # seconds of audio per wall second
            "steps_per_second": steps / dt if dt else None,
        }

    record = {
        "artifact": str(artifact_dir),
        "threads": threads,
        "max_new_token": max_new_token,
        "load_seconds": load_seconds,
        "warmup_runs": warmup,
        "warmup_seconds": warmup_seconds,
        "utterances": utterances,
        **_summary(utterances),
        "first_audio_seconds": {**percentiles(first_audio), "stream_batch": stream_batch, "runs": len(first_audio)},
        "throughput": throughput,
        "rss_mb": {"before_load": rss_before, "after_load": rss_loaded, "after_run": _rss_mb()},
        "peak_rss_process_mb": _peak_rss_mb(),
        "bytes_on_disk": dir_bytes(Path(artifact_dir)),
    }
    return record, waves


def measure_pytorch(
    checkpoint: str | os.PathLike[str],
    sentences: list[str],
    threads: int | None = 2,
    max_new_token: int = 96,
    seed: int = 0,
    warmup: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """ChatTTS's PyTorch FP32 `Chat.infer` on the same sentences (torch imported here only)."""
    import torch

    from chattts_forge.errors import ForgeError

    try:
        from chattts_forge.torch_ref.chat import load_chat
        from chattts_forge.torch_ref.reference import reference_synthesize
    except ImportError as e:  # pragma: no cover - export extra missing
        raise ForgeError(f"the PyTorch baseline needs the export extra ({e}): pip install -e '.[export]'") from None
    from tqdm import tqdm

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    chat = load_chat(checkpoint)
    load_seconds = time.perf_counter() - t0

    def run(text: str, i: int) -> Any:
        return reference_synthesize(
            chat, text, seed=seed + i, speaker="random", max_new_token=max_new_token, refine=False
        )

    for _ in range(warmup):
        run(sentences[0], 0)
    utterances = []
    for i, text in enumerate(tqdm(sentences, desc="pytorch", unit="utt", disable=not progress, leave=False)):
        t0 = time.perf_counter()
        res = run(text, i)
        dt = time.perf_counter() - t0
        audio_seconds = res.wav.shape[-1] / res.sample_rate
        utterances.append(
            {
                "id": f"{i + 1:03d}",
                "text": text,
                "seconds": dt,
                "audio_seconds": audio_seconds,
                "steps": int(res.codes.shape[0]),
                "rtf": dt / audio_seconds if audio_seconds else None,
            }
        )
    return {
        "checkpoint": str(checkpoint),
        "pipeline": "ChatTTS Chat.infer (PyTorch FP32, refine off)",
        "threads": threads,
        "torch": torch.__version__,
        "load_seconds": load_seconds,
        "warmup_runs": warmup,
        "utterances": utterances,
        **_summary(utterances),
    }
