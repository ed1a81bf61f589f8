"""Latency, throughput and memory of an artifact (and, on request, ChatTTS's PyTorch FP32 pipeline).

The evaluate stage's workload on the engines of `chattts_forge.runtime.timed_engine` and
`chattts_forge.torch_ref.engine` (the same engines,
spans and definitions as `bench`; docs/bench.md "Definitions"):

`measure_artifact(artifact_dir, sentences, threads=2, max_new_token=96, seed=0, batch_sizes=(1, 4, 8))`
loads the runtime (`load_seconds`), runs `warmup` untimed syntheses, then synthesizes every
sentence alone (batch 1, EOS free, a random speaker of seed `seed + i`) and records per utterance:
end-to-end seconds, audio seconds, codes and RTF (end-to-end seconds / audio seconds); RTF
p50/p95/p99; codes per second; first audio when streaming (`stream_batch` steps); throughput at
each batch size (one call with B sentences: streams = audio seconds of all rows per wall second,
codes/s); memory: the peak RSS of a fresh process that loads the artifact and synthesizes once
(`memory_probe.measure_memory`; the evaluating process's own peak is also recorded but is confounded by
what ran before); bytes on disk. The waveforms are returned too (the evaluate stage scores them).

`measure_pytorch(checkpoint, sentences, ...)` measures ChatTTS's own PyTorch pipeline
(`torch_ref.engine.TorchEngine`: normalizer, code stage, Decoder + Vocos; no refinement, no sentence split)
per sentence the same way; torch is imported only there.

The report's `machine` section is `machine.machine_info(threads)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.log import get_logger
from chattts_forge.runtime.memory_probe import measure_memory
from chattts_forge.runtime.timed_engine import OnnxEngine
from chattts_forge.runtime.timing import (
    Request,
    RunFigures,
    current_rss_bytes,
    peak_rss_bytes,
    per_second,
    percentiles,
    time_calls,
)

log = get_logger(__name__)

MB = 1 / 2**20


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def _summary(utterances: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sum(u["seconds"] for u in utterances)
    steps = sum(u["steps"] for u in utterances)
    return {
        "rtf": percentiles([u["rtf"] for u in utterances]),
        "seconds": percentiles([u["seconds"] for u in utterances]),
        "seconds_per_step": percentiles([u["seconds"] / max(u["steps"], 1) for u in utterances]),
        "steps_per_second": per_second(steps, seconds),
        "total_seconds": seconds,
        "total_audio_seconds": sum(u["audio_seconds"] for u in utterances),
        "total_steps": steps,
    }


def measure_utterances(
    engine: Any,
    sentences: list[str],
    request_of: Callable[[int], Request],
    warmup: int = 1,
    progress: bool = False,
    desc: str = "synth",
    keep_audio: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, tuple[np.ndarray, int]], float]:
    """(per-utterance records, {id: (waveform, sample_rate)} if kept, warm-up seconds): `warmup`
    untimed runs of the first sentence, then every sentence alone (batch 1) with `request_of(i)`.
    An utterance's `rtf` is the engine run's end-to-end RTF: bench's `e2e_rtf` at batch 1."""
    from tqdm import tqdm

    warmup_seconds = sum(time_calls(lambda: engine.run([sentences[0]], request_of(0)), warmup))
    utterances: list[dict[str, Any]] = []
    waves: dict[str, tuple[np.ndarray, int]] = {}
    for i, text in enumerate(tqdm(sentences, desc=desc, unit="utt", disable=not progress, leave=False)):
        run: RunFigures = engine.run([text], request_of(i), keep_audio=keep_audio)
        utt_id = f"{i + 1:03d}"
        if run.wavs is not None:
            waves[utt_id] = (run.wavs[0], run.sample_rate)
        utterances.append({
            "id": utt_id,
            "text": text,
            "seconds": run.e2e_s,
            "audio_seconds": run.audio_s,
            "steps": run.row_codes[0],
            "rtf": run.e2e_rtf,
        })
    return utterances, waves, warmup_seconds


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
    provider: str = "cpu",
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, int]]]:
    """(latency record, {utterance id: (waveform, sample_rate)}) of the artifact; see module doc.
    `provider`: the runtime's onnxruntime provider, resolved (cpu or cuda)."""
    rss_before = current_rss_bytes()
    engine = OnnxEngine(artifact_dir, threads, provider=provider)
    rss_loaded = current_rss_bytes()

    def request(i: int) -> Request:
        return Request(max_new_token=max_new_token, seed=seed + i, speaker_seed=seed + i, stream_batch=stream_batch)

    utterances, waves, warmup_seconds = measure_utterances(engine, sentences, request, warmup, progress, desc, True)
    first_audio = [engine.first_audio(sentences[i], request(i)) for i in range(min(first_audio_runs, len(sentences)))]
    first_audio = [s for s in first_audio if not np.isnan(s)]  # runs that streamed no audio measured nothing

    throughput = {}
    for b in batch_sizes:
        run = engine.run([sentences[j % len(sentences)] for j in range(b)], request(0))
        throughput[str(b)] = {
            "batch": b,
            "seconds": run.e2e_s,
            "audio_seconds": run.total_audio_s,
            "steps": sum(run.row_codes),
            "aggregate_rtf": run.aggregate_rtf,  # wall seconds per second of audio
            "realtime_streams": run.streams,  # seconds of audio per wall second
            "steps_per_second": per_second(sum(run.row_codes), run.e2e_s),
        }

    record = {
        "artifact": str(artifact_dir),
        "threads": threads,
        "max_new_token": max_new_token,
        "gpt_engine": engine.gpt_engine,
        "load_seconds": engine.load_seconds,
        "warmup_runs": warmup,
        "warmup_seconds": warmup_seconds,
        "utterances": utterances,
        **_summary(utterances),
        "first_audio_seconds": {**percentiles(first_audio), "stream_batch": stream_batch, "runs": len(first_audio)},
        "throughput": throughput,
        "rss_mb": {"before_load": rss_before * MB, "after_load": rss_loaded * MB, "after_run": current_rss_bytes() * MB},
        "peak_rss_process_mb": peak_rss_bytes() * MB,  # of the whole evaluating process, for reference
        "memory": measure_memory(artifact_dir, sentences[0], threads, provider=provider) if isolate_memory else None,
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
    """ChatTTS's PyTorch FP32 pipeline on the same sentences and requests (torch imported here only)."""
    from chattts_forge.torch_ref.engine import TorchEngine

    engine = TorchEngine(checkpoint, threads)
    try:
        def request(i: int) -> Request:
            return Request(max_new_token=max_new_token, seed=seed + i, speaker_seed=seed + i)

        utterances, _, _ = measure_utterances(engine, sentences, request, warmup, progress, "pytorch", False)
    finally:
        engine.close()
    return {
        "checkpoint": str(checkpoint),
        "pipeline": "ChatTTS normalizer + Chat._infer_code + Chat._decode_to_wavs (PyTorch FP32; no refinement, "
                    "no sentence split)",
        "threads": threads,
        "torch": engine.torch.__version__,
        "load_seconds": engine.load_seconds,
        "warmup_runs": warmup,
        "utterances": utterances,
        **_summary(utterances),
    }
