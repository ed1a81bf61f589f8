"""The measured stream look-ahead (runtime.stream_lookahead, artifact.json `streaming`): recorded where an
artifact is made, chosen by its rule, used by default by synth, the scheduler the server builds and the
server's `stream_lookahead` field, judged by the gate on held-out sentences."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chattts_forge.artifact import ARTIFACT_JSON, ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.gate import judge, load_gate, stream_threshold_db
from chattts_forge.runtime import Pipeline
from chattts_forge.runtime.stream_decode import parse_stream_lookahead, resolve_lookahead
from chattts_forge.runtime.stream_lookahead import MARGIN_DB, choose_lookahead

TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


def check_record(folder: Path) -> dict:
    """The artifact's `streaming` record, checked against the rule it was chosen by."""
    meta = ArtifactMeta.load(folder)
    rec = meta.streaming
    assert rec is not None, f"{folder} records no stream look-ahead"
    pipe = Pipeline(folder, threads=1, verify="size")
    exact = pipe.decoder_radius + pipe.vocos_radius
    assert rec["exact_frames"] == exact
    assert rec["threshold_db"] == stream_threshold_db() == 60.0 and rec["margin_db"] == MARGIN_DB == 20.0
    assert rec["sentences"] >= 1 and rec["stream_batch"] >= 1
    curve = rec["curve"]
    frames = [p["lookahead_frames"] for p in curve]
    assert frames == sorted(frames) and frames[-1] == exact and all(1 <= f <= exact for f in frames)
    required = rec["threshold_db"] + rec["margin_db"]
    clearing = [p["lookahead_frames"] for p in curve if p["snr_db_min"] is not None and p["snr_db_min"] >= required]
    # the shortest clearing threshold + margin; the exact field when none does
    assert rec["lookahead_frames"] == (min(clearing) if clearing else exact)
    assert all(p["snr_db_min"] is None or p["snr_db_min"] < required for p in curve
               if p["lookahead_frames"] < rec["lookahead_frames"])
    assert meta.stream_lookahead() == rec["lookahead_frames"] == pipe.default_lookahead
    return rec


def test_the_rule_picks_the_shortest_clearing_look_ahead() -> None:
    curve = [{"lookahead_frames": f, "snr_db_min": s} for f, s in ((8, 20.0), (16, 79.9), (24, 80.0), (30, 120.0))]
    assert choose_lookahead(curve, 30, 80.0) == 24
    assert choose_lookahead(curve, 30, 121.0) == 30  # none clears: the exact field
    assert choose_lookahead([{"lookahead_frames": 8, "snr_db_min": None}], 30, 80.0) == 30


def test_convert_records_the_look_ahead_and_its_curve(tiny_artifacts: dict[str, Path]) -> None:
    for variant in ("fp32", "fp16"):
        check_record(tiny_artifacts[variant])
    # a load -> write round trip keeps the bytes, the section included
    folder = tiny_artifacts["fp32"]
    before = (folder / ARTIFACT_JSON).read_bytes()
    assert json.dumps(ArtifactMeta.load(folder).to_dict(), indent=2).encode() in (before, before.rstrip(b"\n"))


def test_quantize_records_its_own_look_ahead(tiny_kv8: Path) -> None:
    rec = check_record(tiny_kv8)
    doc = json.loads((tiny_kv8 / ARTIFACT_JSON).read_text())
    assert list(doc)[-1] == "streaming" and "fidelity" in doc  # measured on the written variant, recorded last
    assert rec["curve"]


def test_every_quantized_variant_records_one(tiny_quantized: dict[str, Path]) -> None:
    for folder in tiny_quantized.values():
        check_record(folder)


def _without_record(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / ARTIFACT_JSON).read_text())
    doc.pop("streaming")
    (dst / ARTIFACT_JSON).write_text(json.dumps(doc, indent=2) + "\n")
    return dst


def _synth_stream(folder: Path, out: Path, *lookahead: str) -> np.ndarray:
    from click.testing import CliRunner

    from chattts_forge.runtime.cli import synth

    r = CliRunner().invoke(synth, ["--artifact", str(folder), "--text", TEXT, "--out", str(out), "--seed", "3",
                                   "--no-refine", "--max-new-token", "64", "--threads", "1", "--stream",
                                   *(["--stream-lookahead", *lookahead] if lookahead else [])])
    assert r.exit_code == 0, r.output
    return sf.read(out, dtype="float32")[0]


def _library_stream(folder: Path, lookahead_frames: int | None) -> np.ndarray:
    from chattts_forge.runtime.synth import SynthConfig, synth_params

    pipe = Pipeline(folder, threads=1, verify="size")
    params, _ = synth_params(SynthConfig(artifact=folder, out=Path("x.wav"), text=TEXT, seed=3, refine=False,
                                         max_new_token=64, threads=1), pipe, lambda: pipe)
    return np.concatenate([c[0] for c in pipe.stream([TEXT], params, lookahead_frames=lookahead_frames)])


def test_synth_streams_at_the_recorded_look_ahead_and_exact_on_request(tiny_artifacts: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    folder = tiny_artifacts["fp32"]
    n = ArtifactMeta.load(folder).stream_lookahead()
    default = _synth_stream(folder, tmp_path / "default.wav")
    exact = _synth_stream(folder, tmp_path / "exact.wav", "exact")
    np.testing.assert_array_equal(default, _library_stream(folder, n))
    np.testing.assert_array_equal(exact, _library_stream(folder, None))  # the old exact stream
    np.testing.assert_array_equal(_synth_stream(folder, tmp_path / "n.wav", "5"), _library_stream(folder, 5))


def test_an_artifact_without_the_record_loads_and_streams_exactly(tiny_artifacts: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    old = _without_record(tiny_artifacts["fp32"], tmp_path / "old")
    meta = ArtifactMeta.load(old)
    assert meta.streaming is None and meta.stream_lookahead() is None and "streaming" not in meta.to_dict()
    pipe = Pipeline(old, threads=1, verify="size")
    assert pipe.default_lookahead is None and pipe.resolve_lookahead() is None
    np.testing.assert_array_equal(_synth_stream(old, tmp_path / "old.wav"), _library_stream(old, None))


def test_a_broken_record_is_one_line() -> None:
    doc = {"schema": "chattts-forge/artifact/1", "variant": "fp32", "components": {}}
    for bad in ({"lookahead_frames": 0}, {"lookahead_frames": "soon"}, {"curve": []}, {"lookahead_frames": True}):
        with pytest.raises(ForgeError, match="streaming.lookahead_frames"):
            ArtifactMeta.from_dict({**doc, "streaming": bad})


def test_requested_look_aheads_resolve() -> None:
    assert resolve_lookahead(None, 24) == 24 and resolve_lookahead(None, None) is None
    assert resolve_lookahead("exact", 24) is None and resolve_lookahead("EXACT", 24) is None
    assert resolve_lookahead(8, 24) == 8 and resolve_lookahead("8", None) == 8
    for bad in ("soon", 0, -1, True, 2.5, "-3"):
        with pytest.raises(ForgeError, match="exact"):
            parse_stream_lookahead(bad)


def test_bad_cli_values_are_refused(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from chattts_forge.runtime.cli import synth

    r = CliRunner().invoke(synth, ["--artifact", str(tiny_artifacts["fp32"]), "--text", TEXT, "--out",
                                   str(tmp_path / "x.wav"), "--stream", "--stream-lookahead", "soon"])
    assert r.exit_code != 0 and "--stream-lookahead" in r.output and "exact" in r.output


def test_the_server_field_is_parsed_and_refused_with_its_param() -> None:
    from chattts_forge.runtime.params import SynthParams
    from chattts_forge.runtime.serve.requests import BadRequest, parse_native, parse_openai

    def openai(**extra: object):
        return parse_openai({"model": "tts-1", "input": "hello", "voice": "alloy", **extra}, SynthParams(), 400)

    def native(**extra: object):
        return parse_native({"text": "hello", **extra}, 400, 0)

    for parse in (openai, native):
        assert parse().stream_lookahead is None
        assert parse(stream_lookahead=None).stream_lookahead is None
        assert parse(stream_lookahead="exact").stream_lookahead == "exact"
        assert parse(stream_lookahead=16).stream_lookahead == 16
        assert parse(stream_lookahead=1).stream_lookahead == 1
        for bad in ("soon", "16", 0, -1, True, 2.5, [16], {"frames": 16}):
            with pytest.raises(BadRequest, match="stream_lookahead") as e:
                parse(stream_lookahead=bad)
            assert e.value.param == "stream_lookahead"


def test_the_scheduler_takes_a_look_ahead_per_request(tiny_artifacts: dict[str, Path]) -> None:
    from chattts_forge.runtime.params import InferCodeParams, SynthParams
    from chattts_forge.runtime.scheduler import Scheduler

    pipe = Pipeline(tiny_artifacts["fp32"], threads=1, verify="size", engine="fast")
    n = pipe.default_lookahead
    params = SynthParams(code=InferCodeParams(spk_emb=pipe.random_speaker(3), seed=3, max_new_token=48))
    with Scheduler(pipe, max_batch=2, lookahead_frames=n) as sched:
        handles = {asked: sched.submit(TEXT, params, lookahead=asked) for asked in (None, "exact", 5)}
        wavs = {asked: np.concatenate(list(h.chunks())) for asked, h in handles.items()}
    assert [h.lookahead_frames for h in handles.values()] == [n, None, 5]
    whole = pipe.synthesize(TEXT, params)[0].wav
    assert len(wavs["exact"]) == len(whole)
    np.testing.assert_allclose(wavs["exact"], whole, atol=1e-4)  # the exact stream is the whole waveform


def test_the_gate_refuses_a_recorded_look_ahead_that_fails_on_held_out_sentences(tiny_artifacts: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    from chattts_forge.calibration_data.corpus import load_corpus
    from chattts_forge.evaluate.seams import NO_RECORDED_LOOKAHEAD, measure_seams, recorded_lookahead_snr_db

    held_out = load_corpus("builtin:evaluation").sentences[:2]
    gate = load_gate(None)
    metric = "stream_recorded_lookahead_snr_db"

    def verdict(folder: Path, **kw: object) -> tuple[dict, dict]:
        streaming = measure_seams(folder, held_out, max_new_token=48, threads=1, **kw)
        value, why = recorded_lookahead_snr_db(streaming)
        check = next(c for c in judge(gate, {metric: value}, reasons={metric: why or ""})["checks"]
                     if c["metric"] == metric)
        return streaming, check

    streaming, check = verdict(tiny_artifacts["fp32"])
    assert streaming["modes"]["lookahead"]["source"] == "recorded"
    assert streaming["recorded"]["curve"] and check["status"] == "pass", check["message"]

    broken = shutil.copytree(tiny_artifacts["fp32"], tmp_path / "broken")
    doc = json.loads((broken / ARTIFACT_JSON).read_text())
    doc["streaming"]["lookahead_frames"] = 1  # absurdly small: one mel frame of right context
    (broken / ARTIFACT_JSON).write_text(json.dumps(doc, indent=2) + "\n")
    streaming, check = verdict(broken)
    assert check["status"] == "fail" and check["section"] == "streaming"
    assert check["message"].startswith(f"{metric} = ") and "violates >= 60" in check["message"]

    # an override measures its own look-ahead and still the recorded one, which the gate judges
    streaming, check = verdict(broken, lookahead_frames=30)
    assert streaming["modes"]["lookahead"]["source"] == "option" and streaming["modes"]["recorded"]["lookahead_frames"] == 1
    assert check["status"] == "fail"

    old = _without_record(tiny_artifacts["fp32"], tmp_path / "old")
    streaming = measure_seams(old, held_out[:1], max_new_token=48, threads=1)
    assert streaming["modes"]["lookahead"]["source"] == "fixed"
    assert recorded_lookahead_snr_db(streaming) == (None, NO_RECORDED_LOOKAHEAD)


def test_bench_streams_at_the_recorded_look_ahead_unless_told(tiny_artifacts: dict[str, Path]) -> None:
    from chattts_forge.runtime.timed_engine import OnnxEngine

    folder = tiny_artifacts["fp32"]
    n = ArtifactMeta.load(folder).stream_lookahead()
    assert OnnxEngine(folder, 1).stream_lookahead == n
    assert OnnxEngine(folder, 1, stream_lookahead="exact").stream_lookahead is None
    assert OnnxEngine(folder, 1, stream_lookahead=7).stream_lookahead == 7
