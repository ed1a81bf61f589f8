"""Load benchmark: mixed-length sentences arriving at a continuous-batching scheduler, per concurrency.

`chattts-forge bench --artifact DIR --load --concurrency 1,4,8 --requests N [--arrival closed|poisson]
[--rate R] [--baseline pytorch] --json OUT` replays a corpus of mixed-length sentences
(`builtin:evaluation`, shuffled with the seed) against `runtime.scheduler.Scheduler` with
`max_batch = concurrency`, and reports per concurrency: latency p50/p95/p99 (submit -> last audio),
first audio p50/p95 (submit -> first final chunk), sentences per second and real-time streams
(seconds of audio produced per wall-clock second) over the whole run.

Arrivals: `closed` keeps `concurrency` requests in flight (a new one as soon as one ends: the
saturated service); `poisson` submits at exponential intervals of mean 1/`rate` s (an open loop:
latency includes queueing when the service falls behind).

Lengths: random synthetic weights rarely emit EOS, so each request's EOS is masked up to the length
a voice would take for its text (`speech_steps`: ~14 characters a second of Latin script, ~4.5 of
CJK, at 46.875 code steps a second) and ends there - the lengths are mixed as the corpus is.

Baseline: ChatTTS's own PyTorch pipeline serving the same requests one after another (as ChatTTS
serves), in the same process after the runtime's runs (so the runtime's memory is its own), on
the first `baseline_requests` of them; its sentences per second are then compared.

Timings come from a loaded, shared machine when they do: same-run ratios are what to compare.
"""

from __future__ import annotations

import math
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT
from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.runtime.timing import codes_per_audio_second, quantiles

log = get_logger(__name__)

SCHEMA = "chattts-forge/bench-load/1"
ARRIVALS = ("closed", "poisson")
CODES_PER_AUDIO_SECOND = codes_per_audio_second(24000, 256)  # ChatTTS's audio: 24 kHz, hop 256
_MIN_STEPS, _MAX_STEPS = 24, 430


def speech_steps(text: str) -> int:
    """Code steps a voice would take for `text` (Latin ~14 chars/s, CJK ~4.5 chars/s)."""
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u9fff")
    seconds = cjk / 4.5 + (len(text.strip()) - cjk) / 14.0
    return int(min(_MAX_STEPS, max(_MIN_STEPS, round(seconds * CODES_PER_AUDIO_SECOND))))


def _pct(values: Sequence[float], q: float) -> float | None:
    got = quantiles(values, [q])
    return got[0] if got else None


def _requests(corpus: str, n: int, seed: int) -> list[tuple[str, int]]:
    from chattts_forge.calibration_data.corpus import load_corpus

    sentences = list(load_corpus(corpus).sentences)
    if not sentences:
        raise ForgeError(f"corpus {corpus} has no sentence")
    order = np.random.default_rng(seed).permutation(len(sentences))
    picked = [sentences[int(order[i % len(sentences)])] for i in range(n)]
    return [(t, speech_steps(t)) for t in picked]


def _run_concurrency(pipe: Any, requests: list[tuple[str, int]], concurrency: int, arrival: str,
                     rate: float | None, seed: int, lookahead: int | None) -> dict[str, Any]:
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams
    from chattts_forge.runtime.scheduler import Scheduler

    def params(i: int, steps: int) -> SynthParams:
        return SynthParams(code=InferCodeParams(max_new_token=steps, min_new_token=steps, seed=seed + i))

    done: list[Any] = []
    failed: list[str] = []
    rng = np.random.default_rng(seed)
    with Scheduler(pipe, max_batch=concurrency, max_queue=len(requests), lookahead_frames=lookahead) as sched:
        t0 = time.perf_counter()
        if arrival == "closed":
            slots = threading.Semaphore(concurrency)
            handles = []
            for i, (text, steps) in enumerate(requests):
                slots.acquire()
                h = sched.submit(text, params(i, steps))
                threading.Thread(target=lambda h=h: (h.wait(), slots.release()), daemon=True).start()
                handles.append(h)
        else:
            handles = []
            for i, (text, steps) in enumerate(requests):
                handles.append(sched.submit(text, params(i, steps)))
                time.sleep(float(rng.exponential(1.0 / rate)))
        for h in handles:
            try:
                h.result()
                done.append(h)
            except ForgeError as e:
                failed.append(str(e))
        wall = time.perf_counter() - t0
        gpt_steps = sched.steps
    audio_s = sum(len(h.result().wav) for h in done) / pipe.sample_rate
    lat = [h.finished for h in done]
    first = [h.first_audio for h in done if h.first_audio is not None]
    return {
        "concurrency": concurrency,
        "requests": len(requests),
        "completed": len(done),
        "failed": failed,
        "wall_s": wall,
        "batched_gpt_steps": gpt_steps,
        "latency_s": {"p50": _pct(lat, 50), "p95": _pct(lat, 95), "p99": _pct(lat, 99), "max": max(lat, default=None)},
        "first_audio_s": {"p50": _pct(first, 50), "p95": _pct(first, 95)},
        "sentences_per_s": len(done) / wall,
        "audio_s": audio_s,
        "real_time_streams": audio_s / wall,
    }


def _pytorch_sequential(checkpoint: Path, requests: list[tuple[str, int]], threads: int) -> dict[str, Any]:
    from chattts_forge.runtime.timing import Request, TorchEngine

    engine = TorchEngine(checkpoint, threads)
    try:
        engine.run([requests[0][0]], Request.fixed_steps(8))  # warm-up
        lat, audio_s = [], 0.0
        t0 = time.perf_counter()
        for i, (text, steps) in enumerate(requests):
            fig = engine.run([text], Request.fixed_steps(steps, seed=i))
            lat.append(fig.e2e_s)
            audio_s += fig.total_audio_s
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    return {
        "requests": len(requests),
        "wall_s": wall,
        "latency_s": {"p50": _pct(lat, 50), "p95": _pct(lat, 95), "p99": _pct(lat, 99)},
        "sentences_per_s": len(requests) / wall,
        "real_time_streams": audio_s / wall,
    }


def run_load_bench(
    artifact: str | os.PathLike[str],
    *,
    concurrency: Sequence[int] = (1, 4, 8),
    requests: int = 16,
    arrival: str = "closed",
    rate: float | None = None,
    corpus: str = "builtin:evaluation",
    baseline: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    baseline_requests: int = 4,
    threads: int = 2,
    seed: int = 0,
    stream_lookahead: int | None = None,
    json_out: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the load benchmark (see the module docstring); returns the report, written to `json_out`."""
    from chattts_forge.fsutil import atomic_write_json
    from chattts_forge.runtime.pipeline import Pipeline
    from chattts_forge.runtime.timing import peak_rss_bytes

    say = progress or (lambda msg: log.info("%s", msg))
    art = Path(artifact).expanduser()
    levels = sorted({int(c) for c in concurrency})
    if not levels or levels[0] < 1:
        raise ForgeError("--concurrency takes values >= 1")
    if requests < 1:
        raise ForgeError("--requests must be >= 1")
    if arrival not in ARRIVALS:
        raise ForgeError(f"unknown arrival '{arrival}' (choose from: {', '.join(ARRIVALS)})")
    if arrival == "poisson" and not (rate is not None and rate > 0 and math.isfinite(rate)):
        raise ForgeError("--arrival poisson needs --rate R (requests per second, > 0)")
    if baseline not in (None, "pytorch"):
        raise ForgeError(f"unknown baseline '{baseline}' (pytorch or none)")
    ckpt = None
    if baseline == "pytorch":
        from chattts_forge.evaluate.bench import _default_checkpoint

        ckpt = Path(checkpoint).expanduser() if checkpoint is not None else _default_checkpoint(art)
        if ckpt is None:
            raise ForgeError("the pytorch baseline needs --checkpoint (the artifact records no existing source folder)")
    reqs = _requests(corpus, requests, seed)
    pipe = Pipeline(art, threads=threads, engine="fast")
    say(f"warm-up: {art.name}")
    pipe.synthesize([reqs[0][0]], _warm_params())
    results = []
    for c in levels:
        say(f"concurrency {c}: {requests} requests ({arrival} arrival)")
        with quiet_logger():  # every request ends at its max_new_token on purpose
            results.append(_run_concurrency(pipe, reqs, c, arrival, rate, seed, stream_lookahead))
    runtime_peak = peak_rss_bytes()  # before torch is loaded: the runtime's own figure
    base = None
    if ckpt is not None:
        n = max(1, min(baseline_requests, len(reqs)))
        say(f"ChatTTS PyTorch, sequential: {n} requests")
        base = _pytorch_sequential(ckpt, reqs[:n], threads)
    for r in results:
        r["sentences_per_s_vs_pytorch"] = r["sentences_per_s"] / base["sentences_per_s"] if base else None
    mb = 1 / (1 << 20)
    meta = pipe.artifact.meta
    report = {
        "schema": SCHEMA,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifact": {"path": str(art), "variant": meta.variant,
                     "kv_cache": (meta.components.get(FAST_GPT) or {}).get("kv_cache", {}).get("dtype", "float32")},
        "settings": {"concurrency": levels, "requests": requests, "arrival": arrival, "rate": rate, "corpus": corpus,
                     "seed": seed, "threads": threads, "stream_lookahead_frames": stream_lookahead,
                     "lengths": "EOS masked up to speech_steps(text), then ended",
                     "request_steps": [s for _, s in reqs]},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "results": {str(r["concurrency"]): r for r in results},
        "runtime_peak_rss_mb": runtime_peak * mb if runtime_peak else None,
        "baseline": base,
    }
    if json_out is not None:
        atomic_write_json(json_out, report)
        log.info("wrote %s", json_out)
    return report


def _warm_params() -> Any:
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams

    return SynthParams(code=InferCodeParams(max_new_token=8, min_new_token=8, seed=0))


def format_load_table(report: dict[str, Any]) -> str:
    """The report as a text table (one line per concurrency, then the baseline)."""
    lines = ["concurrency | done | latency p50/p95/p99 s | first audio p50/p95 s | sentences/s | RT streams | vs PyTorch"]
    for c, r in report["results"].items():
        lat, fa = r["latency_s"], r["first_audio_s"]
        ratio = r.get("sentences_per_s_vs_pytorch")

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        lines.append(f"{c} | {r['completed']}/{r['requests']} | {f(lat['p50'])}/{f(lat['p95'])}/{f(lat['p99'])} | "
                     f"{f(fa['p50'])}/{f(fa['p95'])} | {r['sentences_per_s']:.3f} | {r['real_time_streams']:.2f} | "
                     f"{'-' if ratio is None else f'{ratio:.1f}x'}")
    base = report.get("baseline")
    if base:
        lines.append(f"PyTorch sequential | {base['requests']} | p50 {base['latency_s']['p50']:.2f} s | - | "
                     f"{base['sentences_per_s']:.3f} | {base['real_time_streams']:.2f} | 1")
    if report.get("runtime_peak_rss_mb"):
        lines.append(f"runtime peak RSS (before PyTorch was loaded): {report['runtime_peak_rss_mb']:.0f} MB")
    return "\n".join(lines)
