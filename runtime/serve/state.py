"""The server's state: the versions it serves and how they change, the memory guard's actions, the
figures /metrics reads (the HTTP side is serve.app).

Versions (`ServerState`): `reload` loads and verifies the new version beside the old one and warms
it, then new requests go to it (with `canary_share`, that share of them until `promote`); requests
already admitted finish on the version that admitted them, which is closed once they have (bounded
by `drain_s`). A version that fails to load leaves the old one serving (the reload answers 422).
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from chattts_forge.errors import ArtifactChanged, Conflict, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.heap import release_free_heap
from chattts_forge.runtime.serve.config import ServeConfig, ensure_admin_token
from chattts_forge.runtime.serve.engine import ServedVersion
from chattts_forge.runtime.serve.guard import NORMAL, DrainRate, HeapTrimmer, MemoryGuard, memory_warning
from chattts_forge.runtime.serve.metrics import Metrics
from chattts_forge.runtime.serve.voices import load_voices

log = get_logger(__name__)


def start_all_threads(pool: ThreadPoolExecutor, n: int) -> None:
    """Start the pool's `n` threads now (it starts them on demand), so the process's thread count is
    what it serves with from the first request on: a soak reads a rising count as a leak."""
    barrier = threading.Barrier(n)
    for f in [pool.submit(barrier.wait) for _ in range(n)]:
        f.result()


def work_threads() -> int:
    """Threads of the server's request-work pool: the machine's cores, at least two (a long refinement
    never holds up every whole decode)."""
    return max(2, os.cpu_count() or 2)


class ServerState:
    """The serving version(s), the metrics and the switches; shared by the app's handlers."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.current: ServedVersion | None = None
        self.canary: ServedVersion | None = None
        self.ready = False
        self.draining = False
        self.load_error: str | None = None
        self.fault: str | None = None  # why a loaded version stopped being ready (a file changed on disk)
        self.retired = 0  # versions closed and freed after a reload, promote or rollback
        self._retired_lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._swap_lock = threading.Lock()  # which version new requests go to (acquire, swaps)
        ensure_admin_token(cfg)
        self._voices = load_voices(cfg.voices_file)
        self.metrics = Metrics(self._waiting, self._running, lambda: 1.0 if self.ready and not self.draining else 0.0,
                               routing=lambda: getattr(getattr(self.current, "router", None), "autotune", None))
        self._rng = random.Random(cfg.seed)
        self.drain: dict[str, DrainRate] = {}  # per variant name: what Retry-After derives from
        self._drain_lock = threading.Lock()
        self.guard: MemoryGuard | None = None
        if cfg.memory_limit is not None:
            import psutil

            proc = psutil.Process()
            self.guard = MemoryGuard(cfg.memory_limit, lambda: proc.memory_info().rss, lower_batch=self._lower_batch,
                                     evict=self._evict, long_chars=cfg.memory_long_chars,
                                     decoders=work_threads()).start()  # whole decodes run on the work pool
        self.metrics.operations(self.operations)
        # Request work off the event loop (prepare: normalise, route, refine, a cache hit's Vocos; whole
        # decodes) on as many threads as cores: more run no faster on the cores they share, and each
        # concurrent Decoder/Vocos run holds buffers of its own (asyncio's default pool of cores + 4
        # grew a soak's RSS without bound: docs/measurements/2026-12-04-epyc/soak/README.md).
        threads = work_threads()
        self.work = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="forge-work")
        start_all_threads(self.work, threads)
        self.trimmer = HeapTrimmer(cfg.heap_trim_s).start() if cfg.heap_trim_s > 0 else None
        if self.trimmer is not None:  # its thread holds no reference to the state: stop it with the state
            weakref.finalize(self, self.trimmer.stop)

    @property
    def heap_trims(self) -> int:
        return self.trimmer.trims if self.trimmer is not None else 0

    # ---- what operators watch, and what keeps the process inside its limits ---------------------

    def drain_rate(self, variant: str) -> DrainRate:
        with self._drain_lock:
            if variant not in self.drain:
                self.drain[variant] = DrainRate()
            return self.drain[variant]

    def retry_after(self, variant: str | None, depth: int) -> int:
        """Seconds for `depth` requests to drain at the variant's measured rate (Retry-After)."""
        if variant is None:
            return self.cfg.retry_after_s
        return self.drain_rate(variant).retry_after(depth, self.cfg.retry_after_s)

    def batch_limit(self) -> int:
        """The rows a GPT batch may hold now: halved while the memory guard sheds."""
        if self.guard is not None and self.guard.level > NORMAL:
            return max(1, self.cfg.max_batch // 2)
        return self.cfg.max_batch

    def _lower_batch(self, lower: bool) -> None:
        self._apply_batch_limit()

    def _apply_batch_limit(self) -> None:
        limit = self.batch_limit()
        for version in self._live():
            for sched in version.schedulers.values():
                if hasattr(sched, "max_batch"):  # a SequentialRunner runs one request at a time anyway
                    sched.max_batch = limit  # rows running finish; fewer join between steps

    def _evict(self) -> int:
        freed = 0
        for version in self._live():
            if version.file_cache is not None:
                freed += version.file_cache.evict()
        gc.collect()
        return freed

    def operations(self) -> dict[str, Any]:
        """What /metrics shows an operator beyond the counters (serve.metrics `operations`)."""
        variants: dict[str, dict[str, Any]] = {}
        for version in self._live():
            for name, sched in list(version.schedulers.items()):
                row = variants.setdefault(name, {"waiting": 0, "running": 0, "batch_limit": 0, "drain_rate": None})
                row["waiting"] += sched.waiting
                row["running"] += sched.running
                row["batch_limit"] = max(row["batch_limit"], getattr(sched, "max_batch", 1))
        for name, row in variants.items():
            row["drain_rate"] = self.drain_rate(name).rate()
        memory = None
        if self.guard is not None:
            g = self.guard
            memory = {"limit": g.limit, "peak_rss": g.peak_rss, "level": g.level, "reserved": g.reserved,
                      "floor": g.floor, "shed": dict(g.shed.counts)}
        return {"variants": variants, "memory": memory}

    def _live(self) -> list[ServedVersion]:
        return [v for v in (self.current, self.canary) if v is not None]

    def _waiting(self) -> float:
        return float(sum(v.waiting for v in self._live()))

    def _running(self) -> float:
        return float(sum(v.running for v in self._live()))

    def misses_in_flight(self) -> int:
        """Requests waiting in or running on any live version's schedulers."""
        return int(self._waiting() + self._running())

    # ---- loading and swapping ---------------------------------------------------------------------

    def open_version(self, path: str) -> ServedVersion:
        """Load, verify and warm a version (nothing serves it yet)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        # One folder for the version's whole life: a `current` link switched while it loads or serves
        # (a variant opened on first use) must not mix two versions' files into one.
        version = ServedVersion(Path(path).resolve(), cfg, self._voices,
                                release_free_rows=self.guard.near_limit if self.guard is not None else None)
        try:
            phrases = version.file_cache.texts()[: cfg.warm_phrases] if version.file_cache is not None else []
            warmed = version.warm(phrases)
        except BaseException:
            version.close()
            raise
        log.info("loaded %s (%s; variants %s) in %.1f s, warmed with %d request(s)", version.model_id, path,
                 ", ".join(version.pipes), time.perf_counter() - t0, warmed)
        if self.guard is not None:  # what the build measured of the routed variants against the limit
            warning = memory_warning(version.memory_figures(), self.guard.limit, cfg.max_batch)
            if warning is not None:
                log.warning("%s", warning)
        return version

    def load_initial(self) -> None:
        try:
            self.current = self.open_version(self.cfg.artifact)
            self.ready = True
        except ForgeError as e:
            self.load_error = str(e)
            log.error("cannot serve %s: %s", self.cfg.artifact, e)

    def reload(self, path: str) -> dict[str, Any]:
        """Swap to the version at `path` (see the module docstring); ForgeError leaves the old one serving."""
        if not self._reload_lock.acquire(blocking=False):
            raise Conflict("a reload is already running")
        try:
            try:
                new = self.open_version(path)
            except ForgeError as e:
                self.metrics.reloads.labels(result="failed").inc()
                raise ForgeError(f"reload of {path} failed, still serving "
                                 f"{self.current.model_id if self.current else 'nothing'}: {e}") from None
            with self._swap_lock:
                old_canary = self.canary
                old = None
                if self.cfg.canary_share > 0 and self.current is not None:
                    self.canary = new
                    mode = f"canary ({self.cfg.canary_share:.0%} of new requests)"
                else:
                    old, self.current, self.canary = self.current, new, None
                    mode = "all new requests"
                    self.ready = True
            self._apply_batch_limit()
            self._retire(old)
            self._retire(old_canary)
            self.cfg.artifact = path
            self.load_error = self.fault = None
            self.metrics.reloads.labels(result="ok").inc()
            log.info("reload: %s now serves %s", new.model_id, mode)
            return {"model": new.model_id, "artifact": path, "serves": mode}
        finally:
            self._reload_lock.release()

    def promote(self) -> dict[str, Any]:
        if self.canary is None:
            raise ForgeError("no canary version to promote (reload with --canary-share first)")
        with self._swap_lock:
            old, self.current, self.canary = self.current, self.canary, None
        self._retire(old)
        return {"model": self.current.model_id, "serves": "all new requests"}

    def rollback(self) -> dict[str, Any]:
        if self.canary is None:
            raise ForgeError("no canary version to roll back")
        with self._swap_lock:
            old, self.canary = self.canary, None
        self._retire(old)
        assert self.current is not None
        return {"model": self.current.model_id, "serves": "all new requests"}

    def _retire(self, version: ServedVersion | None) -> None:
        """Close a version once its admitted requests have finished (in the background, bounded), then
        free it and give its heap back: without the trim, each reload left RSS a step higher (glibc
        keeps the freed pages of the version's sessions)."""
        if version is None:
            return
        held = [version]  # the thread's only reference, dropped before the heap is trimmed

        def run() -> None:
            old = held.pop()
            if not old.drain(self.cfg.drain_s):
                log.warning("%s: %d request(s) still running after %.0f s; closing it", old.model_id,
                            old.inflight, self.cfg.drain_s)
            old.close()
            name = old.model_id
            del old
            gc.collect()  # sessions held in reference cycles are freed now, not at a later collection
            release_free_heap()
            log.info("closed the previous version %s", name)
            with self._retired_lock:  # a reload may retire the old version and an old canary at once
                self.retired += 1

        threading.Thread(target=run, name="forge-retire", daemon=True).start()

    def acquire(self) -> ServedVersion:
        """The version a new request goes to (the canary's share of them to the canary), counted as
        running on it: picking and counting under the swap lock, a version being retired is never
        picked after its drain began."""
        with self._swap_lock:
            if self.canary is not None and self._rng.random() < self.cfg.canary_share:
                version = self.canary
            else:
                assert self.current is not None
                version = self.current
            version.begin()
            return version

    def artifact_changed(self, e: ArtifactChanged) -> None:
        """A served file changed on disk: not ready (/readyz 503, new requests 503) until a reload."""
        if self.ready:
            log.error("not ready: %s (reload a good version: POST /admin/reload or SIGHUP)", e)
        self.ready = False
        self.fault = f"the served artifact changed on disk: {e}"

    def shutdown(self) -> None:
        self.draining = True
        if self.trimmer is not None:
            self.trimmer.stop()
        if self.guard is not None:
            self.guard.stop()
        for v in self._live():
            v.close(self.cfg.drain_s)
        self.work.shutdown(wait=False)
