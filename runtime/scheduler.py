"""Continuous batching: requests join the running GPT batch between steps and leave when they end.

A TTS service receives requests at random times with different lengths. `Scheduler` keeps one
GPT batch running (the fused `gpt_fast` graph, whose rows may have different lengths: each row
holds its own sequence from cache slot 0, `FastGptStep.step_rows`) and, between two steps:

1. text stage: normalises and tokenises waiting requests (a bad text fails that request alone,
   with its one-line ForgeError) and prefills each one alone (batch 1, exactly as a lone
   `Pipeline.synthesize` does), then copies its cache into a free row of the running batch;
2. code stage: one GPT step for every running row, then each request's own logits processing and
   seeded sampler (a row's codes never depend on the other rows);
3. audio stage: each request's `StreamDecoder` turns its hidden states into final audio chunks
   (first chunk as soon as exact audio exists, then at every multiple of `stream_batch` steps, the
   cuts `Pipeline.stream` makes, so the chunks equal a lone stream's bit for bit); a finished or
   cancelled request leaves the batch and its row is reused by the next waiting request.

First chunk first: while a running request has no audio yet, the other requests' chunks due meanwhile
wait (`_deferred`, in the order they were due, one stream_batch of steps at most), so the Decoder +
Vocos time goes to the new request's first chunk (the same work in another order: no cost). With
`first_chunk_priority` (on by default) one GPT step in FIRST_CHUNK_EVERY (3) also runs only the rows
from the first such request on (the newest rows; the others wait that step): its first audio then
waits for its own steps rather than behind eight long requests, for the steps the running requests
lose (a few percent of the sentences/s at concurrency 8; docs/measurements/2026-12-06-first-audio).
No chunk changes: the cuts are decided as before, only decoded later.

So a request's codes under the scheduler equal its codes alone (temperature 1e-9, same seed),
whatever else runs. The waiting queue is bounded: `submit` refuses with a ForgeError when
`max_queue` requests wait. Memory is bounded by `max_batch` rows of `capacity` positions (grown
only when a request gets longer; see runtime.memory).

Decode overlap (`decode_worker=True`): the audio stage's Decoder + Vocos runs (stream chunks, and the
last chunk of a finished row, whose GPT row is freed at once) go to one background thread through a
bounded queue (`2 x max_batch` tasks; the scheduler waits when it is full), so they overlap the next
GPT steps: onnxruntime releases the GIL while a session runs. The scheduler decides every chunk from
its own bookkeeping (what it has asked to emit), so the chunks, and the audio, are those of the
synchronous path; one thread keeps each request's chunks in order. An error while decoding fails
that request alone (its one-line ForgeError; its GPT row is freed at the next step); a cancelled
request's queued decodes are skipped. Default (`decode_worker=None`): on when the session's
intra-op threads leave a core free (`threads < usable cores`), off otherwise: with no spare core the
two onnxruntime thread pools would share the same cores and slow the GPT step, which every running
request waits for. `close()` (and `run_until_idle()`, for a scheduler driven by `step()`) lets the
queued decodes finish and stops the thread.

Library use (a worker thread drives the steps; handles are thread-safe and asyncio-friendly)::

    from chattts_forge.runtime.scheduler import Scheduler
    with Scheduler(pipe, max_batch=8, max_queue=64) as sched:
        h = sched.submit("Hello there.", SynthParams(code=InferCodeParams(seed=1)))
        for chunk in h.chunks():          # float32 audio, as it becomes final (h: runtime.request_handle.Handle)
            ...
        res = h.result()                  # runtime.pipeline.Result (codes, hiddens, wav)
        async for chunk in h: ...         # the same stream from asyncio
        h.cancel()                        # frees its row at the next step

Without a thread, `sched.step()` runs one scheduling round and `sched.run_until_idle()` all of them
(and waits for the decode worker's queue).
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chattts_forge.artifact import HEAD_CODE
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.fast_gpt import FastGptStep
from chattts_forge.runtime.generation import position_ids
from chattts_forge.runtime.params import SynthParams, check_synth_params
from chattts_forge.runtime.pipeline import Pipeline, Result
from chattts_forge.runtime.request_handle import (
    Handle,
    QueueFullError,
    SchedulerClosedError,
    one_line,
    request_error,
)
from chattts_forge.runtime.sampling import Sampler, process_logits
from chattts_forge.runtime.stream_decode import StreamDecoder, StreamLookahead, resolve_lookahead
from chattts_forge.runtime.textfront import check_text_length

log = get_logger(__name__)

# While a request waits for its first chunk, one GPT step in this many runs only it (and newer rows):
# at concurrency 8 every second step cost ~10% of the sentences/s, every third ~4-7% for about the same
# first audio (docs/measurements/2026-12-06-first-audio).
FIRST_CHUNK_EVERY = 3


@dataclass
class _Active:
    """A request in the running batch."""

    handle: Handle
    params: SynthParams
    text: str
    sampler: Sampler
    cfg: Any
    tokens: np.ndarray  # int64 [max_new_token, num_vq]
    hiddens: np.ndarray  # float32 [max_new_token, hidden]
    decoder: StreamDecoder
    length: int  # cache positions of its row
    steps: int = 0
    end: int = 0  # kept steps (EOS excluded)
    finished: bool = False
    pieces: list[np.ndarray] = field(default_factory=list)  # written by whoever decodes (worker or scheduler)
    # Samples the decodes asked so far will have emitted (the scheduler's own view of
    # decoder.emitted, which the worker may not have reached yet): chunks are decided from it.
    asked: int = 0


@dataclass(frozen=True)
class _Decode:
    """One audio-stage task: push the request's steps so far (`src`, final ones only) to its decoder."""

    act: _Active
    src: np.ndarray
    final: bool


_STOP = object()  # the decode worker's end


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_decode_worker(pipe: Pipeline) -> bool:
    """Overlap Decoder + Vocos with the GPT steps only when the sessions' intra-op threads leave a core
    free (see the module docstring); unset threads mean one per core, so no core is free."""
    threads = pipe.artifact.threads
    return threads is not None and threads < usable_cores()


def check_request(pipe: Pipeline, text: object, params: object) -> None:
    """What `submit` accepts (also for a server in front of it): a text string no longer than the
    model can take, and SynthParams whose every field has its type and range
    (`pipeline.check_synth_params`); one sentence, no refinement. One-line ForgeError otherwise."""
    if not isinstance(text, str):
        raise BadInput(f"text must be a string, got {type(text).__name__}")
    check_text_length(text, pipe.max_text_chars())
    check_synth_params(params, pipe.dims.max_position_embeddings, pipe.max_text_chars())
    assert isinstance(params, SynthParams)
    if params.refine is not None or params.split_sentences:
        raise BadInput("the scheduler takes one sentence without text refinement per request")


class Scheduler:
    """Continuous batching over a `Pipeline` with the fast GPT engine (see the module docstring)."""

    def __init__(self, pipe: Pipeline, max_batch: int = 8, max_queue: int = 64,
                 lookahead_frames: int | None = None, decode_worker: bool | None = None,
                 release_free_rows: Callable[[], bool] | None = None, first_chunk_priority: bool = True) -> None:
        if pipe.engine != "fast":
            raise BadInput("continuous batching needs the fused GPT graph (gpt_fast.onnx; engine 'fast')")
        if max_batch < 1 or max_queue < 0:
            raise BadInput(f"max_batch must be >= 1 and max_queue >= 0, got {max_batch} and {max_queue}")
        self.pipe = pipe
        self.max_batch = max_batch
        self.max_queue = max_queue
        # A row's key/value pages stay mapped after its request leaves unless given back, and RSS keeps
        # the largest batch served. While `release_free_rows()` says so (a server near its memory
        # limit), every free row gives its pages back when a request leaves (serve.guard).
        self.release_free_rows = release_free_rows
        # the look-ahead of requests that ask none (None: exact; the server passes the artifact's recorded one)
        self.lookahead_frames = lookahead_frames
        self.decode_worker = default_decode_worker(pipe) if decode_worker is None else bool(decode_worker)
        # While a request has no audio yet, the running requests' later chunks wait (`_deferred`, at most
        # one stream_batch of steps each), so the Decoder + Vocos time goes to the new request's first
        # chunk; with `first_chunk_priority` it also gets steps of its own (`_first_rows`).
        self.first_chunk_priority = first_chunk_priority
        self._deferred: deque[tuple[int, _Decode]] = deque()  # (GPT step it was due at, task), in due order
        self.deferred_decodes = 0  # chunk decodes that waited for a new request's first chunk
        self._stepped_from = 0  # the first row the last GPT step ran
        self.first_chunk_steps = 0  # GPT steps that ran only the rows still without audio (and those after them)
        # Bounded: a slow decoder holds the GPT loop back instead of queueing work without end.
        self._decodes: queue.Queue[Any] = queue.Queue(maxsize=2 * max_batch)
        self._decoder_thread: threading.Thread | None = None
        # Two caches on the artifact's one gpt_fast session: batch-1 prefills (the same path as a
        # lone request) and the running batch's rows.
        self._prefill = FastGptStep.from_artifact(pipe.artifact)
        self._rows = FastGptStep.from_artifact(pipe.artifact)
        self._rows.open_rows(max_batch, 256)
        self._head = pipe.artifact.session(HEAD_CODE)
        self._head_out = self._head.get_outputs()[0].name
        self._waiting: deque[tuple[Handle, SynthParams]] = deque()
        self._active: list[_Active] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._next_id = 0
        self.steps = 0  # GPT steps run (batched)

    # ---- submission -------------------------------------------------------------------------

    def submit(self, text: str, params: SynthParams | None = None, normalized: bool = False,
               lookahead: StreamLookahead = None) -> Handle:
        """Queue a request; ForgeError when the scheduler is closed, QueueFullError when `max_queue`
        requests wait, and for parameters of a wrong type or out of range (`check_request`), before
        anything is queued. `normalized`: `text` is already normalised (or refined) by the caller.
        `lookahead`: this request's stream look-ahead ("exact" or mel frames; None: the scheduler's)."""
        params = params or SynthParams()
        check_request(self.pipe, text, params)
        frames = resolve_lookahead(lookahead, self.lookahead_frames)
        with self._lock:
            if self._closed:
                raise SchedulerClosedError("the scheduler is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"scheduler queue is full ({self.max_queue} requests waiting); retry later")
            handle = Handle(self._next_id, text, normalized, frames)
            self._next_id += 1
            self._waiting.append((handle, params))
            self._wake.notify()
        return handle

    @property
    def running(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_itemsize(self) -> int:
        """Bytes per cached key/value element (1 for an int8 cache)."""
        return self._rows.cache_dtype.itemsize

    # ---- the loop -----------------------------------------------------------------------------

    def step(self) -> bool:
        """One scheduling round: admit, one GPT step, audio. False when there was nothing to do."""
        self._retire_cancelled()
        self._admit()
        if not self._active:
            return self._flush_deferred()
        self._gpt_step()
        self._audio_and_retire()
        return True

    def run_until_idle(self) -> None:
        """Run steps until no request waits or runs, then let the queued decodes finish."""
        while self.step():
            pass
        self._flush_deferred()
        self._stop_decoder()

    def start(self) -> Scheduler:
        """Drive the steps in a worker thread (until `close`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, name="forge-scheduler", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting requests, fail the waiting ones, finish the worker thread."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._wake.notify_all()
        for handle, _ in waiting:
            handle._finish(error=ForgeError(f"request {handle.id}: the scheduler closed before it ran"))
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for act in self._active:
            act.handle._finish(error=ForgeError(f"request {act.handle.id}: the scheduler closed while it ran"))
        self._active = []
        self._flush_deferred()
        self._stop_decoder()  # requests that finished generating still get their audio

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _worker(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._waiting and not self._active and not self._deferred:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - a failed GPT step fails the running requests, not the thread
                log.error("scheduler step failed: %s", one_line(e))
                for act in self._active:
                    act.handle._finish(error=ForgeError(f"request {act.handle.id}: generation failed ({one_line(e)})"))
                self._active = []
                self._release_free_rows()

    # ---- stages -------------------------------------------------------------------------------

    def _admit(self) -> None:
        while len(self._active) < self.max_batch:
            with self._lock:
                if not self._waiting:
                    return
                handle, params = self._waiting.popleft()
            if handle.cancelled:
                handle._finish(error=ForgeError(f"request {handle.id} was cancelled"))
                continue
            try:
                act = self._prefill_request(handle, params)
                self._sample(act, act.hiddens[0:1])  # step 0 from the prefill's last hidden state
            except Exception as e:  # noqa: BLE001 - unspeakable, overlong, bad parameters, a bug: this request alone
                handle._finish(error=request_error(handle, e))
                continue
            self._active.append(act)

    def _prefill_request(self, handle: Handle, params: SynthParams) -> _Active:
        pipe = self.pipe
        text = handle.text if handle.normalized else pipe.normalize(handle.text, params)
        code = params.code
        cfg = pipe.code_sampling(code)
        emb, _, mask = pipe.prepare_code_inputs([text], code)
        mask = mask.astype(np.int64)
        prompt = mask.shape[1]
        self._prefill.reserve(prompt + code.max_new_token)
        self._prefill.reset(1)
        hidden = self._prefill(emb, mask, position_ids(mask))[:, -1]
        slot = len(self._active)
        self._rows.load_row(slot, self._prefill, prompt)
        act = _Active(
            handle=handle, params=params, text=text, sampler=Sampler(cfg, pipe.num_vq, 1, code.seed), cfg=cfg,
            tokens=np.zeros((code.max_new_token, pipe.num_vq), dtype=np.int64),
            hiddens=np.zeros((code.max_new_token, pipe.dims.hidden_size), dtype=np.float32),
            decoder=StreamDecoder(pipe, params.use_decoder, handle.lookahead_frames), length=prompt,
        )
        act.hiddens[0] = hidden[0]
        return act

    def _first_rows(self) -> int:
        """Where this step's rows start: the requests from the first one still without audio on, one
        step in FIRST_CHUNK_EVERY while one waits for its first chunk (`first_chunk_priority`); all
        rows otherwise."""
        if not self.first_chunk_priority or self.steps % FIRST_CHUNK_EVERY != FIRST_CHUNK_EVERY - 1:
            return 0
        for i, act in enumerate(self._active):
            if act.asked == 0:
                return i
        return 0

    def _gpt_step(self) -> None:
        """One GPT step for the running requests (finished ones left the batch after their last step):
        every row, or the rows from `_first_rows` on (the rest wait one step)."""
        start = self._first_rows()
        rows = self._active[start:]
        feed = np.stack([a.tokens[a.steps - 1] for a in rows])[:, None, :]  # [n, 1, num_vq]
        emb = self.pipe.embed(feed, np.zeros((len(rows), 1), dtype=bool))
        lengths = np.array([a.length + 1 for a in rows], dtype=np.int64)
        hidden = self._rows.step_rows(emb, lengths, start)
        self.steps += 1
        self.first_chunk_steps += start > 0
        self._stepped_from = start
        logits = self._head.run([self._head_out], {"hidden_states": hidden})[0]
        for i, act in enumerate(rows):
            act.length += 1
            act.hiddens[act.steps] = hidden[i]
            try:
                self._sample(act, None, logits[i : i + 1])
            except Exception as e:  # noqa: BLE001 - one request's sampling failing ends that request alone
                act.handle._finish(error=request_error(act.handle, e))  # its row is freed after this step

    def _sample(self, act: _Active, hidden: np.ndarray | None, logits: np.ndarray | None = None) -> None:
        """Process and sample the request's current step (as `generation.iter_generate` does for a row)."""
        vq = self.pipe.num_vq
        if logits is None:
            logits = self._head.run([self._head_out], {"hidden_states": hidden})[0]
        step = act.steps
        logits = logits.reshape(vq, -1)
        history = act.tokens[:step].T  # [streams, step]
        scores = process_logits(logits, history, step, act.cfg, vq)
        idx = act.sampler.next_tokens(scores, redraw_ended=step == 0 and act.params.code.ensure_non_empty)
        act.tokens[step] = idx[0]
        act.finished = bool((idx == act.cfg.eos_token).any())
        act.end += 0 if act.finished else 1
        act.steps = step + 1
        if not act.finished and act.steps == len(act.tokens):
            log.warning("request %d hit max_new_token %d", act.handle.id, len(act.tokens))
            act.finished = True

    def _audio_and_retire(self) -> None:
        keep: list[_Active] = []
        later: list[_Decode] = []  # chunks of requests that already have audio
        for i, act in enumerate(self._active):
            if act.handle.cancelled:
                act.handle._finish(error=ForgeError(f"request {act.handle.id} was cancelled"))
                continue
            if act.handle.done():  # its decode failed on the worker: the request is over
                continue
            if i < self._stepped_from:  # it waited this step: nothing new to decode
                keep.append(act)
                continue
            first = act.asked == 0
            task = self._audio_task(act)
            if task is not None:
                if first:  # a first chunk is decoded before anything else due at this step
                    self._dispatch(task)
                else:
                    later.append(task)
            # A finished row is free now (its last audio may still be decoding on the worker); a request
            # whose decode failed here has ended.
            if act.finished or act.handle.done():
                continue
            keep.append(act)
        waiting_first = any(a.asked == 0 for a in keep)
        if waiting_first:
            self._deferred.extend((self.steps, task) for task in later)
            self.deferred_decodes += len(later)
            self._flush_deferred(overdue_only=True)
        else:
            self._flush_deferred()
            for task in later:
                self._dispatch(task)
        self._compact(keep)

    def _flush_deferred(self, overdue_only: bool = False) -> bool:
        """Dispatch the deferred chunks in the order they were due (all, or those waiting a whole
        stream_batch of steps: a first chunk delays another request's chunk by one chunk at most).
        True when one was dispatched."""
        done = False
        while self._deferred:
            due, task = self._deferred[0]
            if overdue_only and self.steps - due < task.act.params.code.stream_batch:
                break
            self._deferred.popleft()
            self._dispatch(task)
            done = True
        return done

    def _audio_task(self, act: _Active) -> _Decode | None:
        """The audio due after this step, decided from the scheduler's own bookkeeping (`act.asked`), so
        the chunks are the same whether they are decoded here or on the worker."""
        dec = act.decoder
        # At every multiple of stream_batch steps, as `Pipeline.stream` cuts a lone stream: the same
        # windows are decoded, so a request's stream is bit-identical to `synth --stream`'s.
        due = act.finished or act.steps % act.params.code.stream_batch == 0
        if not due and act.asked == 0:  # no audio yet: emit as soon as any is final
            due = dec.ready_samples(act.end) > 0
        if not due:
            return None
        act.asked = max(act.asked, dec.ready_samples(act.end, act.finished))
        # Rows [0, end) of hiddens/tokens are final (the next steps write beyond them): a view suffices.
        src = act.hiddens[: act.end] if act.params.use_decoder else act.tokens[: act.end]
        return _Decode(act, src, act.finished)

    def _dispatch(self, task: _Decode) -> None:
        if not self.decode_worker:
            self._decode(task)
            return
        if self._decoder_thread is None:
            self._decoder_thread = threading.Thread(target=self._decode_loop, name="forge-decode", daemon=True)
            self._decoder_thread.start()
        self._decodes.put(task)  # blocks while the queue is full

    def _decode(self, task: _Decode) -> None:
        """Decoder + Vocos of one task; the request's end after its last one. An error ends that request alone."""
        act, handle = task.act, task.act.handle
        if handle.done():  # cancelled or failed meanwhile: its queued decodes are skipped
            return
        if handle.cancelled:
            handle._finish(error=ForgeError(f"request {handle.id} was cancelled"))
            return
        try:
            chunk = act.decoder.push(task.src, final=task.final)
            if len(chunk):
                act.pieces.append(chunk)
                handle._emit(chunk)
            if task.final:
                handle._finish(result=self._result(act))
        except ForgeError as e:
            handle._finish(error=request_error(handle, e))
        except Exception as e:  # noqa: BLE001 - one request's audio failing must not end the others
            log.error("request %d: audio decoding failed: %s", handle.id, one_line(e))
            handle._finish(error=ForgeError(f"request {handle.id}: audio decoding failed ({type(e).__name__}: {one_line(e)})"))

    def _decode_loop(self) -> None:
        while True:
            task = self._decodes.get()
            try:
                if task is _STOP:
                    return
                self._decode(task)
            finally:
                self._decodes.task_done()

    def _stop_decoder(self) -> None:
        """Let the queued decodes finish, then end the worker thread (started again by the next task)."""
        thread = self._decoder_thread
        if thread is None:
            return
        self._decodes.put(_STOP)
        thread.join()
        self._decoder_thread = None

    def _result(self, act: _Active) -> Result:
        wav = np.concatenate(act.pieces).astype(np.float32) if act.pieces else np.zeros(0, np.float32)
        return Result(text=act.text, codes=act.tokens[: act.end].copy(), hiddens=act.hiddens[: act.end].copy(),
                      wav=wav, sample_rate=self.pipe.sample_rate)

    def _retire_cancelled(self) -> None:
        """Free the rows of cancelled requests and of requests whose audio failed on the decode worker."""
        keep = []
        for act in self._active:
            if act.handle.cancelled:
                act.handle._finish(error=ForgeError(f"request {act.handle.id} was cancelled"))
            elif not act.handle.done():
                keep.append(act)
        if len(keep) != len(self._active):
            self._compact(keep)

    def _compact(self, keep: list[_Active]) -> None:
        """Keep the running rows in the first slots of the cache, in order (freed rows are reused)."""
        slots = {id(a): i for i, a in enumerate(self._active)}
        for new, act in enumerate(keep):
            old = slots[id(act)]
            if old != new:
                self._rows.move_row(old, new, act.length)
        freed = len(keep) < len(self._active)
        self._active = keep
        if freed:
            self._release_free_rows()

    def _release_free_rows(self) -> None:
        """Give every free row's pages back while asked to (rows above the running ones; a row freed
        before memory got short is given back with the next)."""
        if self.release_free_rows is not None and self.release_free_rows():
            self._rows.release_rows(len(self._active))
