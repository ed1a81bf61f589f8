"""evaluate.latency: the gate's RTF ratio from the artifact and its reference interleaved, with its spread.

Mechanism only (no speed goal): fake engines return chosen seconds, so the order of the runs, the
stopping rules and the record are checked exactly; one run on the tiny artifacts checks the real path.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate import latency as latency_mod
from chattts_forge.evaluate.latency import (
    LatencyConfig,
    interleaved_ratios,
    measure_against,
    measure_against_many,
    measure_artifact,
    retime_against,
)
from chattts_forge.runtime.interleave import RatioSettings, compare_rounds
from chattts_forge.runtime.timing import RunFigures

SENTENCES = ["one short sentence.", "a second, longer sentence here.", "third."]
QUIET = dict(threads=1, max_new_token=8, batch_sizes=(1, 2), warmup=1, first_audio_runs=2, isolate_memory=False,
             progress=False)


class FakeEngine:
    """An OnnxEngine stand-in: `seconds(folder, sentence index, run number)` decides each run's time."""

    log: list[tuple[str, int]] = []
    seconds = staticmethod(lambda folder, i, k: 1.0)

    def __init__(self, artifact, threads, provider="cpu") -> None:
        self.folder = str(artifact)
        self.load_seconds, self.gpt_engine = 0.01, "fast"
        self.stream_lookahead = None  # the look-ahead its first audio streams at (none recorded: exact)
        self.count: dict[int, int] = {}

    def run(self, texts, request, keep_audio=False) -> RunFigures:
        i = request.seed  # LatencyConfig.request(i) seeds sentence i with seed + i (seed 0 here)
        k = self.count[i] = self.count.get(i, 0) + 1
        FakeEngine.log.append((self.folder, i))
        fig = RunFigures(sample_rate=24000, hop_length=256)
        fig.row_codes = [10 * len(texts[0])]
        fig.e2e_s = FakeEngine.seconds(self.folder, i, k)
        fig.wavs = [np.full(64, i, dtype=np.float32)] if keep_audio else None
        return fig

    def first_audio(self, text, request) -> float:
        FakeEngine.log.append((self.folder, -1))
        return 0.1


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr(latency_mod, "OnnxEngine", FakeEngine)
    monkeypatch.chdir(tmp_path)  # the folders "art" and "ref" (bytes on disk are counted)
    (tmp_path / "art").mkdir()
    (tmp_path / "ref").mkdir()
    FakeEngine.log = []
    yield FakeEngine


def ticking(step: float = 1.0):
    counter = itertools.count()
    return lambda: next(counter) * step


def test_runs_alternate_and_a_clear_ratio_stops_inside_the_bound(fake) -> None:
    fake.seconds = staticmethod(lambda folder, i, k: (0.5 if folder == "art" else 1.0) * (1 + i))
    pair = measure_against("art", "ref", SENTENCES, LatencyConfig(**QUIET), clock=ticking())
    rounds = pair.ratio["rounds"]
    synth = [(f, i) for f, i in fake.log if i >= 0][2:2 + 2 * rounds]  # after the two warm-ups: the rounds
    for r in range(rounds):  # rotated: the reference first in even rounds, the artifact first in odd ones
        first, second = synth[2 * r], synth[2 * r + 1]
        assert first[1] == second[1] == r % len(SENTENCES)
        assert (first[0], second[0]) == (("ref", "art") if r % 2 == 0 else ("art", "ref"))
    ratio = pair.ratio
    assert ratio["ratio"] == pytest.approx(0.5) and ratio["spread"] == pytest.approx(0.0)
    assert ratio["stopped"] == "spread within bound" and ratio["converged"]
    assert rounds == max(latency_mod.RATIO_MIN_ROUNDS, len(SENTENCES)) and ratio["sentences"] == len(SENTENCES)
    assert ratio["bound"] == latency_mod.RATIO_BOUND and "in turn" in ratio["method"]
    # every sentence's audio from the first pass, on both sides; records carry the runs per utterance
    assert sorted(pair.artifact_waves) == sorted(pair.reference_waves) == ["001", "002", "003"]
    assert [u["runs"] for u in pair.artifact["utterances"]] == [2, 2, 2]
    assert pair.artifact["first_audio_seconds"]["runs"] == 2 and set(pair.reference["throughput"]) == {"1", "2"}
    # per sentence, so the regression gate pairs them with another build's (publish.regression)
    assert pair.artifact["first_audio_seconds"]["samples"] == pair.reference["first_audio_seconds"]["samples"] == [
        {"text": SENTENCES[0], "seconds": 0.1}, {"text": SENTENCES[1], "seconds": 0.1}]


def test_noise_stops_at_the_cap_scaled_by_the_first_pass(fake) -> None:
    # the artifact alternates between half and one and a half times the reference: never inside +-5%
    fake.seconds = staticmethod(lambda folder, i, k: (0.5 if k % 2 else 1.5) if folder == "art" else 1.0)
    cfg = LatencyConfig(**{**QUIET, "warmup": 0, "ratio_time_cap_s": 1000.0})
    pair = measure_against("art", "ref", SENTENCES, cfg, clock=ticking())
    ratio = pair.ratio
    assert ratio["stopped"] == "time cap" and not ratio["converged"]
    assert ratio["spread"] > latency_mod.RATIO_BOUND and ratio["low"] < 1 < ratio["high"]
    # the pass over the 3 sentences took 1 tick of the fake clock: the cap is 1 tick more, not 1000
    assert ratio["rounds"] == latency_mod.RATIO_MIN_ROUNDS


def test_the_gate_ratio_is_the_interleaved_median_and_the_old_one_is_kept(fake) -> None:
    fake.seconds = staticmethod(lambda folder, i, k: 0.8 if folder == "art" else 1.0)
    pair = measure_against("art", "ref", SENTENCES, LatencyConfig(**QUIET), clock=ticking())
    ratios = interleaved_ratios({"rtf_p50": 0.9, "rtf_p95": 1.1}, pair)
    assert ratios["rtf_p50"] == pytest.approx(0.8) and ratios["rtf_p50_of_p50s"] == 0.9 and ratios["rtf_p95"] == 1.1
    assert interleaved_ratios({"rtf_p50": 0.9}, None) == {"rtf_p50": 0.9}


def test_many_artifacts_share_the_reference_rounds_and_its_tail(fake, tmp_path) -> None:
    """The build's latency run: per round the sentence once on the reference and once on every artifact,
    the order rotated; each ratio is that artifact's against the reference of the same rounds; the
    reference's first audio and throughput are measured once, not once per artifact."""
    (tmp_path / "art2").mkdir()
    fake.seconds = staticmethod(lambda folder, i, k: {"art": 0.5, "art2": 0.25}.get(folder, 1.0) * (1 + i))
    pairs = measure_against_many({"a": "art", "b": "art2"}, "ref", SENTENCES, LatencyConfig(**QUIET), clock=ticking())
    rounds = pairs["a"].ratio["rounds"]
    assert pairs["b"].ratio["rounds"] == rounds == max(latency_mod.RATIO_MIN_ROUNDS, len(SENTENCES))
    synth = [(f, i) for f, i in fake.log if i >= 0][3:3 + 3 * rounds]  # after the three warm-ups: the rounds
    order = ["ref", "art", "art2"]
    for r in range(rounds):
        turn = synth[3 * r:3 * r + 3]
        assert {i for _, i in turn} == {r % len(SENTENCES)}
        assert [f for f, _ in turn] == order[r % 3:] + order[:r % 3]  # rotated; the reference once a round
    assert pairs["a"].ratio["ratio"] == pytest.approx(0.5) and pairs["b"].ratio["ratio"] == pytest.approx(0.25)
    assert "same rounds" in pairs["a"].ratio["method"]
    assert pairs["a"].reference is pairs["b"].reference  # one record of the reference, read by both
    assert sorted(pairs["b"].artifact_waves) == ["001", "002", "003"]
    first_audio = [f for f, i in fake.log if i == -1]
    assert sorted(first_audio) == sorted(order * QUIET["first_audio_runs"])
    with pytest.raises(ForgeError, match="not 'reference'"):
        measure_against_many({"reference": "art"}, "ref", SENTENCES, LatencyConfig(**QUIET))


def test_one_artifact_alone_is_timed_sequentially(fake) -> None:
    record, waves = measure_artifact("art", SENTENCES, LatencyConfig(**QUIET))
    assert {f for f, _ in fake.log} == {"art"} and sorted(waves) == ["001", "002", "003"]
    assert record["rtf"]["p50"] > 0 and record["memory"] is None


@pytest.mark.parametrize("bad", [dict(max_new_token=0), dict(batch_sizes=(0,)), dict(ratio_bound=0.0),
                                 dict(ratio_time_cap_s=-1.0), dict(warmup=-1)])
def test_bad_latency_settings_are_one_line_errors(bad) -> None:
    with pytest.raises(ForgeError, match="latency"):
        LatencyConfig(**bad)


def test_no_sentences_is_an_error(fake) -> None:
    with pytest.raises(ForgeError, match="no sentences"):
        measure_against("art", "ref", [], LatencyConfig(**QUIET))


def test_compare_rounds_rotates_and_counts_the_cap_after_the_first_pass() -> None:
    seen: list[tuple[int, str]] = []

    def measure(r: int, name: str) -> float:
        seen.append((r, name))
        return {"ref": 1.0, "a": 2.0, "b": 0.5 + 0.5 * (r % 2)}[name]

    clock = ticking()
    settings = RatioSettings(bound=0.01, time_cap_s=2.0, min_rounds=4, cap_after_rounds=4)
    comp = compare_rounds("ref", ["a", "b"], measure, settings, clock)
    assert [n for r, n in seen if r == 0] == ["ref", "a", "b"] and [n for r, n in seen if r == 1] == ["a", "b", "ref"]
    assert comp.stopped == "time cap" and comp.rounds > 4  # the cap counts from round 4, not from the start
    assert comp.estimates["a"].ratio == 2.0 and comp.estimates["a"].spread == 0.0
    assert math.isclose(comp.estimates["b"].low, 0.5) and math.isclose(comp.estimates["b"].high, 1.0)
    with pytest.raises(ForgeError, match="at least one candidate"):
        compare_rounds("ref", [], measure)


def test_tiny_artifacts_interleaved_record(tiny_artifacts) -> None:
    cfg = LatencyConfig(**{**QUIET, "batch_sizes": (1,), "first_audio_runs": 1, "ratio_time_cap_s": 0.5})
    pair = measure_against(tiny_artifacts["fp16"], tiny_artifacts["fp32"], SENTENCES[:2], cfg)
    ratio = pair.ratio
    assert ratio["rounds"] >= latency_mod.RATIO_MIN_ROUNDS and ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert ratio["stopped"] in ("spread within bound", "time cap", "round cap") and ratio["spread"] >= 0
    assert pair.artifact["artifact"] == str(tiny_artifacts["fp16"]) and len(pair.reference_waves) == 2
    assert all(u["runs"] >= 1 and u["rtf"] > 0 for u in pair.artifact["utterances"])


def test_a_latency_run_is_read_by_the_evaluation_for_its_own_files_and_settings(tiny_artifacts, tmp_path) -> None:
    """evaluate-latency's folder: each variant's pair read back as timed; refused (one line) for other
    files, other settings or a variant it did not time; an evaluation reading it reports those figures."""
    from chattts_forge.calibration_data.corpus import load_corpus
    from chattts_forge.evaluate.evaluate import evaluate_artifact
    from chattts_forge.evaluate.evaluate_config import EvaluateConfig
    from chattts_forge.evaluate.latency_run import latency_settings, measure_latency_run, read_latency_pair
    from chattts_forge.evaluate.report_assembly import describe_artifact

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("您好，请问有什么可以帮您？\nYour order has shipped today.\n", encoding="utf-8")
    cfg = EvaluateConfig(corpus=str(corpus), max_sentences=2, max_new_token=16, batch_sizes=(1,), threads=1,
                         progress=False, baseline_checkpoint=None, fidelity_sentences=1, fidelity_steps=8)
    run = tmp_path / "latency_run"
    pairs = measure_latency_run(tiny_artifacts["fp32"], [tiny_artifacts["fp16"]], run, cfg)
    ref_files, art_files = describe_artifact(tiny_artifacts["fp32"])["files"], describe_artifact(tiny_artifacts["fp16"])["files"]
    settings = latency_settings(ref_files, load_corpus(str(corpus), max_sentences=2), cfg, "cpu")
    back = read_latency_pair(run, "fp16", settings, art_files)
    assert back.ratio == pairs["fp16"].ratio and sorted(back.artifact_waves) == ["001", "002"]
    assert np.array_equal(back.reference_waves["001"][0], pairs["fp16"].reference_waves["001"][0])
    with pytest.raises(ForgeError, match="other files"):
        read_latency_pair(run, "fp16", settings, ref_files)
    with pytest.raises(ForgeError, match="other settings"):
        read_latency_pair(run, "fp16", {**settings, "seed": 1}, art_files)
    with pytest.raises(ForgeError, match="did not time"):
        read_latency_pair(run, "int4", settings, art_files)
    report = evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], cfg, latency_run=str(run))
    assert report["metrics"]["rtf_ratio_vs_reference"] == pairs["fp16"].ratio["ratio"]
    assert any("latency run" in note for note in report["notes"])


def test_evaluate_records_the_interleaved_gate_ratio_and_its_spread(tiny_artifacts, tmp_path) -> None:
    import json

    from chattts_forge.evaluate.evaluate import evaluate_artifact

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("您好，请问有什么可以帮您？\nYour order has shipped today.\n", encoding="utf-8")
    out = tmp_path / "report"
    report = evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], corpus, out=out,
                               baseline_checkpoint=None, progress=False, max_sentences=2, max_new_token=16,
                               fidelity_sentences=1, fidelity_steps=8, batch_sizes=(1,), threads=1)
    ratios = report["latency"]["ratios"]
    inter = ratios["vs_reference_rtf_interleaved"]
    assert inter["sentences"] == 2 and inter["rounds"] >= latency_mod.RATIO_MIN_ROUNDS and inter["spread"] >= 0
    assert report["metrics"]["rtf_ratio_vs_reference"] == inter["ratio"] == ratios["vs_reference"]["rtf_p50"]
    assert "rtf_p50_of_p50s" in ratios["vs_reference"] and ratios["vs_reference_interleaved"] is not None
    on_disk = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert on_disk["latency"]["ratios"]["vs_reference_rtf_interleaved"]["spread"] == inter["spread"]
    assert "interleaved: 90% interval" in (out / "report.md").read_text(encoding="utf-8")


def test_re_timing_against_a_baseline_alternates_the_two_and_keeps_every_round(fake, tmp_path) -> None:
    """The regression gate's RTF against the baseline's same variant: one warm-up each, then rounds of
    sentence r on both in turn (rotated); every round's ratio is returned for its interval."""
    (tmp_path / "base").mkdir()
    fake.seconds = staticmethod(lambda folder, i, k: (0.8 if folder == "art" else 1.0) * (1 + i))
    timing = retime_against("art", "base", SENTENCES, LatencyConfig(**QUIET), clock=ticking())
    rounds = timing["rounds"]
    assert rounds == latency_mod.RETIME_MIN_ROUNDS and timing["stopped"] == "spread within bound"
    assert fake.log[:2] == [("base", 0), ("art", 0)]  # the warm-ups
    synth = fake.log[2:]
    assert len(synth) == 2 * rounds
    for r in range(rounds):
        first, second = synth[2 * r], synth[2 * r + 1]
        assert first[1] == second[1] == r % len(SENTENCES)
        assert (first[0], second[0]) == (("base", "art") if r % 2 == 0 else ("art", "base"))
    assert timing["ratios"] == pytest.approx([0.8] * rounds) and timing["sentences"] == len(SENTENCES)
    assert not any(i == -1 for _, i in fake.log)  # RTF only: no first audio, throughput or memory


def test_re_timing_noise_stops_at_its_cap(fake, tmp_path) -> None:
    (tmp_path / "base").mkdir()
    fake.seconds = staticmethod(lambda folder, i, k: (0.5 if k % 2 else 1.5) if folder == "art" else 1.0)
    timing = retime_against("art", "base", SENTENCES, LatencyConfig(**QUIET), time_cap_s=3.0, clock=ticking())
    assert timing["stopped"] == "time cap" and latency_mod.RETIME_MIN_ROUNDS <= timing["rounds"] < 20
    assert len(timing["ratios"]) == timing["rounds"] and timing["time_cap_s"] == 3.0
    with pytest.raises(ForgeError, match="no sentences"):
        retime_against("art", "base", [], LatencyConfig(**QUIET))
