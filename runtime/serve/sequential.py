"""The runner a served variant gets when the scheduler cannot batch it (no fused GPT graph): its
requests run one at a time on one worker thread, behind the scheduler's interface (serve.engine
starts one per such variant).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.pipeline import Pipeline, Result, SynthParams
from chattts_forge.runtime.request_handle import Handle, QueueFullError, SchedulerClosedError

log = get_logger(__name__)


class SequentialRunner:
    """The scheduler's interface for a variant the scheduler cannot batch (no fused GPT graph: fp16, or
    any variant on CUDA, where the runtime runs the plain graph): its requests run one at a time on one
    worker thread, each streamed exactly as `Pipeline.stream` (and `synth --stream`) streams it.
    `gpt_lock`: held for each run, since the run uses `pipe.gpt`, whose KV state refinement shares."""

    def __init__(self, pipe: Pipeline, max_queue: int = 64, gpt_lock: threading.Lock | None = None) -> None:
        self.pipe = pipe
        self.gpt_lock = gpt_lock if gpt_lock is not None else threading.Lock()
        self.max_queue = max_queue
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.running = 0
        self.steps = 0

    @property
    def kv_itemsize(self) -> int:
        return 4  # the plain GPT graph's float32 cache

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def start(self) -> SequentialRunner:
        self._thread = threading.Thread(target=self._work, name="forge-sequential", daemon=True)
        self._thread.start()
        return self

    def submit(self, text: str, params: SynthParams, normalized: bool = False,
               lookahead: int | str | None = None) -> Handle:
        frames = self.pipe.resolve_lookahead(lookahead)  # None asked: the artifact's recorded look-ahead
        with self._lock:
            if self._closed:
                raise SchedulerClosedError("the scheduler is closed")
            if self._queue.qsize() >= self.max_queue:
                raise QueueFullError(f"queue is full ({self.max_queue} requests waiting); retry later")
            handle = Handle(self._next_id, text, normalized, frames)
            self._next_id += 1
            self._queue.put((handle, params))
        return handle

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, params = item
            self.running = 1
            try:
                with self.gpt_lock:
                    self._run(handle, params)
            finally:
                self.running = 0

    def _run(self, handle: Handle, params: SynthParams) -> None:
        class Cancelled(Exception):
            pass

        def progress(state: Any) -> None:
            self.steps += 1
            if handle.cancelled:
                raise Cancelled()

        gens: list[Any] = []
        pieces: list[np.ndarray] = []
        try:
            if handle.cancelled:
                raise Cancelled()
            # the text is normalised (and refined) already: the stream must not normalise it again
            plain = replace(params, normalize=False, homophones=False, refine=None)
            for chunk in self.pipe.stream([handle.text], plain, on_done=gens.append, progress=progress,
                                          lookahead_frames=handle.lookahead_frames):
                if len(chunk[0]):
                    pieces.append(chunk[0])
                    handle._emit(chunk[0])
            gen = gens[0]
            wav = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
            handle._finish(result=Result(text=handle.text, codes=gen.ids[0], hiddens=gen.hiddens[0], wav=wav,
                                         sample_rate=self.pipe.sample_rate))
        except Cancelled:
            handle._finish(error=ForgeError(f"request {handle.id} was cancelled"))
        except ForgeError as e:
            handle._finish(error=ForgeError(f"request {handle.id}: {e}"))
        except Exception as e:  # noqa: BLE001 - one request failing must not end the worker
            log.error("request %d failed: %s", handle.id, e)
            handle._finish(error=ForgeError(f"request {handle.id}: generation failed ({type(e).__name__}: {e})"))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except Exception:  # noqa: BLE001 - queue.Empty: nothing left waiting
                break
            if item is not None:
                item[0]._finish(error=ForgeError(f"request {item[0].id}: the scheduler closed before it ran"))
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
