"""Continuous batching (runtime.scheduler): parity with lone runs, cancellation, error isolation,
the bounded queue, streaming per request (threaded and asyncio)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.scheduler import Scheduler

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


def test_codes_equal_lone_runs_whatever_else_runs(pipe, alone):
    sched = Scheduler(pipe, max_batch=3, max_queue=8)
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


def test_cancel_frees_the_row(pipe, alone):
    sched = Scheduler(pipe, max_batch=1, max_queue=4)
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
