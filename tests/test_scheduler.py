"""Continuous batching (runtime.scheduler): parity with lone runs, cancellation, error isolation,
the bounded queue, streaming per request (threaded and asyncio), Decoder + Vocos on the decode worker."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from dataclasses import replace

import numpy as np
import pytest

import chattts_forge.runtime.scheduler as scheduler_mod
from chattts_forge.errors import ForgeError
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, StreamDecoder, SynthParams
from chattts_forge.runtime.scheduler import Scheduler, default_decode_worker

TEXTS = [
    "Hello there, how are you today?",
    "This is a much longer sentence about the weather in the city of London this spring.",
    "你好，欢迎使用。",
    "Short one.",
]


def _params(seed: int, max_new_token: int = 48) -> SynthParams:
    return SynthParams(code=InferCodeParams(temperature=1e-9, seed=seed, max_new_token=max_new_token))


@pytest.fixture(scope="module")
def pipe(tiny_artifacts) -> Pipeline:
    return Pipeline(tiny_artifacts["fp32"], threads=1, engine="fast")


@pytest.fixture(scope="module")
def alone(pipe):
    return [pipe.synthesize([t], _params(i))[0] for i, t in enumerate(TEXTS)]


@pytest.mark.parametrize("overlap", [False, True], ids=["inline-decode", "decode-worker"])
def test_codes_equal_lone_runs_whatever_else_runs(pipe, alone, overlap):
    sched = Scheduler(pipe, max_batch=3, max_queue=8, decode_worker=overlap)
    handles = [sched.submit(TEXTS[0], _params(0)), sched.submit(TEXTS[1], _params(1))]
    for _ in range(5):  # the first two run alone for a while; the others join a running batch
        sched.step()
    assert sched.running == 2
    handles += [sched.submit(TEXTS[2], _params(2)), sched.submit(TEXTS[3], _params(3))]
    sched.step()
    assert sched.running == 3 and sched.waiting == 1  # max_batch rows; the 4th waits for a free row
    sched.run_until_idle()
    lengths = set()
    for h, ref in zip(handles, alone, strict=True):
        res = h.result()
        np.testing.assert_array_equal(res.codes, ref.codes)
        assert len(res.wav) == len(ref.wav)
        np.testing.assert_allclose(res.wav, ref.wav, atol=1e-5)  # the stream equals the whole waveform
        lengths.add(len(res.codes))
    assert len(lengths) > 1  # mixed lengths: rows really left the batch at different steps


@pytest.mark.parametrize("overlap", [False, True], ids=["inline-decode", "decode-worker"])
def test_cancel_frees_the_row(pipe, alone, overlap):
    sched = Scheduler(pipe, max_batch=1, max_queue=4, decode_worker=overlap)
    victim = sched.submit(TEXTS[1], _params(1, max_new_token=400))
    waiting = sched.submit(TEXTS[0], _params(0))
    for _ in range(3):
        sched.step()
    assert sched.running == 1 and sched.waiting == 1
    victim.cancel()
    sched.step()  # the cancelled row leaves before the step; the waiting request takes it
    assert victim.done() and sched.running == 1 and sched.waiting == 0
    with pytest.raises(ForgeError, match="cancelled"):
        victim.result()
    sched.run_until_idle()
    np.testing.assert_array_equal(waiting.result().codes, alone[0].codes)


def test_bad_requests_fail_alone(pipe, alone):
    sched = Scheduler(pipe, max_batch=4, max_queue=8)
    good = sched.submit(TEXTS[3], _params(3))
    unspeakable = sched.submit("!!! ...", _params(0))
    overlong = sched.submit("word " * 50, SynthParams(code=InferCodeParams(max_new_token=4090, seed=0)))
    sched.run_until_idle()
    with pytest.raises(ForgeError, match="nothing speakable") as e1:
        unspeakable.result()
    with pytest.raises(ForgeError, match="input too long") as e2:
        overlong.result()
    assert "\n" not in str(e1.value) and "\n" not in str(e2.value)  # one-line errors
    np.testing.assert_array_equal(good.result().codes, alone[3].codes)


def test_full_queue_refuses_clearly(pipe):
    sched = Scheduler(pipe, max_batch=1, max_queue=2)
    sched.submit(TEXTS[0], _params(0))
    sched.submit(TEXTS[1], _params(1))
    with pytest.raises(ForgeError, match=r"queue is full \(2 requests waiting\)"):
        sched.submit(TEXTS[2], _params(2))
    sched.close()  # waiting requests fail instead of hanging
    with pytest.raises(ForgeError, match="closed"):
        sched.submit(TEXTS[2], _params(2))


def test_worker_thread_streams_and_asyncio(pipe, alone):
    async def collect(handle) -> list[np.ndarray]:
        return [chunk async for chunk in handle]

    async def main(sched: Scheduler) -> list[list[np.ndarray]]:
        hs = [sched.submit(t, _params(i)) for i, t in enumerate(TEXTS[:3])]
        return await asyncio.gather(*(collect(h) for h in hs))

    with Scheduler(pipe, max_batch=2, max_queue=4) as sched:
        streams = asyncio.run(main(sched))
        threaded = sched.submit(TEXTS[3], _params(3))
        chunks = list(threaded.chunks(timeout=120))
    for chunks_i, ref in zip(streams, alone[:3], strict=True):
        assert len(chunks_i) >= 1
        np.testing.assert_allclose(np.concatenate(chunks_i), ref.wav, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(chunks), alone[3].wav, atol=1e-5)
    assert threaded.first_audio is not None and threaded.first_audio <= threaded.finished


# ---- Decoder + Vocos on the decode worker ------------------------------------------------------------


def _forge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name in ("forge-decode", "forge-scheduler") and t.is_alive()]


def _chunks_of(pipe, overlap: bool) -> list[list[np.ndarray]]:
    with Scheduler(pipe, max_batch=3, max_queue=8, decode_worker=overlap) as sched:
        assert sched.decode_worker is overlap
        handles = [sched.submit(t, _params(i)) for i, t in enumerate(TEXTS)]
        return [list(h.chunks(timeout=120)) for h in handles]


def test_decode_worker_gives_the_chunks_of_the_inline_path(pipe, alone):
    """The chunks are decided by the scheduler, so the worker decodes the very same windows: same bytes."""
    inline, overlapped = _chunks_of(pipe, False), _chunks_of(pipe, True)
    for a, b, ref in zip(inline, overlapped, alone, strict=True):
        assert len(a) == len(b) >= 1
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_allclose(np.concatenate(b), ref.wav, atol=1e-5)
    assert _forge_threads() == []


def test_a_decode_error_on_the_worker_fails_that_request_alone(pipe, alone, monkeypatch):
    real_push = StreamDecoder.push

    def push(self, steps, final=False):
        if not self.use_decoder:  # the victim decodes codes with the DVAE; the others hidden states
            raise RuntimeError("boom")
        return real_push(self, steps, final)

    monkeypatch.setattr(StreamDecoder, "push", push)
    sched = Scheduler(pipe, max_batch=3, max_queue=8, decode_worker=True)
    victim_params = _params(9, max_new_token=400)
    victim_params.use_decoder = False
    victim = sched.submit(TEXTS[1], victim_params)
    good = [sched.submit(TEXTS[i], _params(i)) for i in (0, 3)]
    sched.run_until_idle()
    with pytest.raises(ForgeError) as e:
        victim.result()
    assert str(e.value) == f"request {victim.id}: audio decoding failed (RuntimeError: boom)"
    assert sched.running == 0 and sched.steps < 400  # its row was freed long before its 400 steps
    for h, i in zip(good, (0, 3), strict=True):
        np.testing.assert_array_equal(h.result().codes, alone[i].codes)
        np.testing.assert_allclose(h.result().wav, alone[i].wav, atol=1e-5)
    # the worker lives on: a later request is served
    later = sched.submit(TEXTS[2], _params(2))
    sched.run_until_idle()
    np.testing.assert_array_equal(later.result().codes, alone[2].codes)
    assert _forge_threads() == []


def test_cancel_while_its_decode_is_queued_skips_it(pipe, monkeypatch):
    """A request whose GPT rows are done but whose audio still waits in the decode queue can be
    cancelled: its queued decode is skipped, its result is the cancellation, the others are unharmed."""
    gate, entered = threading.Event(), threading.Event()
    pushed: list[bool] = []  # use_decoder of each push that ran
    real_push = StreamDecoder.push

    def push(self, steps, final=False):
        if self.use_decoder and not entered.is_set():  # hold the worker on the blocker's audio
            entered.set()
            assert gate.wait(60), "test gate never opened"
        pushed.append(self.use_decoder)
        return real_push(self, steps, final)

    def fixed(seed: int, steps: int, use_decoder: bool = True) -> SynthParams:
        return SynthParams(code=InferCodeParams(temperature=1e-9, seed=seed, max_new_token=steps, min_new_token=steps),
                           use_decoder=use_decoder)

    monkeypatch.setattr(StreamDecoder, "push", push)
    sched = Scheduler(pipe, max_batch=3, max_queue=4, decode_worker=True)
    blocker = sched.submit(TEXTS[2], fixed(2, 3))  # ends first: the worker is held on its audio
    victim = sched.submit(TEXTS[3], fixed(1, 6, use_decoder=False))  # ends next: its audio queues behind
    keeper = sched.submit(TEXTS[0], fixed(0, 40))
    for _ in range(10):  # until the victim's 6 steps are done and its row is free
        sched.step()
        if sched.running < 2:
            break
    assert entered.wait(60)
    assert sched.running == 1 and not victim.done()  # generated; its audio queued behind the held task
    victim.cancel()
    gate.set()
    sched.run_until_idle()
    with pytest.raises(ForgeError, match=f"request {victim.id} was cancelled"):
        victim.result()
    assert False not in pushed  # the victim's (DVAE) decode never ran
    got = []
    with pytest.raises(ForgeError, match="cancelled"):
        for chunk in victim.chunks(timeout=5):
            got.append(chunk)
    assert got == []  # no audio after (or instead of) its cancellation
    assert sched.running == 0 and _forge_threads() == []
    monkeypatch.undo()  # the references decode without the gate
    for h, params, text in ((blocker, fixed(2, 3), TEXTS[2]), (keeper, fixed(0, 40), TEXTS[0])):
        ref = pipe.synthesize([text], params)[0]
        np.testing.assert_array_equal(h.result().codes, ref.codes)
        np.testing.assert_allclose(h.result().wav, ref.wav, atol=1e-5)


def test_close_finishes_queued_audio_and_leaves_no_thread(pipe, monkeypatch):
    """close(): requests that finished generating get their queued audio, the others fail with a
    one-line error, and neither the scheduler's thread nor the decode worker is left running."""
    gate = threading.Event()
    real_push = StreamDecoder.push

    def push(self, steps, final=False):
        assert gate.wait(60), "test gate never opened"  # the decodes queue up until the close
        return real_push(self, steps, final)

    monkeypatch.setattr(StreamDecoder, "push", push)
    sched = Scheduler(pipe, max_batch=2, max_queue=4, decode_worker=True)
    short = [sched.submit(TEXTS[i], SynthParams(code=InferCodeParams(temperature=1e-9, seed=i, max_new_token=6,
                                                                     min_new_token=6))) for i in (0, 3)]
    for _ in range(10):
        sched.step()
        if sched.running == 0:
            break
    assert sched.steps >= 5 and sched.running == 0 and not any(h.done() for h in short)  # generated; audio queued behind the gate
    unstarted = sched.submit(TEXTS[1], _params(1))
    sched.start()
    threading.Timer(0.5, gate.set).start()
    sched.close()
    assert _forge_threads() == []
    monkeypatch.undo()  # the references below decode without the gate
    for h, i in zip(short, (0, 3), strict=True):
        res = h.result(timeout=0)
        ref = pipe.synthesize([TEXTS[i]], SynthParams(code=InferCodeParams(temperature=1e-9, seed=i, max_new_token=6,
                                                                           min_new_token=6)))[0]
        np.testing.assert_array_equal(res.codes, ref.codes)
        np.testing.assert_allclose(res.wav, ref.wav, atol=1e-5)
    assert unstarted.done()
    try:
        unstarted.result(timeout=0)  # it may have run to its end before the close...
    except ForgeError as e:  # ...or been ended by it
        assert "closed" in str(e) and "\n" not in str(e)


def test_default_decode_worker_needs_a_free_core(tiny_artifacts, monkeypatch):
    one = Pipeline(tiny_artifacts["fp32"], threads=1, engine="fast")
    unset = Pipeline(tiny_artifacts["fp32"], threads=None, engine="fast")
    monkeypatch.setattr(scheduler_mod, "usable_cores", lambda: 4)
    assert default_decode_worker(one) is True
    assert default_decode_worker(unset) is False  # onnxruntime's default: a thread per core
    monkeypatch.setattr(scheduler_mod, "usable_cores", lambda: 1)
    assert default_decode_worker(one) is False
    assert Scheduler(one).decode_worker is False and Scheduler(one, decode_worker=True).decode_worker is True


# ---- memory: nothing of a finished request waits for the garbage collector ----------------------------


class _BackReferringWaiter:
    """A listener that refers back to its handle, as the server's asyncio waiter does."""

    def __init__(self, handle: scheduler_mod.Handle) -> None:
        self.handle = handle
        self.calls = 0
        handle.add_listener(self.wake)

    def wake(self) -> None:
        self.calls += 1


@pytest.mark.parametrize("cancelled", [False, True], ids=["finished", "cancelled"])
def test_a_finished_request_is_freed_by_reference_counting_alone(pipe, cancelled):
    # Under load a handle lives long enough to reach the collector's oldest generation, whose passes
    # are rare: a cycle through its listener kept every result's arrays for hundreds of requests.
    gc.collect()
    gc.disable()
    try:
        with Scheduler(pipe, max_batch=2, max_queue=4) as sched:
            handle = sched.submit(TEXTS[0], _params(0))
            waiter = _BackReferringWaiter(handle)
            if cancelled:
                handle.cancel()
            handle.wait(120)
            freed = weakref.ref(handle), weakref.ref(waiter)
            ended_with = waiter.calls
            del handle, waiter
            sched.run_until_idle()
        assert ended_with >= 1
        assert [ref() for ref in freed] == [None, None]
    finally:
        gc.enable()


def test_a_listener_added_after_the_end_is_called_once_and_not_kept():
    handle = scheduler_mod.Handle(1, "x")
    handle._finish(error=ForgeError("request 1 failed"))
    calls: list[int] = []
    handle.add_listener(lambda: calls.append(1))
    assert calls == [1] and handle._listeners == []


def test_rows_given_back_when_free_change_no_request(pipe, alone):
    """Near its memory limit a server has free rows give their key/value pages back: far from it rows
    stay mapped as they were; near it every free row is emptied, those freed before included. The
    requests' codes and audio are those of lone runs all the same (rows are reused after being given
    back, and the cache grows past its first capacity)."""
    near_limit = [False]
    sched = Scheduler(pipe, max_batch=2, max_queue=8, release_free_rows=lambda: near_limit[0])
    first = [sched.submit(t, _params(i)) for i, t in enumerate(TEXTS[:2])]
    sched.run_until_idle()
    assert all(buf.any() for buf in sched._rows._buffers)  # far from the limit: the rows keep their pages
    near_limit[0] = True
    long_params = _params(7, max_new_token=300)  # past the rows' first 256 positions
    rest = [sched.submit(t, _params(i + 2)) for i, t in enumerate(TEXTS[2:])] + [sched.submit(TEXTS[1], long_params)]
    sched.run_until_idle()
    for h, ref in zip(first + rest, alone, strict=False):
        np.testing.assert_array_equal(h.result().codes, ref.codes)
        np.testing.assert_allclose(h.result().wav, ref.wav, atol=1e-5)
    np.testing.assert_array_equal(rest[-1].result().codes, pipe.synthesize([TEXTS[1]], long_params)[0].codes)
    assert sched._rows.capacity > 256
    assert not any(buf.any() for buf in sched._rows._buffers)


# ---- first chunk first -------------------------------------------------------------------------------


def _long(seed: int) -> SynthParams:  # a chunk due every other step
    return replace(_params(seed, 160), code=replace(_params(seed, 160).code, min_new_token=160, stream_batch=2))


_LATE_ARRIVAL = [(TEXTS[1], _long(0)), (TEXTS[0], _long(1)), (TEXTS[2], _params(2, 60))]


def _late_arrival(pipe, priority: bool) -> tuple[Scheduler, list, list[list[np.ndarray]]]:
    """Two long requests run for a while (chunks already out), then a third arrives; every chunk kept."""
    sched = Scheduler(pipe, max_batch=3, max_queue=4, first_chunk_priority=priority, lookahead_frames=12)
    handles = [sched.submit(text, params) for text, params in _LATE_ARRIVAL[:2]]
    for _ in range(30):
        sched.step()
    assert all(h.first_audio is not None for h in handles)  # both already stream
    handles.append(sched.submit(*_LATE_ARRIVAL[2]))
    sched.run_until_idle()
    return sched, handles, [list(h.chunks(timeout=0)) for h in handles]


def test_a_new_request_goes_first_and_no_chunk_changes(pipe):
    """The others' chunks wait for the late request's first one, and with first_chunk_priority it runs alone
    one step in three: the order of work changes, not one request's codes or chunks."""
    first, handles, chunks = _late_arrival(pipe, True)
    plain, plain_handles, plain_chunks = _late_arrival(pipe, False)
    assert first.first_chunk_steps > 0 and first.deferred_decodes > 0
    assert plain.first_chunk_steps == 0 and plain.deferred_decodes > 0
    for i, (h, p) in enumerate(zip(handles, plain_handles, strict=True)):
        res, ref = h.result(), p.result()
        np.testing.assert_array_equal(res.codes, ref.codes)
        assert len(chunks[i]) == len(plain_chunks[i]) >= 2
        for x, y in zip(chunks[i], plain_chunks[i], strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(np.concatenate(chunks[i]), res.wav)
    for i, (text, params) in enumerate(_LATE_ARRIVAL):  # and each one's chunks are those of its lone stream
        streamed = [c[0] for c in pipe.stream([text], params, lookahead_frames=12) if len(c[0])]
        assert len(streamed) == len(chunks[i])
        for x, y in zip(streamed, chunks[i], strict=True):
            np.testing.assert_array_equal(x, y)
