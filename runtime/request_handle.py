"""A request submitted to the scheduler: its `Handle` (final audio chunks as they come, the result,
cancellation, listeners; thread-safe and asyncio-friendly), the scheduler's refusals and the one-line
error a request ends with (`request_error`). The scheduler (runtime.scheduler) fills the handles.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np

from chattts_forge.errors import ArtifactChanged, Busy, ForgeError, Unavailable
from chattts_forge.log import get_logger
from chattts_forge.runtime.pipeline import Result

log = get_logger(__name__)

_END = object()  # the end of a handle's chunk queue


class QueueFullError(Busy):
    """`submit` refused a request because `max_queue` requests already wait (a service answers 429)."""


class SchedulerClosedError(Unavailable):
    """The scheduler was closed (its version is being retired): the request may be retried elsewhere."""


class Handle:
    """One request: its audio chunks as they become final, its result, its cancellation."""

    def __init__(self, request_id: int, text: str, normalized: bool = False, lookahead_frames: int | None = None) -> None:
        self.id = request_id
        self.text = text
        self.normalized = normalized  # the caller normalised (or refined) `text`: used as it is
        self.lookahead_frames = lookahead_frames  # mel frames its stream waits for (None: exact)
        self.submitted = time.perf_counter()
        self.first_audio: float | None = None  # seconds from submit to the first non-empty chunk
        self.finished: float | None = None  # seconds from submit to the end
        self._chunks: queue.Queue[Any] = queue.Queue()
        self._done = threading.Event()
        # The scheduler and its decode worker may both end a request (cancelled vs decoded): the first wins.
        self._end_lock = threading.Lock()
        self._result: Result | None = None
        self._error: BaseException | None = None
        self.cancelled = False
        self._listeners: list[Any] = []  # called after every chunk and at the end (add_listener)

    def add_listener(self, callback: Any) -> None:
        """`callback()` after every chunk and at the end, on the scheduler's threads (keep it short: e.g.
        `loop.call_soon_threadsafe(event.set)`, so an asyncio server waits without polling). The handle
        lets go of its listeners when it ends: a listener that refers back to the handle (a waiter's
        bound method) would otherwise make a cycle that keeps the result's arrays until the garbage
        collector's next full pass, hundreds of requests later under load."""
        with self._end_lock:
            ended = self._done.is_set()
            if not ended:
                self._listeners.append(callback)
        if ended:
            callback()

    def _notify(self, listeners: list[Any] | None = None) -> None:
        for callback in list(self._listeners if listeners is None else listeners):
            try:
                callback()
            except Exception as e:  # noqa: BLE001 - a listener's failure must not stop the scheduler
                log.warning("request %d: listener failed: %s", self.id, e)

    # ---- producer side (the scheduler) ----
    def _emit(self, chunk: np.ndarray) -> None:
        with self._end_lock:
            if self._done.is_set():  # ended (cancelled, failed): nothing after its end
                return
            if len(chunk) and self.first_audio is None:
                self.first_audio = time.perf_counter() - self.submitted
            self._chunks.put(chunk)
        self._notify()

    def _finish(self, result: Result | None = None, error: BaseException | None = None) -> bool:
        """End the request once; False when it had already ended (the later end is dropped)."""
        with self._end_lock:
            if self._done.is_set():
                return False
            self._result, self._error = result, error
            self.finished = time.perf_counter() - self.submitted
            self._chunks.put(_END)
            self._done.set()
            listeners, self._listeners = self._listeners, []  # the last call: no cycle outlives the request
        self._notify(listeners)
        return True

    # ---- consumer side ----
    def cancel(self) -> None:
        """Stop this request: its row is freed before the next GPT step; `result()` raises."""
        self.cancelled = True

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request ended (True) or `timeout` passed (False)."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> Result:
        """The whole result once the request ended; its ForgeError if it failed or was cancelled."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def next_chunk(self, timeout: float | None = None) -> np.ndarray | None:
        """The next final chunk, None at the end (the request's error raised instead, if it failed);
        `queue.Empty` when none arrived within `timeout` (0: do not wait; for polling from asyncio)."""
        item = self._chunks.get_nowait() if timeout == 0 else self._chunks.get(timeout=timeout)
        if item is _END:
            self._chunks.put(_END)  # the end stays visible to later calls
            if self._error is not None:
                raise self._error
            return None
        return item

    def chunks(self, timeout: float | None = None) -> Iterator[np.ndarray]:
        """Audio chunks (float32) as they become final; raises the request's error at the end."""
        while True:
            item = self._chunks.get(timeout=timeout)
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            yield item

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        loop = asyncio.get_running_loop()
        while True:
            item = await loop.run_in_executor(None, self._chunks.get)
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            yield item


def one_line(e: BaseException) -> str:
    """An exception's message on one line, at most 500 characters (its type's name when it has none)."""
    text = " ".join(str(e).split())
    return text[:500] or type(e).__name__


def request_error(handle: Handle, e: BaseException) -> ForgeError:
    """The one-line error a request ends with when something failed for it alone (a ForgeError's own
    message; any other exception named by its type, so a bug is visible without a traceback)."""
    if isinstance(e, ForgeError):  # a changed artifact stays one: a server tells it from a bad request
        kind = ArtifactChanged if isinstance(e, ArtifactChanged) else ForgeError
        return kind(f"request {handle.id}: {one_line(e)}")
    log.error("request %d failed: %s: %s", handle.id, type(e).__name__, one_line(e))
    return ForgeError(f"request {handle.id} failed ({type(e).__name__}: {one_line(e)})")
