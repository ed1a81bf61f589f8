"""`bench --load`: mixed-length requests through the scheduler per concurrency, against ChatTTS sequential."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.load_bench import (
    corpus_requests,
    hit_indices,
    plan_requests,
    plan_with_cache,
    replay,
    run_load_bench,
    speech_steps,
)
from chattts_forge.evaluate.load_bench_config import LoadBenchConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "bench-load.md"
CACHE_SECTION = "## With `--phrase-cache-hit-ratio R`"


def documented_keys(with_cache: bool) -> list[str]:
    """The keys docs/bench-load.md documents: those of every run, or those present only with a hit ratio."""
    text = DOC.read_text(encoding="utf-8")
    assert CACHE_SECTION in text
    before, after = text.split(CACHE_SECTION, 1)
    return re.findall(r"^\| `([^`]+)` \|", after if with_cache else before, flags=re.M)


def assert_documented_keys_present(report: dict, keys: list[str], level: str) -> None:
    for path in keys:
        node = report
        *parents, leaves = path.split(".")
        for part in parents:
            node = node[level if part == "<c>" else part]
        for leaf in leaves.split("/"):
            assert leaf in node, f"documented key {path} missing"


def test_speech_steps_follow_the_text():
    assert speech_steps("Short.") < speech_steps("A much longer English sentence about many different things.")
    assert speech_steps("你好，欢迎使用我们的服务。") > speech_steps("Hello, welcome.")  # CJK is slower to speak
    assert 24 <= speech_steps("") and speech_steps("字" * 1000) <= 430


def test_load_bench_reports_every_concurrency_with_baseline(tiny_artifacts, tiny_ckpt, tmp_path):
    out = tmp_path / "load.json"
    result = CliRunner().invoke(main, [
        "bench", "--artifact", str(tiny_artifacts["fp32"]), "--load", "--concurrency", "1,3", "--requests", "4",
        "--threads", "1", "--baseline", "pytorch", "--checkpoint", str(tiny_ckpt), "--baseline-requests", "2",
        "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"1", "3"}
    steps = report["settings"]["request_steps"]
    assert len(steps) == 4 and len(set(steps)) > 1  # mixed lengths
    for r in report["results"].values():
        assert r["completed"] == 4 and not r["failed"]
        lat = r["latency_s"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert 0 < r["first_audio_s"]["p50"] <= r["first_audio_s"]["p95"]
        assert r["audio_s"] > 0 and r["real_time_streams"] == pytest.approx(r["audio_s"] / r["wall_s"])
        assert r["sentences_per_s_vs_pytorch"] == pytest.approx(
            r["sentences_per_s"] / report["baseline"]["sentences_per_s"])
    # batch 3 shares GPT steps: fewer batched steps than requests' steps summed
    assert report["results"]["3"]["batched_gpt_steps"] < sum(steps)
    assert report["results"]["1"]["batched_gpt_steps"] == sum(steps) - 4  # step 0 of each comes from its prefill
    assert report["baseline"]["requests"] == 2 and report["runtime_peak_rss_mb"] > 0
    assert "PyTorch sequential" in result.output
    # every key docs/bench-load.md documents is in the report ("a/b" leaves: each of them)
    keys = documented_keys(with_cache=False)
    assert len(keys) >= 10
    assert_documented_keys_present(report, keys, "1")
    # Without a hit ratio there is no hit/miss split (its keys are documented as present only with one).
    assert report["settings"]["phrase_cache_hit_ratio"] is None and "phrase_cache" not in report
    assert all("phrase_cache" not in r for r in report["results"].values())


def test_load_bench_refusals(tiny_artifacts):
    with pytest.raises(ForgeError, match="needs --rate"):
        run_load_bench(LoadBenchConfig(tiny_artifacts["fp32"], arrival="poisson", requests=1))
    with pytest.raises(ForgeError, match="--requests"):
        run_load_bench(LoadBenchConfig(tiny_artifacts["fp32"], requests=0))


# ---- --phrase-cache-hit-ratio ----------------------------------------------------------------------


def test_hit_requests_are_the_stated_share_drawn_by_the_seed():
    picked = hit_indices(10, 0.5, seed=0)
    assert len(picked) == 5 and picked == sorted(set(picked)) and all(0 <= i < 10 for i in picked)
    assert hit_indices(10, 0.5, seed=0) == picked  # the same seed, the same requests
    assert any(hit_indices(10, 0.5, seed=s) != picked for s in range(1, 6))  # the seed decides which
    assert hit_indices(10, 0.0, 0) == [] and hit_indices(10, 1.0, 0) == list(range(10))
    assert len(hit_indices(5, 0.5, 0)) == 3 and len(hit_indices(7, 0.6, 0)) == 4  # halves round up
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ForgeError, match=r"must lie in \[0, 1\]"):
            hit_indices(10, bad, 0)


def test_load_bench_serves_the_stated_share_from_a_phrase_cache(tiny_artifacts, tmp_path):
    out = tmp_path / "load.json"
    result = CliRunner().invoke(main, [
        "bench", "--artifact", str(tiny_artifacts["fp32"]), "--load", "--concurrency", "2", "--requests", "6",
        "--threads", "1", "--phrase-cache-hit-ratio", "0.5", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    planned = hit_indices(6, 0.5, seed=0)
    assert report["phrase_cache"]["hit_requests"] == planned and len(planned) == 3
    assert report["phrase_cache"]["file"] is None and report["phrase_cache"]["phrases"] >= 1
    r = report["results"]["2"]
    pc = r["phrase_cache"]
    assert r["completed"] == 6 and not r["failed"]
    assert (pc["hits"], pc["misses"], pc["hit_ratio"], pc["hit_ratio_asked"]) == (3, 3, 0.5, 0.5)
    for name in ("hit", "miss"):
        lat, first = pc[f"latency_s_{name}"], pc[f"first_audio_s_{name}"]
        assert 0 < lat["p50"] <= lat["max"] and 0 < first["p50"] <= first["p95"]
    # A hit's only audio arrives at its end; a miss's first audio comes before its end.
    assert pc["first_audio_s_hit"]["p50"] == pc["latency_s_hit"]["p50"]
    assert "phrase cache: 3 hits / 3 misses" in result.output
    assert_documented_keys_present(report, documented_keys(with_cache=True), "2")


def test_hits_are_the_cached_audio_and_misses_are_unchanged(tiny_artifacts, tmp_path):
    from chattts_forge.runtime.phrase_cache import cache_knobs
    from chattts_forge.runtime.pipeline import Pipeline

    art = tiny_artifacts["fp32"]
    pipe = Pipeline(art, threads=1, engine="fast")
    reqs = corpus_requests("builtin:evaluation", 6, seed=3)
    plan, pcache, info = plan_with_cache(pipe, art, reqs, 3, 0.5, None, tmp_path)
    assert pcache is not None and [r.index for r in plan if r.hit] == info["hit_requests"] == hit_indices(6, 0.5, 3)
    try:
        got, _, _ = replay(pipe, plan, 3, cache=pcache)
    finally:
        pcache.cache.close()
    alone, _, _ = replay(pipe, plan_requests(reqs, 3), 3)  # the same requests, no cache
    assert [o.index for o in got] == [o.index for o in alone] == list(range(6))
    for req, o, ref in zip(plan, got, alone, strict=True):
        assert o.error is None and o.result is not None and o.cached is req.hit
        if req.hit:
            params = req.params
            phrase = pcache.cache.get(pcache.payload, pipe.normalize(req.text, params), cache_knobs(params, pipe.num_vq))
            assert phrase is not None
            assert np.array_equal(o.result.wav, pipe.vocos(phrase.mel))  # Vocos on the stored mel
            assert np.array_equal(o.result.codes, phrase.codes) and o.result.hiddens.shape[0] == 0
            # ... which is the audio of the same request synthesized without a cache, as the bench serves
            # it: one row of its normalised text (a long one is not cut into segments here)
            [miss] = pipe.synthesize_rows([pipe.normalize(req.text, params)], params)
            assert np.max(np.abs(miss.wav - o.result.wav)) <= 1e-4
        else:  # untouched by the hits around it
            assert np.array_equal(o.result.codes, ref.result.codes)
            assert np.array_equal(o.result.wav, ref.result.wav)


def test_load_bench_replays_a_given_phrase_cache(tiny_artifacts, tmp_path):
    from chattts_forge.runtime.phrase_cache_build import build_phrase_cache
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams

    art = tiny_artifacts["fp32"]
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("请稍等。\nPlease hold on.\n", encoding="utf-8")
    params = SynthParams(code=InferCodeParams(seed=5, max_new_token=16))
    built = build_phrase_cache(art, phrases, tmp_path / "c.bin", params, threads=1)
    report = run_load_bench(LoadBenchConfig(art, concurrency=(1,), requests=3, threads=1, phrase_cache_hit_ratio=1.0,
                                            phrase_cache=built["path"]))
    pc = report["results"]["1"]["phrase_cache"]
    assert (pc["hits"], pc["misses"]) == (3, 0) and report["results"]["1"]["batched_gpt_steps"] == 0
    assert report["phrase_cache"]["file"] == built["path"] and report["phrase_cache"]["phrases"] == 2
    assert report["phrase_cache"]["knobs"]["seed"] == 5 and report["settings"]["request_steps"] == [16] * 3
    # A cache built for another artifact (here: other artifact.json bytes, so another payload) is refused.
    other = shutil.copytree(art, tmp_path / "other")
    with open(other / "artifact.json", "a", encoding="utf-8") as f:
        f.write("\n")
    with pytest.raises(ForgeError, match="built for other artifacts"):
        run_load_bench(LoadBenchConfig(other, concurrency=(1,), requests=1, phrase_cache_hit_ratio=0.5,
                                       phrase_cache=built["path"]))


def test_phrase_cache_hit_ratio_refusals(tiny_artifacts, tmp_path):
    art = str(tiny_artifacts["fp32"])
    for bad in ("1.5", "-0.2", "nan"):
        result = CliRunner().invoke(main, ["bench", "--artifact", art, "--load", "--requests", "1",
                                           "--phrase-cache-hit-ratio", bad])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines()[-1] == f"error: --phrase-cache-hit-ratio must lie in [0, 1], got {float(bad)}"
    with pytest.raises(ForgeError, match="--phrase-cache needs --phrase-cache-hit-ratio"):
        run_load_bench(LoadBenchConfig(art, requests=1, phrase_cache=tmp_path / "c.bin"))
    result = CliRunner().invoke(main, ["bench", "--artifact", art, "--phrase-cache-hit-ratio", "0.5"])
    assert result.exit_code == 2
    assert "--phrase-cache-hit-ratio does not apply to the plain benchmark (it applies to: --load)" in result.output


@pytest.mark.parametrize("flag", ["--decode-overlap", "--no-decode-overlap"])
def test_load_bench_decode_overlap_option(tiny_artifacts, tmp_path, flag):
    out = tmp_path / "load.json"
    result = CliRunner().invoke(main, [
        "bench", "--artifact", str(tiny_artifacts["fp32"]), "--load", "--concurrency", "2", "--requests", "3",
        "--threads", "1", flag, "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    on = flag == "--decode-overlap"
    assert report["settings"]["decode_overlap"] is on and report["settings"]["decode_overlap_asked"] is on
    r = report["results"]["2"]
    assert r["completed"] == 3 and not r["failed"] and r["audio_s"] > 0
    refused = CliRunner().invoke(main, ["bench", "--artifact", str(tiny_artifacts["fp32"]), flag])
    assert refused.exit_code == 2 and f"{flag} does not apply to the plain benchmark (it applies to: --load)" in (
        refused.output)
