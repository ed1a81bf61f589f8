"""What keeps a long-running server inside its limits: the queue's measured drain rate (the
Retry-After of a refusal) and the memory ceiling (`serve --memory-limit SIZE`).

`DrainRate`: requests a variant's scheduler finished in the last `window_s` seconds, per second. A
429 (queue full) or a 503 (memory) says `Retry-After: ceil(depth / rate)` seconds, `depth` being the
requests ahead of a retry: by then the queue has drained that many at the measured rate. Without a
measurement yet (nothing finished) the configured `retry_after_s` stands in.

`MemoryGuard` keeps the process under the limit before the kernel would act (the kernel's OOM killer
sees only RSS; a cap by `setrlimit(RLIMIT_AS)` would fail onnxruntime's address-space reservations
long before RSS reaches it).

Admissions first, by a ledger: every miss reserves what it can add at most
(`runtime.memory.request_memory`: its key/value row, generation state and result, held while it
runs, the scheduler giving a free row's pages back; and its whole decode's working set, of which
only the largest `decoders` count: no more decode at once). A miss is admitted only while the floor
plus the ledger, its own included, stays under `SOFT` x limit ("refuse_budget" otherwise), so a
burst cannot carry RSS past the marks between two samples. The floor is what the process holds
besides the reservations: the RSS whenever nothing is reserved, and while misses run the highest
`RSS - ledger` seen since (buffers that stay, estimates that fell short). With nothing reserved a
miss is admitted (a limit under the floor plus one request still serves, one at a time).

Then the levels, for what the estimates miss: a thread samples RSS every `interval_s` (over
`RESUME` x limit, after trimming the C heap when a request ended since the last sample, so what it
freed is not read as held):

- from `SOFT` x limit ("shed"): the running batch of every scheduler is halved (rows running finish;
  fewer join), the in-memory caches are emptied (the phrase caches' decoded mels; then the C heap is
  trimmed), and new long requests (text over `long_chars`) get 503 with Retry-After, as do short
  ones that would have to queue for a row;
- from `HARD` x limit ("refuse"): every new miss gets 503 (cache hits, which need no GPT row, are served);
- below `RESUME` x limit: back to normal (the batch restored). Admitted requests always finish.

The process keeps buffers its working set needed (onnxruntime's arenas, what a trim cannot give
back), so RSS may stay over a mark with nothing running. While shedding, a long miss is admitted
when no other miss is waiting, running or reserved ("serial"), so long texts are served one at a
time instead of never. While refusing with nothing in flight, the C heap is trimmed (at most every
`IDLE_TRIM_S`), so RSS falls to what the process holds idle and the level follows it; a limit under
that is logged as an error once: nothing is admitted over 95% (the ceiling comes first).

At start, `memory_warning` compares the limit with what the build measured of the routed variants
(routing.json `variants[v].memory`: each variant's peak RSS through load and a synthesis at batch 1
and 8, in a process of its own): one warning line when their figures at `--max-batch` (linear in the
rows between and beyond the measured batch sizes), summed in one process, exceed `SOFT` x limit, the
most the ledger admits up to: the limit will shed before the configured batch runs.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chattts_forge.errors import BadInput
from chattts_forge.log import get_logger
from chattts_forge.runtime.heap import release_free_heap

log = get_logger(__name__)

NORMAL, SHED, REFUSE = 0, 1, 2
LEVEL_NAMES = {NORMAL: "normal", SHED: "shed", REFUSE: "refuse"}
MAX_RETRY_AFTER_S = 120  # a Retry-After longer than this tells a client nothing it can use

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size such as `6G`, `512M`, `6GiB`, `1500000000` (K/M/G/T are powers of 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise BadInput(f"a size is a number with an optional K, M, G or T suffix (e.g. 6G, 512M), got {text!r}")
    scale = 1024 ** "bkmgt".index((m.group(2) or "b").lower())
    size = int(float(m.group(1)) * scale)
    if size < 1:
        raise BadInput(f"a size must be at least 1 byte, got {text!r}")
    return size


class DrainRate:
    """Completions per second over the last `window_s` seconds (thread-safe; `clock` for tests)."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._done: deque[float] = deque()
        self._lock = threading.Lock()
        self._since = clock()

    def completed(self) -> None:
        with self._lock:
            self._done.append(self.clock())
            self._trim()

    def _trim(self) -> None:
        cutoff = self.clock() - self.window_s
        while self._done and self._done[0] < cutoff:
            self._done.popleft()

    def rate(self) -> float | None:
        """Completions per second, or None before any completion in the window."""
        with self._lock:
            self._trim()
            if not self._done:
                return None
            # over the window, or the time since measuring began when that is shorter
            span = min(self.window_s, max(self.clock() - self._since, 1e-3))
            return len(self._done) / span

    def retry_after(self, depth: int, fallback_s: int) -> int:
        """Seconds until `depth` more requests have drained at the measured rate (1..MAX_RETRY_AFTER_S)."""
        rate = self.rate()
        if rate is None:
            return max(1, fallback_s)
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(max(depth, 1) / rate))))


class HeapTrimmer:
    """Trims the C heap every `interval_s` seconds on a thread of its own, until `stop`.

    glibc gives freed memory back only from the top of an arena; what a burst's buffers free inside
    one stays resident until trimmed, so RSS would keep the largest burst served so far
    (docs/measurements/2026-12-05-xeon/heap/README.md). A trim takes milliseconds.
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._stop = threading.Event()

    def start(self) -> HeapTrimmer:
        threading.Thread(target=self._run, name="forge-heap-trim", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            release_free_heap()
            self.trims += 1

    def stop(self) -> None:
        self._stop.set()


@dataclass
class ShedCounts:
    """What the guard did, by action (shown in /metrics as forge_shed_total{action})."""

    counts: dict[str, int] = field(
        default_factory=lambda: {"batch": 0, "evict": 0, "refuse_budget": 0, "refuse_long": 0, "refuse_queue": 0,
                                 "refuse": 0, "serial": 0})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, action: str) -> None:
        with self.lock:
            self.counts[action] = self.counts.get(action, 0) + 1


class Reservation:
    """What an admitted miss holds in its guard's ledger until `release` (idempotent) at its end."""

    def __init__(self, guard: MemoryGuard, held: int, decode: int) -> None:
        self.guard = guard
        self.held = held
        self.decode = decode

    def release(self) -> None:
        self.guard._release(self)


def _mib(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0 else None


def batch_figure(by_batch: dict[str, Any], batch: int) -> tuple[float, bool] | None:
    """(peak RSS MiB at `batch`, whether it was measured at that batch size) from figures per batch size
    (routing.json's `peak_rss_mb_by_batch`): linear in the rows between and beyond the two nearest
    measured sizes (the key/value cache and the activations grow with the rows); None without a figure."""
    points = sorted((int(k), v) for k, x in by_batch.items() if str(k).isdigit() and (v := _mib(x)) is not None)
    if not points:
        return None
    exact = dict(points).get(batch)
    if exact is not None:
        return exact, True
    if len(points) == 1:
        return points[0][1], False
    lower, upper = [p for p in points if p[0] < batch], [p for p in points if p[0] > batch]
    if lower and upper:  # between two measured sizes
        (b0, v0), (b1, v1) = lower[-1], upper[0]
    elif upper:  # below the smallest: the line through the two smallest
        (b0, v0), (b1, v1) = upper[0], upper[1]
    else:  # beyond the largest: the line through the two largest
        (b0, v0), (b1, v1) = lower[-2], lower[-1]
    return max(v0 + (v1 - v0) * (batch - b0) / (b1 - b0), 0.0), False


def memory_warning(figures: dict[str, Any], limit: int, max_batch: int) -> str | None:
    """One line when the routed variants' measured memory (`figures`: {variant: routing.json's `memory`
    record, or None}) at `max_batch` rows cannot stay under `MemoryGuard.SOFT` x `limit` bytes in one
    process (each variant's figure less the runtime's own start, `python_baseline_mb`, counted once);
    None when it can or nothing was recorded."""
    needs: dict[str, tuple[float, bool, float]] = {}
    steps = None
    for variant, record in sorted(figures.items()):
        if not isinstance(record, dict) or not isinstance(record.get("peak_rss_mb_by_batch"), dict):
            continue
        at = batch_figure(record["peak_rss_mb_by_batch"], max_batch)
        if at is None:
            continue
        needs[variant] = (*at, _mib(record.get("python_baseline_mb")) or 0.0)
        steps = steps or record.get("steps")
    if not needs:
        return None
    start = max(base for _, _, base in needs.values())
    total = start + sum(mib - base for mib, _, base in needs.values())
    room = MemoryGuard.SOFT * limit / 2**20
    if total <= room:
        return None
    shown = ", ".join(f"{v} {mib:.0f} MiB{'' if exact else ' (estimated from its batch-1 and batch-8 figures)'}"
                      for v, (mib, exact, _) in sorted(needs.items(), key=lambda kv: -kv[1][0]))
    together = f"; together ~{total:.0f} MiB in one process" if len(needs) > 1 else ""
    workload = f", {steps} steps a row" if isinstance(steps, int) else ""
    return (f"memory: --memory-limit {limit / 2**20:.0f} MiB cannot hold the routed variants at --max-batch "
            f"{max_batch}: peak RSS at batch {max_batch} (measured by the build{workload}) {shown}{together}, over "
            f"the {MemoryGuard.SOFT:.0%} of the limit the guard admits up to: it will halve the batch and refuse "
            "long texts")


class MemoryGuard:
    """Watches RSS against `limit` bytes, bounds admissions by a ledger and sheds (see the module docstring)."""

    SOFT, HARD, RESUME = 0.85, 0.95, 0.75
    IDLE_TRIM_S = 5.0

    def __init__(self, limit: int, rss: Callable[[], int], *, lower_batch: Callable[[bool], None],
                 evict: Callable[[], int], long_chars: int = 64, interval_s: float = 0.2, decoders: int = 3) -> None:
        self.limit = limit
        self.decoders = decoders  # whole decodes that may run at once (the server's decoding threads)
        self.rss = rss
        self.lower_batch = lower_batch  # True: lower every running batch; False: restore them
        self.evict = evict  # empties the in-memory caches; the bytes it freed
        self.long_chars = long_chars
        self.interval_s = interval_s
        self.level = NORMAL
        self.last_rss = 0
        self.peak_rss = 0
        self.reserved = 0  # the ledger: what the misses admitted and not yet ended may add (`_ledger`)
        self.floor = 0  # what the process holds besides the reservations (the module docstring)
        self._reservations: set[Reservation] = set()
        self._trim_pending = False  # a reservation ended: trim the heap before reading RSS
        self.shed = ShedCounts()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # One check at a time, actions included: a check() returns only once the transition it or a
        # concurrent check started (batch lowered, caches emptied) has been carried out.
        self._check_lock = threading.Lock()
        self._last_idle_trim = -math.inf
        self._told_idle = False

    def check(self) -> int:
        """Sample RSS once and move between levels, carrying out the transition; the level now."""
        with self._check_lock:
            return self._check()

    def _check(self) -> int:
        with self._lock:
            trim, self._trim_pending = self._trim_pending, False
        if trim:  # what an ended request freed inside the heap goes back before RSS is read
            release_free_heap()
        rss = self.rss()
        with self._lock:
            self.last_rss, self.peak_rss = rss, max(self.peak_rss, rss)
            self.floor = rss if not self._reservations else max(self.floor, rss - self.reserved)
            was = self.level
            if rss >= self.HARD * self.limit:
                level = REFUSE
            elif rss >= self.SOFT * self.limit:
                level = SHED
            elif rss < self.RESUME * self.limit:
                level = NORMAL
            else:  # between RESUME and SOFT: hold shedding (no flapping at the edge); refusing is over
                level = min(was, SHED)
            self.level = level
        if level > NORMAL and was == NORMAL:
            log.warning("memory: RSS %.0f MiB of the %.0f MiB limit: lowering the batch, emptying caches, "
                        "refusing new long requests", rss / 2**20, self.limit / 2**20)
            self.lower_batch(True)
            self.shed.add("batch")
            freed = self.evict()
            release_free_heap()
            self.shed.add("evict")
            log.info("memory: caches emptied (%.1f MiB of decoded entries)", freed / 2**20)
        elif level == NORMAL and was > NORMAL:
            log.info("memory: RSS %.0f MiB, under %.0f%% of the limit: batch restored", rss / 2**20, 100 * self.RESUME)
            self.lower_batch(False)
        if level == REFUSE and was != REFUSE:
            log.warning("memory: RSS %.0f MiB over %.0f%% of the limit: refusing every new miss", rss / 2**20,
                        100 * self.HARD)
        return level

    def admits(self, text_chars: int, in_flight: int, rows: int, need: int = 0, decode: int = 0) -> Reservation | None:
        """A reservation (`need` bytes held while it runs, `decode` bytes for its whole decode) if a new
        miss of `text_chars` characters may start now, else None; `in_flight` misses waiting or
        running, `rows` the running batch's limit now (a refusal, or a long miss admitted alone while
        shedding, "serial", is counted). The caller releases the reservation when the request ends.
        While shedding nothing queues: a miss that would wait for a row is refused (requests admitted
        before the mark still finish, and queued ones were the overshoot:
        docs/measurements/2026-12-05-xeon/README.md)."""
        level = self.level
        if level == REFUSE:
            if in_flight == 0:
                self._idle_trim()
            self.shed.add("refuse")
            return None
        if level == SHED and text_chars > self.long_chars and in_flight > 0:
            self.shed.add("refuse_long")
            return None
        if level == SHED and in_flight >= rows:
            self.shed.add("refuse_queue")
            return None
        res = self._reserve(Reservation(self, need, decode))
        if res is not None and level == SHED and text_chars > self.long_chars:
            self.shed.add("serial")
        return res

    def near_limit(self) -> bool:
        """RSS was over `RESUME` x limit at the last sample: the schedulers' free rows give their memory
        back (far from the limit a reused row's pages stay mapped, as without a limit); a request's
        end trims the heap (`_release`)."""
        return self.last_rss >= self.RESUME * self.limit

    def _ledger(self, reservations: set[Reservation]) -> int:
        """Bytes the reservations may still add: every one's held bytes, and the decodes of the largest
        `decoders` (no more run at once)."""
        decodes = sorted((r.decode for r in reservations), reverse=True)[: self.decoders]
        return sum(r.held for r in reservations) + sum(decodes)

    def _reserve(self, res: Reservation) -> Reservation | None:
        with self._lock:
            ledger = self._ledger(self._reservations | {res})
            # with nothing reserved the miss runs alone (the floor alone may be near the mark)
            if self._reservations and self.floor + ledger > self.SOFT * self.limit:
                self.shed.add("refuse_budget")
                return None
            self._reservations.add(res)
            self.reserved = ledger
        return res

    def _release(self, res: Reservation) -> None:
        with self._lock:
            if res in self._reservations:
                self._reservations.discard(res)
                self.reserved = self._ledger(self._reservations)
                # the floor's precision matters near the limit only (a trim holds the heap's locks)
                self._trim_pending = self.near_limit()

    def _idle_trim(self) -> None:
        """Refusing with nothing in flight: give the heap's free pages back, so the next check reads
        what the process holds idle; say once when that is over the refusing mark."""
        now = time.monotonic()
        if now - self._last_idle_trim < self.IDLE_TRIM_S:
            return
        self._last_idle_trim = now
        release_free_heap()
        rss = self.rss()
        if rss >= self.HARD * self.limit and not self._told_idle:
            self._told_idle = True
            log.error("memory: RSS %.0f MiB with nothing running is over %.0f%% of the %.0f MiB limit: every miss "
                      "is refused; raise --memory-limit above the idle RSS plus one request", rss / 2**20,
                      100 * self.HARD, self.limit / 2**20)

    def start(self) -> MemoryGuard:
        def run() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check()
                except Exception as e:  # noqa: BLE001 - the watcher must outlive one failed sample
                    log.error("memory guard: %s: %s", type(e).__name__, e)

        self.check()
        self._thread = threading.Thread(target=run, name="forge-memory-guard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
