"""Latency, throughput and memory of an artifact (and, on request, ChatTTS's PyTorch FP32 pipeline).

`measure_artifact(artifact_dir, sentences, threads=2, max_new_token=96, seed=0, batch_sizes=(1, 4, 8))`
loads the runtime (`load_seconds`), runs `warmup` untimed syntheses, then synthesizes every
sentence alone (batch 1) and records per utterance: wall seconds, audio seconds, GPT steps and RTF
(seconds / audio seconds); RTF p50/p95/p99; end-to-end steps per second; first-audio latency when
streaming (seconds until the first non-empty chunk, `stream_batch` steps); throughput at each batch
size (one call with B sentences: aggregate audio seconds per wall second, steps/s); memory: the
peak RSS of a fresh process that loads the artifact and synthesizes once (`measure_memory`; the
evaluating process's own RSS is also recorded but is confounded by what ran before); bytes on disk.
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


def peak_rss_bytes() -> int:
    """This process's peak resident memory (getrusage ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if platform.system() == "Darwin" else int(peak) * 1024


def _peak_rss_mb() -> float:
    return peak_rss_bytes() / 2**20


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
    isolate_memory: bool = True,
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, int]]]:
    """(latency record, {utterance id: (waveform, sample_rate)}) of the artifact; see module doc."""
    from tqdm import tqdm

    from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams

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
        "peak_rss_process_mb": _peak_rss_mb(),  # of the whole evaluating process, for reference
        "memory": measure_memory(artifact_dir, sentences[0], threads) if isolate_memory else None,
        "bytes_on_disk": dir_bytes(Path(artifact_dir)),
    }
    return record, waves


_RSS_PROBE = """
import json, sys
import psutil
from chattts_forge.evaluate.latency import peak_rss_bytes
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
art, text, threads, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = psutil.Process().memory_info().rss
pipe = Pipeline(art, threads=threads or None)
loaded = psutil.Process().memory_info().rss
pipe.synthesize(text, SynthParams(code=InferCodeParams(spk_emb=pipe.random_speaker(0), seed=0, max_new_token=steps)))
peak = peak_rss_bytes()
print(json.dumps({"python_baseline_mb": base / 2**20, "after_load_mb": loaded / 2**20, "peak_rss_mb": peak / 2**20}))
"""


def measure_memory(artifact_dir: str | os.PathLike[str], text: str, threads: int | None = 2,
                   max_new_token: int = 24) -> dict[str, Any]:
    """Peak RSS of a fresh process that loads the artifact and synthesizes `text` once.

    In-process figures are confounded by whatever ran before (allocators keep freed memory), so each
    artifact gets its own short-lived interpreter; the result is what a server would need.
    """
    import json
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": str(threads or 1)}
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(artifact_dir), text, str(threads or 0), str(max_new_token)],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if proc.returncode != 0:
        log.warning("memory probe failed for %s: %s", artifact_dir, proc.stderr.strip().splitlines()[-1:])
        return {"peak_rss_mb": None, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["method"] = f"fresh process: load + one synthesis of {max_new_token} steps, getrusage ru_maxrss"
    return out


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
