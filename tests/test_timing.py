"""The timing module's definitions (RTF, streams, first audio, statistics), checked on given numbers,
a fake clock and a fake engine; the real engines only for consistency (no timed assertion)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chattts_forge.evaluate.bench import _summarize
from chattts_forge.evaluate.latency import measure_utterances
from chattts_forge.runtime.machine import machine_info
from chattts_forge.runtime.memory_probe import RssSampler
from chattts_forge.runtime.timed_engine import OnnxEngine, decode_step_call
from chattts_forge.runtime.timing import (
    Request,
    RunFigures,
    audio_seconds,
    codes_per_audio_second,
    first_audio_seconds,
    per_second,
    percentiles,
    rtf,
    spread,
    time_calls,
    time_interleaved,
)

REPO = Path(__file__).resolve().parent.parent


class FakeClock:
    """A clock that advances only when told to."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_audio_seconds_and_rtf_from_given_numbers() -> None:
    # one code = 2 mel frames of `hop` samples: 46.875 codes per second at 24 kHz, hop 256
    assert codes_per_audio_second(24000, 256) == 46.875
    assert audio_seconds(375, 24000, 256) == 8.0
    assert audio_seconds(422, 24000, 256) == pytest.approx(422 / 46.875)
    assert rtf(4.0, 8.0) == 0.5
    assert rtf(1.0, 0.0) is None  # no audio: no RTF
    assert per_second(22.4, 4.0) == pytest.approx(5.6)
    assert per_second(1.0, 0.0) is None


def test_run_figures_definitions() -> None:
    run = RunFigures(sample_rate=24000, hop_length=256, code_stage_s=3.0, e2e_s=4.0, row_codes=[375, 375, 300])
    assert run.row_audio_s == [8.0, 8.0, 6.4]
    assert run.audio_s == 8.0  # a batch is as long as its longest row
    assert run.total_audio_s == pytest.approx(22.4)
    assert run.e2e_rtf == 0.5
    assert run.code_rtf == 0.375
    assert run.streams == pytest.approx(5.6)
    assert run.code_streams == pytest.approx(22.4 / 3.0)
    assert run.aggregate_rtf == pytest.approx(1 / 5.6)
    empty = RunFigures(sample_rate=24000, hop_length=256, e2e_s=1.0)
    assert empty.audio_s == 0.0 and empty.e2e_rtf is None


def test_gpt_calls_split_into_prefill_and_decode_steps() -> None:
    run = RunFigures(sample_rate=24000, hop_length=256)
    run.add_gpt_calls([(20, 20, 0.010), (1, 21, 0.002), (1, 401, 0.003), (5, 406, 0.001)])
    assert run.prefill_ms == pytest.approx(11.0)  # every forward of more than one new position
    assert run.gpt_step_ms == pytest.approx([2.0, 3.0])
    assert run.gpt_step_ms_ctx400 == pytest.approx([2.0])  # context 401 is beyond the limit


def test_first_audio_is_the_first_chunk_with_samples() -> None:
    clock = FakeClock(10.0)
    closed: list[bool] = []

    def stream() -> Iterator[list[np.ndarray]]:
        try:
            for n in (0, 0, 3, 5):
                clock.now += 0.5  # each chunk takes half a second
                yield [np.zeros(n)]
        finally:
            closed.append(True)

    assert first_audio_seconds(stream(), lambda c: len(c[0]) > 0, start=10.0, clock=clock) == 1.5
    assert closed == [True]  # nothing generated after the first audio
    assert math.isnan(first_audio_seconds(iter([[np.zeros(0)]]), lambda c: len(c[0]) > 0, 0.0, clock))


def test_statistics_leave_out_what_was_not_measured() -> None:
    values = [float(v) for v in range(1, 11)] + [None, float("nan")]
    s = spread(values)
    assert s == {"median": 5.5, "p10": pytest.approx(1.9), "p90": pytest.approx(9.1), "min": 1.0, "n": 10}
    p = percentiles(values)
    assert p["p50"] == 5.5 and p["mean"] == 5.5 and p["min"] == 1.0 and p["max"] == 10.0
    assert p["p99"] == pytest.approx(9.91)
    assert spread([])["median"] is None and spread([None])["n"] == 0
    assert percentiles([float("nan")])["p50"] is None


def test_timed_calls_interleave_round_by_round() -> None:
    clock = FakeClock()
    order: list[str] = []

    def call(name: str, seconds: float) -> Any:
        def run() -> None:
            order.append(name)
            clock.now += seconds

        return run

    times = time_interleaved([call("a", 1.0), call("b", 2.0)], runs=2, warmup=1, clock=clock)
    assert order == ["a", "b"] * 3  # one warm-up round, then two timed rounds
    assert times == [[1.0, 1.0], [2.0, 2.0]]
    assert time_calls(call("c", 0.25), runs=3, clock=clock) == [0.25, 0.25, 0.25]


class FakeEngine:
    """An engine whose runs take given times: 0.1 s per code end to end, 0.08 s code stage."""

    name = "fake"

    def __init__(self) -> None:
        self.requests: list[tuple[list[str], Request]] = []

    def run(self, texts: list[str], request: Request, keep_audio: bool = False) -> RunFigures:
        self.requests.append((list(texts), request))
        codes = [10 * len(t) for t in texts]
        run = RunFigures(sample_rate=24000, hop_length=256, e2e_s=0.1 * max(codes), code_stage_s=0.08 * max(codes),
                         steps=max(codes), row_codes=codes)
        if keep_audio:
            run.wavs = [np.ones(c, dtype=np.float32) for c in codes]
        return run


def test_gate_rtf_is_bench_e2e_rtf_of_the_same_run() -> None:
    engine = FakeEngine()
    sentences = ["ab", "abcd"]

    def request_of(i: int) -> Request:
        return Request(max_new_token=96, seed=7 + i, speaker_seed=7 + i)

    utts, waves, _ = measure_utterances(engine, sentences, request_of, warmup=1, keep_audio=True)
    # one warm-up of the first sentence, then each sentence alone with its own request
    assert [(t, r.seed, r.speaker_seed) for t, r in engine.requests] == [
        (["ab"], 7, 7), (["ab"], 7, 7), (["abcd"], 8, 8)
    ]
    assert [u["steps"] for u in utts] == [20, 40]
    assert [u["audio_seconds"] for u in utts] == pytest.approx([20 / 46.875, 40 / 46.875])
    assert [u["rtf"] for u in utts] == pytest.approx([0.1 * 46.875] * 2)  # e2e seconds / audio seconds
    assert waves["002"][1] == 24000 and waves["002"][0].size == 40
    # bench summarizes the very same runs: its e2e_rtf is the utterance's rtf
    runs = [engine.run(["ab"], Request.fixed_steps(20))]
    summary = _summarize(runs, 1, [])
    assert summary["e2e_rtf"]["median"] == pytest.approx(utts[0]["rtf"])
    assert summary["code_rtf"]["median"] == pytest.approx(0.08 * 46.875)
    assert summary["streams"]["median"] == pytest.approx(1 / (0.1 * 46.875))


def test_onnx_engine_runs_are_consistent(tiny_artifacts: dict[str, Path]) -> None:
    engine = OnnxEngine(tiny_artifacts["fp32"], threads=1)
    run = engine.run(["你好。", "hello there."], Request.fixed_steps(6), keep_audio=True)
    assert run.steps == 6 and run.row_codes == [6, 6]  # EOS masked: every row ran every step
    hop = engine.hop_length
    assert [len(w) for w in run.wavs] == [hop * (2 * 6 - 1)] * 2  # Vocos: one hop less than 12 frames
    assert run.audio_s == audio_seconds(6, engine.sample_rate, hop)
    assert run.e2e_s >= run.code_stage_s > 0
    assert len(run.gpt_step_ms) == 5 and run.prefill_ms is not None  # the first code comes from the prefill
    assert len(run.full_step_ms) == 5
    first = engine.first_audio("你好。", Request.fixed_steps(6))
    assert first > 0
    free = engine.run(["你好。"], Request(max_new_token=6, speaker_seed=3))
    assert 1 <= free.row_codes[0] <= 6


def test_decode_step_call_repeats_the_same_step(tiny_artifacts: dict[str, Path]) -> None:
    engine = OnnxEngine(tiny_artifacts["fp32"], threads=1, engine="plain")
    assert engine.gpt_engine == "plain"
    step = engine.gpt_step
    call = decode_step_call(step, engine.pipe.dims.hidden_size, past=7, batch=2)
    first = call()
    assert first.shape == (2, 1, engine.pipe.dims.hidden_size) and step.past_length == 8
    np.testing.assert_array_equal(call(), first)  # the cache is put back: same context every call
    assert step.past_length == 8


def test_rss_sampler_and_machine_info() -> None:
    with RssSampler() as rss:
        with rss.during("work"):
            block = np.ones(8 << 20, dtype=np.uint8)  # 8 MiB touched
            del block
    assert rss.peaks["work"] > 0 and rss.peak_process() >= rss.peaks["work"]
    info = machine_info(2)
    # evaluate's keys and bench's keys, one description
    for key in ("cpu_model", "logical_cores", "physical_cores", "memory_gb", "threads", "available_providers",
                "platform", "python", "versions", "toolchain", "cpu_count", "processor", "load_avg_1m"):
        assert key in info
    assert info["cpu_count"] == info["logical_cores"] and info["threads"] == 2


@pytest.mark.parametrize("path", ["evaluate/latency.py", "evaluate/bench.py", "quantize/stepbench.py"])
def test_harnesses_time_through_the_timing_module(path: str) -> None:
    """The three former timing harnesses keep no clock, percentile or RSS code of their own."""
    source = (REPO / path).read_text(encoding="utf-8")
    for pattern in (r"perf_counter", r"getrusage", r"ru_maxrss", r"np\.percentile", r"statistics\.",
                    r"clear_refs", r"register_forward_hook", r"psutil"):
        assert not re.search(pattern, source), f"{path} has its own timing code ({pattern})"
