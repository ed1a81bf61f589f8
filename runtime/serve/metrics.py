"""The server's Prometheus metrics (one registry per app, so several apps in one process do not mix).

| metric | type | what |
| --- | --- | --- |
| forge_queue_depth | gauge | requests waiting in the schedulers of the serving version(s) |
| forge_running_rows | gauge | rows of the running GPT batches |
| forge_request_seconds | histogram | request -> its last byte (label `cached`: served from a phrase cache) |
| forge_first_audio_seconds | histogram | request -> its first audio byte |
| forge_rtf | histogram | per request: seconds taken / seconds of audio |
| forge_sentences_total | counter | requests answered with audio (sentences/s: `rate()` of it) |
| forge_audio_seconds_total | counter | seconds of audio sent |
| forge_phrase_cache_hits_total / _misses_total | counter | look-ups by tier (`file`, `redis`) |
| forge_errors_total | counter | failed requests by `kind` (bad_request, queue_full, memory, deadline, disconnect, not_ready, internal, admin, reload_failed) |
| forge_requests_total | counter | responses by `endpoint` and `status` |
| forge_text_removed_chars_total | counter | characters of requests' text that could not be spoken and were removed (reported to the client in `X-Forge-Removed`) |
| forge_text_segments_total | counter | segments spoken (a long input is cut into several) |
| forge_rss_bytes | gauge | resident memory of the server process |
| forge_process_cpu_seconds | gauge | CPU seconds (user + system, every thread) the server process has used |
| forge_ready | gauge | 1 once the version is loaded, verified and warmed |
| forge_reloads_total | counter | version swaps by `result` (ok, failed) |
| forge_connections_refused_total | counter | connections closed before a request ran, by `kind`: header_timeout (slow headers), too_many_connections (past --max-connections), bad_http (malformed request) |
| forge_open_fds / forge_threads | gauge | open file descriptors / threads of the server process (flat over a soak; a rise is a leak) |
| forge_stage_depth | gauge | per `variant` and `stage` (waiting: queued; running: rows of its GPT batch) |
| forge_batch_limit | gauge | per `variant`: rows its GPT batch may hold now (`--max-batch`, halved while memory is short) |
| forge_drain_rate | gauge | per `variant`: requests finished per second over the last 30 s (what Retry-After derives from) |
| forge_memory_limit_bytes / forge_memory_peak_rss_bytes / forge_memory_level | gauge | with `--memory-limit`: the limit, the highest RSS sampled, 0 normal / 1 shedding / 2 refusing |
| forge_memory_reserved_bytes / forge_memory_floor_bytes | gauge | with `--memory-limit`: what the admitted misses reserved (each what it adds at most), and what the process holds besides: a miss is admitted while floor + reserved + its own stays under 85% of the limit |
| forge_shed_total | counter | with `--memory-limit`: what was shed, by `action` (batch, evict, refuse_budget: a miss over the ledger's budget, refuse_long, refuse_queue: a short miss that would queue while shedding, refuse; serial: a long miss admitted while shedding, none other in flight) |
| forge_route | gauge | 1 per length bucket of a version folder: the `variant` it routes to on this host, the build's (`build_variant`), the choice's `source` (measured, cache, build) and its `reason` (runtime.autotune) |
| forge_route_step_ratio / _spread | gauge | per bucket and passing `variant`: its decode step over the `reference`'s as the host's autotune measured it, and that ratio's spread (90% interval half-width) |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10)


class Metrics:
    def __init__(self, queue_depth: Callable[[], float], running_rows: Callable[[], float],
                 ready: Callable[[], float], routing: Callable[[], dict[str, Any] | None] | None = None) -> None:
        import psutil

        self.registry = CollectorRegistry()
        r = self.registry
        proc = psutil.Process()
        Gauge("forge_queue_depth", "Requests waiting in the schedulers", registry=r).set_function(queue_depth)
        Gauge("forge_running_rows", "Rows of the running GPT batches", registry=r).set_function(running_rows)
        Gauge("forge_rss_bytes", "Resident memory of the server process", registry=r).set_function(
            lambda: proc.memory_info().rss)
        Gauge("forge_process_cpu_seconds", "CPU seconds (user + system) of the server process", registry=r
              ).set_function(lambda: sum(proc.cpu_times()[:2]))
        Gauge("forge_ready", "1 once loaded, verified and warmed", registry=r).set_function(ready)
        Gauge("forge_open_fds", "Open file descriptors of the server process", registry=r).set_function(proc.num_fds)
        Gauge("forge_threads", "Threads of the server process", registry=r).set_function(proc.num_threads)
        self.latency = Histogram("forge_request_seconds", "Request to last byte", ["cached"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.first_audio = Histogram("forge_first_audio_seconds", "Request to first audio byte",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("forge_rtf", "Seconds taken per second of audio", buckets=_RTF_BUCKETS, registry=r)
        self.sentences = Counter("forge_sentences", "Requests answered with audio", registry=r)
        self.audio_seconds = Counter("forge_audio_seconds", "Seconds of audio sent", registry=r)
        self.cache_hits = Counter("forge_phrase_cache_hits", "Phrase-cache hits", ["tier"], registry=r)
        self.cache_misses = Counter("forge_phrase_cache_misses", "Phrase-cache misses", ["tier"], registry=r)
        self.errors = Counter("forge_errors", "Failed requests by kind", ["kind"], registry=r)
        self.requests = Counter("forge_requests", "Responses by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.removed_chars = Counter("forge_text_removed_chars", "Characters removed from requests' text as unspeakable",
                                     registry=r)
        self.segments = Counter("forge_text_segments", "Segments spoken (a long input is cut into several)",
                                registry=r)
        self.reloads = Counter("forge_reloads", "Version swaps", ["result"], registry=r)
        self.connections_refused = Counter("forge_connections_refused", "Connections closed before any request ran, "
                                           "by why (header_timeout, too_many_connections, bad_http)", ["kind"],
                                           registry=r)
        if routing is not None:
            r.register(_RoutingCollector(routing))

    def operations(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """The operator's live view (queue depth per stage, drain rate, memory against its limit, what
        was shed), read from `snapshot()` at every scrape (ServerState.operations)."""
        self.registry.register(_OperationsCollector(snapshot))

    def served(self, seconds: float, audio_s: float, cached: bool) -> None:
        self.latency.labels(cached=str(cached).lower()).observe(seconds)
        self.sentences.inc()
        self.audio_seconds.inc(audio_s)
        if audio_s > 0:
            self.rtf.observe(seconds / audio_s)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _RoutingCollector:
    """The serving version's host routing choice (`Router.autotune`), read at every scrape."""

    def __init__(self, routing: Callable[[], dict[str, Any] | None]) -> None:
        self.routing = routing

    def describe(self) -> list[Any]:
        return []  # unchecked: the label sets depend on the version served

    def collect(self) -> Iterator[GaugeMetricFamily]:
        record = self.routing()
        route = GaugeMetricFamily("forge_route", "The variant a length bucket routes to on this host, and why",
                                  labels=["bucket", "variant", "build_variant", "source", "reason"])
        ratio = GaugeMetricFamily("forge_route_step_ratio", "A passing variant's decode step over the reference's "
                                  "(host autotune)", labels=["bucket", "variant", "reference"])
        spread = GaugeMetricFamily("forge_route_step_ratio_spread", "Half-width of that ratio's 90% interval",
                                   labels=["bucket", "variant", "reference"])
        for name, b in ((record or {}).get("buckets") or {}).items():
            route.add_metric([name, b["variant"], b["build_variant"], record["source"], b["reason"]], 1.0)
            comparison = b.get("comparison") or {}
            for variant, c in (comparison.get("candidates") or {}).items():
                ratio.add_metric([name, variant, comparison["reference"]], c["ratio"])
                spread.add_metric([name, variant, comparison["reference"]], c["spread"])
        yield route
        yield ratio
        yield spread


class _OperationsCollector:
    """Per-variant queue stages and drain rate, the memory guard's state, shed counts (one snapshot a scrape)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        snap = self.snapshot()
        stage = GaugeMetricFamily("forge_stage_depth", "Requests per variant and stage (waiting: queued; running: "
                                  "rows of the GPT batch)", labels=["variant", "stage"])
        batch = GaugeMetricFamily("forge_batch_limit", "Rows the variant's GPT batch may hold now (lowered under "
                                  "memory pressure)", labels=["variant"])
        drain = GaugeMetricFamily("forge_drain_rate", "Requests the variant finished per second (last 30 s; "
                                  "Retry-After derives from it)", labels=["variant"])
        for variant, row in sorted(snap["variants"].items()):
            stage.add_metric([variant, "waiting"], row["waiting"])
            stage.add_metric([variant, "running"], row["running"])
            batch.add_metric([variant], row["batch_limit"])
            if row["drain_rate"] is not None:
                drain.add_metric([variant], row["drain_rate"])
        yield stage
        yield batch
        yield drain
        memory = snap.get("memory")
        if memory is not None:
            yield GaugeMetricFamily("forge_memory_limit_bytes", "serve --memory-limit", value=memory["limit"])
            yield GaugeMetricFamily("forge_memory_peak_rss_bytes", "Highest RSS the memory guard sampled",
                                    value=memory["peak_rss"])
            yield GaugeMetricFamily("forge_memory_level", "0 normal, 1 shedding (batch lowered, caches emptied, "
                                    "long requests refused), 2 refusing every new miss", value=memory["level"])
            yield GaugeMetricFamily("forge_memory_reserved_bytes", "Bytes the admitted misses reserved (what they "
                                    "add at most)", value=memory["reserved"])
            yield GaugeMetricFamily("forge_memory_floor_bytes", "What the process holds besides the reservations",
                                    value=memory["floor"])
            shed = CounterMetricFamily("forge_shed", "What the memory guard shed, by action (batch, evict, "
                                       "refuse_budget, refuse_long, refuse_queue, refuse, serial)", labels=["action"])
            for action, n in sorted(memory["shed"].items()):
                shed.add_metric([action], n)
            yield shed
