"""`bench --load`: mixed-length requests through the scheduler per concurrency, against ChatTTS sequential."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.load_bench import run_load_bench, speech_steps

DOC = Path(__file__).resolve().parent.parent / "docs" / "bench-load.md"


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
    keys = re.findall(r"^\| `([^`]+)` \|", DOC.read_text(encoding="utf-8"), flags=re.M)
    assert len(keys) >= 10
    for path in keys:
        node = report
        *parents, leaves = path.split(".")
        for part in parents:
            node = node["1" if part == "<c>" else part]
        for leaf in leaves.split("/"):
            assert leaf in node, f"documented key {path} missing"


def test_load_bench_refusals(tiny_artifacts):
    with pytest.raises(ForgeError, match="needs --rate"):
        run_load_bench(tiny_artifacts["fp32"], arrival="poisson", requests=1)
    with pytest.raises(ForgeError, match="--requests"):
        run_load_bench(tiny_artifacts["fp32"], requests=0)
