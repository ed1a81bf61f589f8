"""Soak test of a running `chattts-forge serve`: a realistic mix for as long as asked, the server's
resources sampled all along, and every healthy request checked.

`chattts-forge bench --artifact DIR --soak SECONDS --url URL [--concurrency 8 | --rate R] [--reload-every N]
[--admin-token T] --json OUT [--plot OUT.png]`: `--concurrency` clients (the largest level given) each
send, one after another until the time is up (closed loop; `--rate R`: open loop, Poisson arrivals at R
a second whatever the server's pace, as an overload test needs), requests drawn with a fixed seed from
this mix:

- `stream`: a miss streamed (every format: wav, pcm, flac, mp3, opus, aac; some as SSE events);
- `whole`: a miss with `"stream": false`, every format;
- `hit`: a phrase of DIR's phrase cache (`phrase_cache.bin`, or `--phrase-cache FILE`: the one a server
  runs with) with the cache's knobs (served whole from it);
- `hangup`: a streamed miss whose client closes the connection after its first chunk;
- `malformed`: a bad body (not JSON, unknown field, format or voice, out-of-range knob, empty input):
  it must get a 4xx, never a 2xx or 5xx.

A miss speaks a corpus sentence (`builtin:evaluation`) for as many code steps as a voice would take
(`load_bench.speech_steps`, EOS masked: min = max new tokens), so its audio length is known: a healthy
request (well-formed, not hung up) must come back 200 with decodable audio of that length (pcm, wav,
flac exactly; mp3, opus and aac within a few codec frames; a cut stream is a lost request). A 429 or 503
with Retry-After is retried after it (as a client honouring it would, at most `retries` times): only
a request that never comes back healthy is lost. The report counts the refusals and their Retry-After,
and beside each request's whole latency the admitted attempt's (`admitted_p99_s`).

Sampled every `sample_every` seconds from /metrics: RSS, open fds, threads, queue depth, running rows,
CPU seconds (the client's load average beside). `--reload-every N`: `POST /admin/reload {"artifact":
DIR}` every N seconds. The JSON (schema `chattts-forge/soak/1`) holds the samples, per-window (60 s)
p50/p99 of the misses, the reloads, every lost request and the drift figures (RSS of the last 5
minutes against minutes 2-5, fds and threads first against last, each window's p99 against the first
10 minutes'; shorter runs scale those spans to their length). They are measurements, reported, not
judged here; what fails the run (exit 2, after the JSON and plot are written) is a lost healthy
request, a malformed request not answered 4xx, or a failed reload.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.evaluate.soak_config import SoakConfig
from chattts_forge.evaluate.soak_output import plot
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.log import get_logger, quiet_logger

log = get_logger(__name__)

SCHEMA = "chattts-forge/soak/1"
FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")  # the server's (runtime.serve.formats.FORMATS)
SAMPLE_RATE = 24000
HOP = 256  # ChatTTS's audio: 256 samples a mel frame, two mel frames a code step
LOSSY_SLACK = 4 * 1152  # mp3/opus/aac: the encoder's delay and padding, a few codec frames
METRICS = {"forge_rss_bytes": "rss", "forge_open_fds": "fds", "forge_threads": "threads",
           "forge_queue_depth": "queue", "forge_running_rows": "running", "forge_process_cpu_seconds": "cpu_s"}

# Bad bodies (content, why): each must be refused with a 4xx.
MALFORMED: tuple[tuple[bytes | dict[str, Any], str], ...] = (
    (b"{not json", "not JSON"),
    ({"model": "tts-1", "input": ""}, "empty input"),
    ({"model": "tts-1", "input": "Hello.", "response_format": "wav2"}, "unknown format"),
    ({"model": "tts-1", "input": "Hello.", "voice": "nobody"}, "unknown voice"),
    ({"model": "tts-1", "input": "Hello.", "speed": 99}, "speed out of range"),
    ({"model": "tts-1", "input": "Hello.", "volume": 3}, "unknown field"),
    ([1, 2, 3], "not an object"),
    ({"model": "tts-1", "input": "Hello. [Stts]"}, "structural token"),
)


@dataclass
class Outcome:
    kind: str
    fmt: str
    t: float  # seconds into the soak it started
    latency_s: float
    status: int
    ok: bool  # healthy: 200 with the audio asked for; malformed: a 4xx; hangup: anything
    reason: str = ""
    retries: int = 0
    cached: bool = False
    sse: bool = False
    admitted_s: float | None = None  # the last attempt's latency: the one the server admitted (after refusals)


def hit_body(knobs: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI fields that ask for a phrase cache's knobs (what its entries were built with)."""
    body: dict[str, Any] = {"seed": knobs["seed"], "max_new_token": knobs["max_new_token"],
                            "min_new_token": knobs["min_new_token"], "top_p": knobs["top_p"],
                            "top_k": knobs["top_k"], "repetition_penalty": knobs["repetition_penalty"]}
    temps = knobs.get("temperature") or []
    if temps and all(t == temps[0] for t in temps):
        body["temperature"] = temps[0]
    if knobs.get("refine") is False:
        body["refine"] = False
    return body


def _phrases(artifact: str | None, phrase_cache: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """The phrase cache's texts and its request fields (none without a cache): `phrase_cache`, else
    the artifact's own."""
    if phrase_cache is None and artifact is None:
        return [], {}
    path = Path(phrase_cache) if phrase_cache is not None else Path(artifact or ".") / "phrase_cache.bin"
    if not path.is_file():
        if phrase_cache is not None:
            raise BadInput(f"--phrase-cache {phrase_cache} is not a file")
        return [], {}
    from chattts_forge.runtime.phrase_cache import PhraseCache

    cache = PhraseCache(path)
    try:
        return cache.texts(), hit_body(cache.knobs)
    finally:
        cache.close()


def decode_samples(data: bytes, fmt: str) -> int:
    """Samples of a response's audio; ForgeError when it does not decode."""
    if not data:
        raise ForgeError("no audio bytes")
    if fmt == "pcm":
        if len(data) % 2:
            raise ForgeError(f"odd pcm length {len(data)}")
        return len(data) // 2
    if fmt == "wav":
        if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
            raise ForgeError("no RIFF/WAVE header")
        return (len(data) - 44) // 2  # the 44-byte header the server writes, then 16-bit samples
    if fmt == "flac":
        import soundfile as sf

        try:
            return len(sf.read(io.BytesIO(data), dtype="int16")[0])
        except Exception as e:  # noqa: BLE001 - any decoder failure is the request's failure
            raise ForgeError(f"flac does not decode ({e})") from None
    try:
        import av
    except ModuleNotFoundError:  # no decoder: the container's magic at least
        looks = {"opus": data[:4] == b"OggS", "mp3": data[:3] == b"ID3" or data[0] == 0xFF,
                 "aac": len(data) > 1 and data[0] == 0xFF and data[1] & 0xF6 == 0xF0}  # aac: ADTS sync word, layer 0
        if not looks.get(fmt, True):
            raise ForgeError(f"not {fmt}") from None
        return -1
    try:
        n, rate = 0, SAMPLE_RATE
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(audio=0):
                n, rate = n + frame.samples, frame.sample_rate
        return round(n * SAMPLE_RATE / rate)  # Opus decodes at 48 kHz: counted in the server's 24 kHz samples
    except Exception as e:  # noqa: BLE001
        raise ForgeError(f"{fmt} does not decode ({e})") from None


def sse_audio(data: bytes) -> bytes:
    """The audio of an SSE reply (its deltas); ForgeError without the closing `speech.audio.done`."""
    out, done = [], False
    for block in data.decode("utf-8").split("\n\n"):
        if not block.startswith("data: "):
            continue
        event = json.loads(block[6:])
        if event["type"] == "speech.audio.delta":
            out.append(base64.b64decode(event["audio"]))
        elif event["type"] == "speech.audio.done":
            done = True
        else:
            raise ForgeError(f"SSE event {event['type']}: {event.get('error')}")
    if not done:
        raise ForgeError("SSE stream ended without speech.audio.done")
    return b"".join(out)


def check_audio(data: bytes, fmt: str, steps: int | None) -> None:
    """Decodable audio of the length `steps` code steps give (ForgeError naming what is wrong)."""
    n = decode_samples(data, fmt)
    if n == 0:
        raise ForgeError("no samples")
    if steps is None or n < 0:
        return
    want = HOP * (2 * steps - 1)
    slack = 0 if fmt in ("wav", "pcm", "flac") else LOSSY_SLACK
    if abs(n - want) > slack:
        raise ForgeError(f"{n} samples, expected {want} ({steps} steps): a cut or padded reply")


def parse_metrics(text: str) -> dict[str, float]:
    got: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in METRICS:
            got[METRICS[m.group(1)]] = got.get(METRICS[m.group(1)], 0.0) + float(m.group(2))
    return got


class Soak:
    """One soak run (`run()` returns the report)."""

    def __init__(self, cfg: SoakConfig, progress: Callable[[str], None] | None = None) -> None:
        import httpx

        from chattts_forge.evaluate.load_bench import corpus_requests

        cfg.check()
        self.cfg = cfg
        self.say = progress or (lambda msg: None)
        self.base = cfg.url.rstrip("/")
        self.sentences = [(t, min(s, cfg.max_steps)) for t, s in corpus_requests(cfg.corpus, 64, cfg.seed)]
        self.phrases, self.hit_fields = _phrases(cfg.artifact, cfg.phrase_cache)
        self.mix = {k: v for k, v in cfg.mix.items() if v > 0 and (k != "hit" or self.phrases)}
        clients = cfg.concurrency if cfg.rate is None else cfg.max_in_flight
        limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
        self.client = httpx.Client(timeout=cfg.request_timeout_s, limits=limits)
        self.outcomes: list[Outcome] = []
        self.samples: list[dict[str, float]] = []
        self.reloads: list[dict[str, Any]] = []
        self.retry_afters: list[float] = []  # every Retry-After a refusal (429/503) carried
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.t0 = 0.0

    # ---- the clients ------------------------------------------------------------------------

    def _record(self, o: Outcome) -> None:
        with self._lock:
            self.outcomes.append(o)

    def _draw(self, rng: np.random.Generator) -> tuple[str, str]:
        """A request kind of the mix and an audio format."""
        kinds, weights = list(self.mix), np.array(list(self.mix.values()))
        kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
        return kind, FORMATS[int(rng.integers(len(FORMATS)))]

    def _safe_one(self, kind: str, fmt: str, rng: np.random.Generator, n: int, arrived: float | None = None) -> None:
        try:
            self._one(kind, fmt, rng, n, arrived)
        except Exception as e:  # noqa: BLE001 - a client bug must show as a failure, not end the soak
            self._record(Outcome(kind, fmt, time.monotonic() - self.t0, 0.0, 0, kind == "hangup",
                                 f"client error {type(e).__name__}: {e}"))

    def _client(self, worker: int) -> None:
        """Closed loop: one request after another until the time is up."""
        rng = np.random.default_rng([self.cfg.seed, worker])
        n = 0
        while not self._stop.is_set():
            kind, fmt = self._draw(rng)
            self._safe_one(kind, fmt, rng, worker * 1_000_000 + n)
            n += 1

    def _arrivals(self) -> None:
        """Open loop (`rate`): Poisson arrivals, each its own request whatever the server's pace; latency
        counts from the arrival (a request waiting for a free client thread waits in it)."""
        from concurrent.futures import ThreadPoolExecutor

        assert self.cfg.rate is not None
        rng = np.random.default_rng([self.cfg.seed, 0xA11])
        due, n = 0.0, 0
        with ThreadPoolExecutor(self.cfg.max_in_flight, thread_name_prefix="soak-arrival") as pool:
            while True:
                due += float(rng.exponential(1.0 / self.cfg.rate))
                if self._stop.wait(max(0.0, self.t0 + due - time.monotonic())):
                    break
                kind, fmt = self._draw(rng)
                pool.submit(self._safe_one, kind, fmt, np.random.default_rng([self.cfg.seed, 1, n]), n,
                            self.t0 + due)
                n += 1

    def _one(self, kind: str, fmt: str, rng: np.random.Generator, n: int, arrived: float | None = None) -> None:
        import httpx

        start = time.monotonic() if arrived is None else arrived
        t = start - self.t0
        if kind == "malformed":
            body, why = MALFORMED[int(rng.integers(len(MALFORMED)))]
            kw = ({"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes)
                  else {"json": body})  # declared JSON: the malformed body itself is what gets refused
            r = self.client.post(self.base + "/v1/audio/speech", **kw)
            ok = 400 <= r.status_code < 500
            self._record(Outcome(kind, why, t, time.monotonic() - start, r.status_code, ok,
                                 "" if ok else f"malformed ({why}) answered {r.status_code}"))
            return
        sse = False
        steps: int | None
        if kind == "hit":
            text = self.phrases[int(rng.integers(len(self.phrases)))]
            body = {"model": "tts-1", "input": text, "voice": "default", "response_format": fmt, **self.hit_fields}
            steps = None  # the cache's entry decides its length
        else:
            text, steps = self.sentences[int(rng.integers(len(self.sentences)))]
            body = {"model": "tts-1", "input": text, "voice": "default", "response_format": fmt, "refine": False,
                    "max_new_token": steps, "min_new_token": steps, "seed": int(n % 1000),
                    "stream": kind != "whole"}
            if kind == "stream" and fmt in FORMATS and rng.random() < 0.25:
                body["stream_format"] = "sse"
                sse = True
        retries = 0
        while True:
            attempt = time.monotonic()
            try:
                with self.client.stream("POST", self.base + "/v1/audio/speech", json=body) as r:
                    status = r.status_code
                    if kind == "hangup" and status == 200:
                        next(r.iter_bytes(), b"")  # then close mid-stream
                        self._record(Outcome(kind, fmt, t, time.monotonic() - start, status, True, retries=retries))
                        return
                    data = r.read()
                    retry_after = r.headers.get("retry-after")
                    cached = r.headers.get("x-forge-cached") == "true"
            except httpx.HTTPError as e:
                self._record(Outcome(kind, fmt, t, time.monotonic() - start, 0, kind == "hangup",
                                     f"{type(e).__name__}: {e}", retries, sse=sse))
                return
            if status in (429, 503) and retry_after is not None and retries < self.cfg.retries:
                retries += 1  # a client honouring Retry-After (after the sending period too: none is dropped)
                with self._lock:
                    self.retry_afters.append(float(retry_after))
                time.sleep(float(retry_after))
                continue
            break
        end = time.monotonic()
        took, admitted = end - start, end - attempt
        if kind == "hangup":  # refused before any audio: nothing to hang up on, nothing lost either
            self._record(Outcome(kind, fmt, t, took, status, True, retries=retries))
            return
        if status != 200:
            self._record(Outcome(kind, fmt, t, took, status, False, f"status {status}: {data[:200]!r}", retries,
                                 sse=sse))
            return
        try:
            check_audio(sse_audio(data) if sse else data, fmt, steps)
        except (ForgeError, ValueError, KeyError) as e:
            self._record(Outcome(kind, fmt, t, took, status, False, f"bad audio: {e}", retries, cached, sse))
            return
        self._record(Outcome(kind, fmt, t, took, status, True, "", retries, cached, sse, admitted))

    # ---- the watchers -----------------------------------------------------------------------

    def _sampler(self) -> None:
        while True:
            row: dict[str, float] = {"t": time.monotonic() - self.t0}
            try:
                row.update(parse_metrics(self.client.get(self.base + "/metrics", timeout=30).text))
            except Exception as e:  # noqa: BLE001 - a missed sample is a gap, not a failure
                log.warning("soak: /metrics: %s", e)
            row["client_load_1m"] = os.getloadavg()[0]
            with self._lock:
                self.samples.append(row)
            if self._stop.wait(self.cfg.sample_every):
                return

    def _reloader(self) -> None:
        assert self.cfg.reload_every is not None
        headers = {"Authorization": f"Bearer {self.cfg.admin_token}"} if self.cfg.admin_token else {}
        while not self._stop.wait(self.cfg.reload_every):
            start = time.monotonic()
            try:
                r = self.client.post(self.base + "/admin/reload", json={"artifact": self.cfg.artifact},
                                     headers=headers, timeout=600)
                row = {"t": start - self.t0, "status": r.status_code, "took_s": time.monotonic() - start,
                       "model": r.json().get("model") if r.status_code == 200 else None,
                       "error": None if r.status_code == 200 else r.text[:300]}
            except Exception as e:  # noqa: BLE001
                row = {"t": start - self.t0, "status": 0, "took_s": time.monotonic() - start, "model": None,
                       "error": f"{type(e).__name__}: {e}"}
            self.say(f"reload at {row['t']:.0f} s: {row['status']} in {row['took_s']:.1f} s")
            with self._lock:
                self.reloads.append(row)

    # ---- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        import httpx

        try:
            self.client.get(self.base + "/readyz", timeout=30).raise_for_status()
        except httpx.HTTPError as e:
            raise ForgeError(f"--url {self.cfg.url}: the server is not ready ({e})") from None
        load = (f"{self.cfg.concurrency} clients" if self.cfg.rate is None
                else f"open-loop arrivals at {self.cfg.rate:g}/s")
        self.say(f"soak: {self.cfg.seconds:.0f} s, {load} against {self.cfg.url} "
                 f"(mix {', '.join(f'{k} {v:.0%}' for k, v in self.mix.items())})")
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self._sampler, daemon=True)]
        if self.cfg.rate is None:
            threads += [threading.Thread(target=self._client, args=(w,), daemon=True)
                        for w in range(self.cfg.concurrency)]
        else:
            threads.append(threading.Thread(target=self._arrivals, daemon=True))
        if self.cfg.reload_every is not None:
            threads.append(threading.Thread(target=self._reloader, daemon=True))
        for th in threads:
            th.start()
        next_note = 60.0
        while time.monotonic() - self.t0 < self.cfg.seconds:
            time.sleep(min(1.0, self.cfg.seconds - (time.monotonic() - self.t0)) if self.cfg.seconds > 1 else 0.05)
            if time.monotonic() - self.t0 >= next_note:
                with self._lock:
                    done, lost = len(self.outcomes), sum(not o.ok for o in self.outcomes)
                self.say(f"soak: {next_note:.0f} s, {done} requests, {lost} failed")
                next_note += 60.0
        self._stop.set()
        for th in threads:  # clients finish the request they are in (none is abandoned)
            th.join(timeout=self.cfg.request_timeout_s)
        wall = time.monotonic() - self.t0
        try:  # the final state, after the last request
            row = {"t": wall, **parse_metrics(self.client.get(self.base + "/metrics", timeout=30).text),
                   "client_load_1m": os.getloadavg()[0]}
            self.samples.append(row)
        except Exception as e:  # noqa: BLE001
            log.warning("soak: final /metrics: %s", e)
        self.client.close()
        return self.report(wall)

    def report(self, wall: float) -> dict[str, Any]:
        cfg = self.cfg
        outcomes = sorted(self.outcomes, key=lambda o: o.t)
        healthy = [o for o in outcomes if o.kind in ("stream", "whole", "hit")]
        lost = [o for o in healthy if not o.ok]
        bad_malformed = [o for o in outcomes if o.kind == "malformed" and not o.ok]
        by_kind: dict[str, dict[str, int]] = {}
        for o in outcomes:
            row = by_kind.setdefault(o.kind, {"sent": 0, "ok": 0, "failed": 0, "retried": 0})
            row["sent"] += 1
            row["ok" if o.ok else "failed"] += 1
            row["retried"] += o.retries > 0
        statuses: dict[str, int] = {}
        for o in outcomes:
            statuses[str(o.status)] = statuses.get(str(o.status), 0) + 1
        formats = {f: sum(1 for o in healthy if o.fmt == f and o.ok) for f in FORMATS}
        hits = [o for o in healthy if o.kind == "hit"]
        period = min(wall, cfg.seconds)  # the time requests were sent (then the last ones finish)
        windows = _windows(outcomes, cfg.window_s, period)
        failed_reloads = [r for r in self.reloads if r["status"] != 200]
        report = {
            "schema": SCHEMA,
            "config": {"url": cfg.url, "seconds": cfg.seconds, "concurrency": cfg.concurrency,
                       "artifact": Path(cfg.artifact).name if cfg.artifact else None,
                       "reload_every_s": cfg.reload_every, "sample_every_s": cfg.sample_every,
                       "window_s": cfg.window_s, "seed": cfg.seed, "corpus": cfg.corpus, "mix": self.mix,
                       "max_steps": cfg.max_steps, "retries": cfg.retries, "rate": cfg.rate},
            "wall_s": wall,
            "requests": len(outcomes),
            "healthy": len(healthy),
            "lost_healthy": len(lost),
            "malformed_not_4xx": len(bad_malformed),
            "by_kind": by_kind,
            "statuses": statuses,
            "healthy_ok_by_format": formats,
            "sse_ok": sum(1 for o in healthy if o.sse and o.ok),
            "hit_ratio": (sum(o.cached for o in hits) / len(hits)) if hits else None,
            "retried_after_refusal": sum(o.retries for o in outcomes),
            "refusals": _refusals(self.retry_afters),
            # over the whole run: with --rate, refused clients are still being served after the sending period
            "misses_per_s": sum(o.kind in ("stream", "whole") and o.ok for o in outcomes) / wall if wall else None,
            "admitted_p99_s": _pct([o.admitted_s for o in healthy if o.kind in ("stream", "whole") and o.ok
                                    and o.admitted_s is not None], 99),
            "lost": [asdict(o) for o in (lost + bad_malformed)[:50]],
            "reloads": self.reloads,
            "failed_reloads": len(failed_reloads),
            "windows": windows,
            "samples": self.samples,
            "drift": drift(self.samples, windows, outcomes, period),
        }
        return report


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _refusals(retry_afters: list[float]) -> dict[str, Any]:
    """How many refusals (429/503 with Retry-After) the clients met and the Retry-After they carried."""
    return {"count": len(retry_afters), "retry_after_min_s": min(retry_afters, default=None),
            "retry_after_p50_s": _pct(retry_afters, 50), "retry_after_max_s": max(retry_afters, default=None)}


def _windows(outcomes: list[Outcome], window_s: float, wall: float) -> list[dict[str, Any]]:
    """Per window (by start time): requests, healthy failures, p50/p99 of the healthy misses' latency."""
    out = []
    n = max(1, math.ceil(wall / window_s))
    for i in range(n):
        lo, hi = i * window_s, (i + 1) * window_s
        inside = [o for o in outcomes if lo <= o.t < hi]
        misses = [o.latency_s for o in inside if o.kind in ("stream", "whole") and o.ok]
        out.append({"start_s": lo, "requests": len(inside), "failed": sum(not o.ok for o in inside),
                    "misses": len(misses), "p50_s": _pct(misses, 50), "p99_s": _pct(misses, 99)})
    return out


def drift(samples: list[dict[str, float]], windows: list[dict[str, Any]], outcomes: list[Outcome],
          wall: float) -> dict[str, Any]:
    """RSS of the last 5 minutes / minutes 2-5, fds and threads last (the final sample, once the last
    requests finished) / first, each window's p99 after the first 10 minutes / theirs, over the
    `wall` seconds requests were sent (spans scaled to a run shorter than 15 minutes)."""
    scale = min(1.0, wall / 900.0)
    early = (120 * scale, 300 * scale)
    late = wall - 300 * scale

    def median(key: str, lo: float, hi: float) -> float | None:
        vals = [s[key] for s in samples if key in s and lo <= s["t"] <= hi]
        return float(np.median(vals)) if vals else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    rss_early, rss_late = median("rss", *early), median("rss", late, wall)
    firsts = {k: next((s[k] for s in samples if k in s), None) for k in ("fds", "threads", "rss")}
    lasts = {k: next((s[k] for s in reversed(samples) if k in s), None) for k in ("fds", "threads", "rss")}
    ref_span = 600 * scale
    ref = _pct([o.latency_s for o in outcomes if o.kind in ("stream", "whole") and o.ok and o.t < ref_span], 99)
    later = [w["p99_s"] for w in windows if w["start_s"] >= ref_span and w["p99_s"] is not None]
    return {
        "spans_s": {"rss_early": list(early), "rss_late": [late, wall], "p99_reference": [0, ref_span]},
        "rss_early_bytes": rss_early, "rss_late_bytes": rss_late, "rss_late_over_early": ratio(rss_late, rss_early),
        "rss_peak_bytes": max((s["rss"] for s in samples if "rss" in s), default=None),
        "fds_first": firsts["fds"], "fds_last": lasts["fds"],
        "fds_max": max((s["fds"] for s in samples if "fds" in s), default=None),
        "threads_first": firsts["threads"], "threads_last": lasts["threads"],
        "threads_max": max((s["threads"] for s in samples if "threads" in s), default=None),
        "p99_reference_s": ref,
        "p99_max_window_over_reference": ratio(max(later), ref) if later else None,
    }


def run_soak(cfg: SoakConfig, json_out: str | None = None, plot_out: str | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run a soak, write its JSON and plot, and raise ForgeError (after writing them) when a healthy
    request was lost, a malformed one was not refused with a 4xx, or a reload failed."""
    with quiet_logger("httpx"):  # one INFO line per request otherwise
        report = Soak(cfg, progress).run()
    if json_out:
        atomic_write_json(json_out, report)
    if plot_out:
        plot(report, plot_out)
    problems = []
    if report["lost_healthy"]:
        first = next(o for o in report["lost"] if o["kind"] in ("stream", "whole", "hit"))
        problems.append(f"{report['lost_healthy']} healthy request(s) lost (first: {first['kind']} {first['fmt']} "
                        f"at {first['t']:.0f} s: {first['reason'][:120]})")
    if report["malformed_not_4xx"]:
        problems.append(f"{report['malformed_not_4xx']} malformed request(s) not answered 4xx")
    if report["failed_reloads"]:
        problems.append(f"{report['failed_reloads']} reload(s) failed")
    if problems:
        raise ForgeError("soak failed: " + "; ".join(problems))
    return report
