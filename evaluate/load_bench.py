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

Phrase cache (`--phrase-cache-hit-ratio R`): round(R x N) requests, at positions drawn with the seed
(`hit_indices`), are phrases already in a warm phrase cache and are served from it (Vocos only, no GPT
work; runtime.phrase_cache `PipelineCache.lookup`), each on its own thread as a service's request
handler would, while the others go through the scheduler unchanged (same text, seed and length as
without a cache). The cache is `--phrase-cache FILE` (e.g. a version's phrase_cache.bin: its phrases
for this artifact, with the knobs it was built with) or, by default, one built before the runs from
the hit requests' own sentences (knobs: the bench's seed, every hit `hit_steps` long: a cache holds one
set of knobs, so the hits cannot keep their mixed lengths). A hit the cache does not hold after all
(e.g. a phrase whose normalisation changed) goes through the scheduler: the measured hit ratio says so.

Timings come from a loaded, shared machine when they do: same-run ratios are what to compare.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.evaluate.load_bench_config import Arrival, LoadBenchConfig, check_hit_ratio
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.runtime.machine import machine_info
from chattts_forge.runtime.phrase_cache import PhraseCache, PipelineCache, replay_params
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, Result, SynthParams
from chattts_forge.runtime.timing import Request, codes_per_audio_second, peak_rss_bytes, quantiles

log = get_logger(__name__)

SCHEMA = "chattts-forge/bench-load/1"
CODES_PER_AUDIO_SECOND = codes_per_audio_second(24000, 256)  # ChatTTS's audio: 24 kHz, hop 256
_MIN_STEPS, _MAX_STEPS = 24, 430


def start_request_thread(target: Callable[[], None], done: Callable[[], None] | None) -> threading.Thread:
    """A daemon thread that runs one replayed request, then `done()` (the pacer's slot), however it ends."""

    def run() -> None:
        try:
            target()
        finally:
            if done is not None:
                done()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t

def speech_steps(text: str) -> int:
    """Code steps a voice would take for `text` (Latin ~14 chars/s, CJK ~4.5 chars/s)."""
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u9fff")
    seconds = cjk / 4.5 + (len(text.strip()) - cjk) / 14.0
    return int(min(_MAX_STEPS, max(_MIN_STEPS, round(seconds * CODES_PER_AUDIO_SECOND))))


def _pct(values: Sequence[float], q: float) -> float | None:
    got = quantiles(values, [q])
    return got[0] if got else None


def corpus_requests(corpus: str, n: int, seed: int) -> list[tuple[str, int]]:
    from chattts_forge.calibration_data.corpus import load_corpus

    sentences = list(load_corpus(corpus).sentences)
    if not sentences:
        raise BadInput(f"corpus {corpus} has no sentence")
    order = np.random.default_rng(seed).permutation(len(sentences))
    picked = [sentences[int(order[i % len(sentences)])] for i in range(n)]
    return [(t, speech_steps(t)) for t in picked]


def hit_indices(n: int, ratio: float, seed: int) -> list[int]:
    """The requests served from the phrase cache: round(ratio x n) of the n (halves rounded up), at
    positions drawn with `seed` (the same seed, n and ratio give the same ones)."""
    check_hit_ratio(ratio)
    count = min(n, int(math.floor(ratio * n + 0.5)))
    # A stream of its own, so the hit draw changes neither the corpus order nor the arrivals.
    rng = np.random.default_rng([seed, 14])
    return sorted(int(i) for i in rng.choice(n, size=count, replace=False))


@dataclass(frozen=True)
class LoadRequest:
    """One request of the replay: `hit` ones are meant to be served from the phrase cache."""

    index: int
    text: str
    steps: int  # code steps (EOS masked up to them); for a hit, those of the cache's knobs
    params: SynthParams
    hit: bool = False


def miss_params(index: int, steps: int, seed: int) -> SynthParams:
    """A scheduled request's parameters: EOS masked up to `steps`, then ended; seed + index."""
    return SynthParams(code=InferCodeParams(max_new_token=steps, min_new_token=steps, seed=seed + index))


def plan_requests(reqs: Sequence[tuple[str, int]], seed: int, hits: Sequence[int] = (),
                  hit_params: SynthParams | None = None, hit_texts: Sequence[str] | None = None) -> list[LoadRequest]:
    """The replay: each (text, steps) a scheduled request, except positions `hits`, which ask for a
    cached phrase with `hit_params` (their own text, or `hit_texts` drawn in turn when given)."""
    marked = set(hits)
    if marked and hit_params is None:
        raise BadInput("cache hits need the cache's request parameters")
    out, j = [], 0
    for i, (text, steps) in enumerate(reqs):
        if i in marked:
            assert hit_params is not None
            if hit_texts is not None:
                text, j = hit_texts[j % len(hit_texts)], j + 1
            out.append(LoadRequest(i, text, hit_params.code.max_new_token, hit_params, hit=True))
        else:
            out.append(LoadRequest(i, text, steps, miss_params(i, steps, seed)))
    return out


@dataclass
class Outcome:
    """What one request got: served from the cache or by the scheduler, its times and result."""

    index: int
    cached: bool | None  # served from the phrase cache (no GPT work) / by the scheduler / None: by neither
    latency: float | None = None  # s, request -> its whole audio
    first_audio: float | None = None  # s, request -> its first audio
    result: Result | None = None
    error: str | None = None
    samples: int | None = None  # audio samples received (over HTTP, where no Result exists)


def replay(pipe: Pipeline, plan: Sequence[LoadRequest], concurrency: int, arrival: Arrival = Arrival(),
           lookahead: int | None = None, cache: PipelineCache | None = None,
           decode_overlap: bool | None = None, first_chunk_priority: bool = True,
           counters: dict[str, int] | None = None) -> tuple[list[Outcome], float, int]:
    """Replay `plan` at one concurrency: (an Outcome per request in plan order, wall seconds, batched
    GPT steps). Scheduled requests run through a `Scheduler(max_batch=concurrency,
    decode_worker=decode_overlap)`; hits are looked up in `cache` on a thread of their own (a service's
    request handler) and go to the scheduler if absent. `counters`, when given, gets the scheduler's
    `first_chunk_steps` and `deferred_decodes`."""
    from chattts_forge.runtime.request_handle import Handle
    from chattts_forge.runtime.scheduler import Scheduler

    if any(r.hit for r in plan) and cache is None:
        raise ForgeError("the plan has cache hits but no phrase cache was given")
    outcomes: list[Outcome | None] = [None] * len(plan)

    with Scheduler(pipe, max_batch=concurrency, max_queue=len(plan), lookahead_frames=lookahead,
                   decode_worker=decode_overlap, first_chunk_priority=first_chunk_priority) as sched:

        def scheduled(req: LoadRequest, handle: Handle, asked: float) -> None:
            handle.wait()
            late = handle.submitted - asked  # a hit that fell back asked before its handle existed
            try:
                res = handle.result()
                outcomes[req.index] = Outcome(req.index, False, handle.finished + late,
                                              None if handle.first_audio is None else handle.first_audio + late, res)
            except ForgeError as e:
                outcomes[req.index] = Outcome(req.index, False, error=str(e))

        def serve_hit(req: LoadRequest, asked: float) -> None:
            assert cache is not None
            try:
                row = cache.lookup(pipe, pipe.normalize(req.text, req.params), req.params)
            except ForgeError as e:  # e.g. unspeakable text, a damaged entry: this request alone
                outcomes[req.index] = Outcome(req.index, None, error=str(e))
                return
            if row is None:
                scheduled(req, sched.submit(req.text, req.params), asked)
                return
            took = time.perf_counter() - asked
            res = _hit_result(pipe, req, row)
            # the whole waveform at once: its first audio is its end
            outcomes[req.index] = Outcome(req.index, True, took, took if len(res.wav) else None, res)

        def start(req: LoadRequest, done: Callable[[], None] | None) -> threading.Thread:
            asked = time.perf_counter()
            if req.hit:
                target: Callable[[], None] = lambda: serve_hit(req, asked)  # noqa: E731
            else:
                handle = sched.submit(req.text, req.params)
                target = lambda: scheduled(req, handle, asked)  # noqa: E731
            return start_request_thread(target, done)

        t0 = time.perf_counter()
        arrival.pace(plan, concurrency, start)
        wall = time.perf_counter() - t0
        gpt_steps = sched.steps
    if counters is not None:
        counters.update(first_chunk_steps=sched.first_chunk_steps, deferred_decodes=sched.deferred_decodes)
    return [o for o in outcomes if o is not None], wall, gpt_steps


def http_body(variant: str, req: LoadRequest, lookahead: int | str | None = None) -> dict[str, Any]:
    """The OpenAI speech request of a replayed request (extensions: seed, token budget, refinement, the
    stream look-ahead when one is asked; pcm, streamed)."""
    code = req.params.code
    body = {"model": variant, "input": req.text, "voice": "default", "response_format": "pcm",
            "seed": code.seed, "max_new_token": code.max_new_token, "min_new_token": code.min_new_token,
            "refine": req.params.refine is not None}
    if lookahead is not None:
        body["stream_lookahead"] = lookahead
    return body


def server_cpu_s(client: Any, url: str) -> float | None:
    """The server process's CPU seconds so far (its /metrics `forge_process_cpu_seconds`; None without it)."""
    try:
        text = client.get(url.rstrip("/") + "/metrics", timeout=10).text
    except Exception:  # noqa: BLE001 - httpx errors: the figure is only missing
        return None
    for line in text.splitlines():
        if line.startswith("forge_process_cpu_seconds "):
            return float(line.split()[1])
    return None


def replay_http(url: str, variant: str, plan: Sequence[LoadRequest], concurrency: int, arrival: Arrival = Arrival(),
                timeout_s: float = 600.0, cpu: dict[str, float | None] | None = None,
                lookahead: int | str | None = None) -> tuple[list[Outcome], float]:
    """Replay `plan` against a server at `url` with real concurrent streaming HTTP clients (one httpx
    connection per request in flight): latency = request sent -> last byte, first audio = request
    sent -> first audio byte (16-bit PCM: every body byte is audio). `cpu`, when given, gets the CPU
    seconds the client process (this one, every thread) and the server process used during the replay
    (`client_cpu_s`, `server_cpu_s`: both share this machine's cores when the server runs here)."""
    try:
        import httpx
    except ModuleNotFoundError:
        raise BadInput("bench --url needs httpx: pip install 'chattts-forge[dev]'") from None
    endpoint = url.rstrip("/") + "/v1/audio/speech"
    try:
        httpx.get(url.rstrip("/") + "/readyz", timeout=10).raise_for_status()
    except httpx.HTTPError as e:
        raise ForgeError(f"--url {url}: the server is not ready ({e})") from None
    outcomes: list[Outcome | None] = [None] * len(plan)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    with httpx.Client(timeout=timeout_s, limits=limits) as client:

        def one(req: LoadRequest) -> None:
            asked = time.perf_counter()
            first = None
            samples = 0
            try:
                with client.stream("POST", endpoint, json=http_body(variant, req, lookahead)) as r:
                    if r.status_code != 200:
                        outcomes[req.index] = Outcome(req.index, None, error=f"HTTP {r.status_code}: {r.read()[:200]!r}")
                        return
                    for data in r.iter_bytes():
                        if data and first is None:
                            first = time.perf_counter() - asked
                        samples += len(data) // 2
            except httpx.HTTPError as e:
                outcomes[req.index] = Outcome(req.index, None, error=f"{type(e).__name__}: {e}")
                return
            outcomes[req.index] = Outcome(req.index, False, time.perf_counter() - asked, first, samples=samples)

        def start(req: LoadRequest, done: Callable[[], None] | None) -> threading.Thread:
            return start_request_thread(lambda: one(req), done)

        server0, client0 = server_cpu_s(client, url), time.process_time()
        t0 = time.perf_counter()
        arrival.pace(plan, concurrency, start)
        wall = time.perf_counter() - t0
        client_s, server1 = time.process_time() - client0, server_cpu_s(client, url)
        if cpu is not None:
            cpu["client_cpu_s"] = client_s
            cpu["server_cpu_s"] = server1 - server0 if server0 is not None and server1 is not None else None
    return [o for o in outcomes if o is not None], wall


def _hit_result(pipe: Pipeline, req: LoadRequest, row: Any) -> Result:
    return Result(text=req.text, codes=row.codes, hiddens=row.hiddens, wav=row.wav, sample_rate=pipe.sample_rate,
                  cached=True)


def _times(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": _pct(values, 50), "p95": _pct(values, 95), "p99": _pct(values, 99), "max": max(values, default=None)}


def _first_audio_after(done: Sequence[Outcome], start: int) -> dict[str, float | None]:
    """First audio p50/p95 of the requests after the first `start` (in submission order)."""
    first = [o.first_audio for o in done if o.index >= start and o.first_audio is not None]
    return {"p50": _pct(first, 50), "p95": _pct(first, 95)}


def summarize(outcomes: Sequence[Outcome], wall: float, gpt_steps: int, concurrency: int, sample_rate: int,
              hit_ratio: float | None = None) -> dict[str, Any]:
    """One concurrency's figures (docs/bench-load.md); the hit/miss split when a hit ratio was asked."""
    done = [o for o in outcomes if o.result is not None or o.samples is not None]
    audio_s = sum(len(o.result.wav) if o.result is not None else (o.samples or 0) for o in done) / sample_rate
    lat = [o.latency for o in done if o.latency is not None]
    first = [o.first_audio for o in done if o.first_audio is not None]
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": len(outcomes),
        "completed": len(done),
        "failed": [o.error for o in outcomes if o.error is not None],
        "wall_s": wall,
        "batched_gpt_steps": gpt_steps,
        "latency_s": _times(lat),
        "first_audio_s": {"p50": _pct(first, 50), "p95": _pct(first, 95)},
        # Without the requests submitted at the start together (a closed loop's first `concurrency`), whose
        # first audio includes each other's prefills: the figure of a service already running.
        "first_audio_s_running": _first_audio_after(done, concurrency),
        "sentences_per_s": len(done) / wall,
        "audio_s": audio_s,
        "real_time_streams": audio_s / wall,
    }
    if hit_ratio is not None:
        split: dict[str, Any] = {"hit_ratio_asked": hit_ratio}
        for name, count, served in (("hit", "hits", True), ("miss", "misses", False)):
            mine = [o for o in done if o.cached is served]
            split[count] = sum(1 for o in outcomes if o.cached is served)
            split[f"latency_s_{name}"] = _times([o.latency for o in mine if o.latency is not None])
            fa = [o.first_audio for o in mine if o.first_audio is not None]
            split[f"first_audio_s_{name}"] = {"p50": _pct(fa, 50), "p95": _pct(fa, 95)}
        split["hit_ratio"] = split["hits"] / len(outcomes) if outcomes else None
        out["phrase_cache"] = split
    return out


def _pytorch_sequential(checkpoint: Path, requests: list[tuple[str, int]], threads: int) -> dict[str, Any]:
    from chattts_forge.torch_ref.engine import TorchEngine

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


def run_load_bench(cfg: LoadBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the load benchmark (see the module docstring); returns the report, written to `cfg.json_out`.

    With `cfg.url`, each concurrency is replayed over HTTP first (`replay_http`; the report's `http`
    figures), then in-process (the figures beside them), so the two are of the same run and machine;
    phrase-cache hits are not replayed over HTTP (the server's own cache decides what hits)."""
    from chattts_forge.runtime.scheduler import default_decode_worker

    say = progress or (lambda msg: log.info("%s", msg))
    art = Path(cfg.artifact).expanduser()
    cfg.check()
    ckpt = cfg.baseline_checkpoint(art)
    reqs = corpus_requests(cfg.corpus, cfg.requests, cfg.seed)
    pipe = Pipeline(art, threads=cfg.threads, engine="fast")
    overlap = default_decode_worker(pipe) if cfg.decode_overlap is None else cfg.decode_overlap
    with tempfile.TemporaryDirectory(prefix="forge-load-cache-") as scratch:
        plan, pcache, cache_info = plan_with_cache(pipe, art, reqs, cfg.seed, cfg.phrase_cache_hit_ratio,
                                                    cfg.phrase_cache, Path(scratch), say)
        try:
            say(f"warm-up: {art.name}")
            pipe.synthesize([reqs[0][0]], _warm_params())
            results = [_run_level(cfg, pipe, plan, c, pcache, overlap, say) for c in cfg.levels]
        finally:
            if pcache is not None:
                pcache.cache.close()
    runtime_peak = peak_rss_bytes()  # before torch is loaded: the runtime's own figure
    base = None
    if ckpt is not None:
        n = max(1, min(cfg.baseline_requests, len(reqs)))
        say(f"ChatTTS PyTorch, sequential: {n} requests")
        base = _pytorch_sequential(ckpt, reqs[:n], cfg.threads)
    for r in results:
        r["sentences_per_s_vs_pytorch"] = r["sentences_per_s"] / base["sentences_per_s"] if base else None
    report = _report(cfg, pipe, art, plan, overlap, results, runtime_peak, base)
    if cache_info is not None:
        report["phrase_cache"] = cache_info
    if cfg.json_out is not None:
        atomic_write_json(cfg.json_out, report)
        log.info("wrote %s", cfg.json_out)
    return report


def _run_level(cfg: LoadBenchConfig, pipe: Pipeline, plan: list[LoadRequest], c: int, pcache: PipelineCache | None,
               overlap: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """One concurrency's summary: over HTTP first when `cfg.url` (its `http` figures), then in-process."""
    http = None
    if cfg.url is not None:
        say(f"concurrency {c}: {cfg.requests} requests over HTTP to {cfg.url} ({cfg.arrival} arrival)")
        cpu: dict[str, float | None] = {}
        with quiet_logger("httpx"):  # one INFO line per request otherwise
            h_out, h_wall = replay_http(cfg.url, pipe.artifact.variant, plan, c, cfg.arrivals, cpu=cpu,
                                        lookahead=cfg.stream_lookahead)
        http = summarize(h_out, h_wall, 0, c, pipe.sample_rate, cfg.phrase_cache_hit_ratio)
        http.pop("batched_gpt_steps")
        http.update(cpu)
    say(f"concurrency {c}: {cfg.requests} requests ({cfg.arrival} arrival)" + (" in-process" if cfg.url else ""))
    cpu0 = time.process_time()
    counters: dict[str, int] = {}
    with quiet_logger():  # every request ends at its max_new_token on purpose
        outcomes, wall, steps = replay(pipe, plan, c, cfg.arrivals, pipe.resolve_lookahead(cfg.stream_lookahead),
                                       pcache, overlap, cfg.first_chunk_priority, counters)
    summary = summarize(outcomes, wall, steps, c, pipe.sample_rate, cfg.phrase_cache_hit_ratio)
    summary["cpu_s"] = time.process_time() - cpu0
    summary.update(counters)
    if http is not None:
        summary["http"] = http
        summary["http_vs_in_process_sentences_per_s"] = http["sentences_per_s"] / summary["sentences_per_s"]
    return summary


def _report(cfg: LoadBenchConfig, pipe: Pipeline, art: Path, plan: list[LoadRequest], overlap: bool,
            results: list[dict[str, Any]], runtime_peak: int | None, base: dict[str, Any] | None) -> dict[str, Any]:
    mb = 1 / (1 << 20)
    meta = pipe.artifact.meta
    return {
        "schema": SCHEMA,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifact": {"path": str(art), "variant": meta.variant,
                     "kv_cache": (meta.components.get(FAST_GPT) or {}).get("kv_cache", {}).get("dtype", "float32")},
        "settings": {"concurrency": cfg.levels, "requests": cfg.requests, "arrival": cfg.arrival, "rate": cfg.rate,
                     "corpus": cfg.corpus, "url": cfg.url,
                     "seed": cfg.seed, "threads": cfg.threads, "stream_lookahead_frames": pipe.resolve_lookahead(cfg.stream_lookahead),
                     "lengths": "EOS masked up to speech_steps(text), then ended",
                     "request_steps": [r.steps for r in plan],
                     "phrase_cache_hit_ratio": cfg.phrase_cache_hit_ratio,
                     "decode_overlap": overlap,
                     "first_chunk_priority": cfg.first_chunk_priority,
                     "decode_overlap_asked": "default (on when intra-op threads < usable cores)"
                     if cfg.decode_overlap is None else cfg.decode_overlap},
        "machine": machine_info(cfg.threads),  # the one machine record (runtime.machine), as bench's and the reports
        "results": {str(r["concurrency"]): r for r in results},
        "runtime_peak_rss_mb": runtime_peak * mb if runtime_peak else None,
        "baseline": base,
    }


def plan_with_cache(pipe: Pipeline, art: Path, reqs: list[tuple[str, int]], seed: int,
                    ratio: float | None, cache_file: str | os.PathLike[str] | None, scratch: Path,
                    say: Callable[[str], None] | None = None,
                    ) -> tuple[list[LoadRequest], PipelineCache | None, dict[str, Any] | None]:
    """The replay plan, the phrase cache its hits are served from (built in `scratch` unless
    `cache_file`; the caller closes it) and the report's `phrase_cache` section."""
    say = say or (lambda msg: log.info("%s", msg))
    if ratio is None:
        return plan_requests(reqs, seed), None, None
    from chattts_forge.runtime.phrase_cache_build import build_phrase_cache

    hits = hit_indices(len(reqs), ratio, seed)
    if cache_file is not None:
        cache = PhraseCache(cache_file)
        try:
            pcache = PipelineCache(cache, pipe)  # refused unless built for this artifact
            pool = cache.texts(pcache.payload)
            if hits and not pool:
                raise NotFound(f"phrase cache {cache.path} holds no phrase for {art}")
            params = replay_params(cache.knobs, pipe.num_vq)
        except ForgeError:
            cache.close()
            raise
        order = np.random.default_rng([seed, 15]).permutation(len(pool))
        plan = plan_requests(reqs, seed, hits, params, [pool[int(k)] for k in order])
        source = str(Path(cache_file))
    else:
        pool = list(dict.fromkeys(reqs[i][0] for i in hits))
        steps = int(np.median([reqs[i][1] for i in hits])) if hits else _MIN_STEPS
        params = miss_params(0, steps, seed)
        plan = plan_requests(reqs, seed, hits, params)
        if not pool:  # nothing is asked of a cache
            info = {"file": None, "built_from": None, "phrases": 0, "knobs": None, "hit_requests": hits}
            return plan, None, info
        say(f"warming a phrase cache of {len(pool)} sentences ({steps} steps each)")
        listing = scratch / "phrases.txt"
        listing.write_text("\n".join(pool) + "\n", encoding="utf-8")
        with quiet_logger():
            built = build_phrase_cache(art, listing, scratch / "phrases.cache", params, pipeline=pipe)
        cache = PhraseCache(built["path"])
        pcache = PipelineCache(cache, pipe)
        source = None
    info = {
        "file": source,
        "built_from": None if source else "the hit requests' own sentences (seed and length: knobs below)",
        "phrases": len(pcache.cache),
        "knobs": pcache.cache.knobs,
        "hit_requests": hits,
    }
    return plan, pcache, info


def _warm_params() -> Any:
    return SynthParams(code=InferCodeParams(max_new_token=8, min_new_token=8, seed=0))


def format_load_table(report: dict[str, Any]) -> str:
    """The report as a text table (one line per concurrency, then the baseline)."""

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = ["concurrency | done | latency p50/p95/p99 s | first audio p50/p95 s | sentences/s | RT streams | vs PyTorch"]
    for c, r in report["results"].items():
        lat, fa = r["latency_s"], r["first_audio_s"]
        ratio = r.get("sentences_per_s_vs_pytorch")
        lines.append(f"{c} | {r['completed']}/{r['requests']} | {f(lat['p50'])}/{f(lat['p95'])}/{f(lat['p99'])} | "
                     f"{f(fa['p50'])}/{f(fa['p95'])} | {r['sentences_per_s']:.3f} | {r['real_time_streams']:.2f} | "
                     f"{'-' if ratio is None else f'{ratio:.1f}x'}")
        h = r.get("http")
        if h:
            hl, hf = h["latency_s"], h["first_audio_s"]
            lines.append(f"  over HTTP | {h['completed']}/{h['requests']} | {f(hl['p50'])}/{f(hl['p95'])}/{f(hl['p99'])} | "
                         f"{f(hf['p50'])}/{f(hf['p95'])} | {h['sentences_per_s']:.3f} | {h['real_time_streams']:.2f} | "
                         f"{r['http_vs_in_process_sentences_per_s']:.2f}x in-process sentences/s; CPU s: server "
                         f"{f(h.get('server_cpu_s'))}, client {f(h.get('client_cpu_s'))}, in-process {f(r.get('cpu_s'))}")
        pc = r.get("phrase_cache")
        if pc:
            lines.append(
                f"  phrase cache: {pc['hits']} hits / {pc['misses']} misses (hit ratio {f(pc['hit_ratio'])}); "
                f"latency p50 hit {f(pc['latency_s_hit']['p50'])} s, miss {f(pc['latency_s_miss']['p50'])} s; "
                f"first audio p50 hit {f(pc['first_audio_s_hit']['p50'])} s, miss {f(pc['first_audio_s_miss']['p50'])} s")
    base = report.get("baseline")
    if base:
        lines.append(f"PyTorch sequential | {base['requests']} | p50 {base['latency_s']['p50']:.2f} s | - | "
                     f"{base['sentences_per_s']:.3f} | {base['real_time_streams']:.2f} | 1")
    if report.get("runtime_peak_rss_mb"):
        lines.append(f"runtime peak RSS (before PyTorch was loaded): {report['runtime_peak_rss_mb']:.0f} MB")
    return "\n".join(lines)
