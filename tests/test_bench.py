"""`bench` on the tiny artifacts: the report has every documented key, ratios from the same run.

No timing thresholds here: speed is what the command reports, not what a test asserts.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.bench import RATIO_KEYS, RATIO_KEYS_HIGHER, BenchConfig, format_table, run_bench
from chattts_forge.quantize.fast_gpt_graph import optimize_artifact

DOC = Path(__file__).resolve().parent.parent / "docs" / "bench.md"
STAT_KEYS = {"median", "p10", "p90", "min", "n"}


def documented_keys() -> list[str]:
    """Every key path of the JSON table in docs/bench.md (first column, back-quoted), read from its
    "JSON report" section alone: the report's `memory` section has a key table of its own."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## JSON report", 1)[1].split("\n## ", 1)[0]
    keys = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    assert len(keys) > 30, "docs/bench.md lost its key table"
    return keys


def lookup(report: dict[str, Any], path: str, subst: dict[str, str]) -> Any:
    node: Any = report
    for part in path.split("."):
        part = subst.get(part, part)
        assert isinstance(node, dict) and part in node, f"documented key {path!r} missing at {part!r}"
        node = node[part]
    return node


@pytest.fixture(scope="module")
def fast_tiny(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("bench") / "fp32"
    shutil.copytree(tiny_artifacts["fp32"], dst)
    optimize_artifact(dst)
    return dst


def test_bench_against_pytorch_writes_every_documented_key(
    fast_tiny: Path, tiny_ckpt: Path, tiny_chat: Any, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    config = BenchConfig(baseline="pytorch", checkpoint=tiny_ckpt, batches=(1, 2), steps=10, threads=1, reps=2,
                         warmup_steps=4)
    report = run_bench(fast_tiny, config, chat=tiny_chat, json_out=out)
    # the shared ChatTTS oracle is left without the benchmark's timing hooks
    assert not tiny_chat.gpt.gpt._forward_hooks and not tiny_chat.gpt.gpt._forward_pre_hooks
    on_disk = json.loads(out.read_text())
    assert on_disk["schema"] == "chattts-forge/bench/1"
    assert on_disk["artifact"]["gpt_engine"] == "fast"
    assert on_disk["results"].keys() == {"onnx", "pytorch"}
    for path in documented_keys():
        for engine in ("onnx", "pytorch"):
            for batch in ("1", "2"):
                for goal in on_disk["goals"]:
                    lookup(on_disk, path, {"<engine>": engine, "<batch>": batch, "<figure>": "code_rtf", "<goal>": goal})
    for engine in ("onnx", "pytorch"):
        for batch in ("1", "2"):
            res = on_disk["results"][engine][batch]
            assert res["steps"] == 10  # EOS masked: every row ran all steps
            for key in ("gpt_step_ms", "full_step_ms", "code_rtf", "e2e_rtf", "streams"):
                assert set(res[key]) == STAT_KEYS and res[key]["median"] > 0
            # a decode step per generated step after the first (the first comes from the prefill), per rep
            assert res["gpt_step_ms"]["n"] == 2 * 9
            assert res["e2e_s"]["median"] >= res["code_stage_s"]["median"]
    assert on_disk["results"]["onnx"]["1"]["first_audio_s"]["n"] == 2
    assert "first_audio_s" not in on_disk["results"]["onnx"]["2"]
    # every ratio is onnx median / pytorch median of this very run
    for batch in ("1", "2"):
        for key in RATIO_KEYS + RATIO_KEYS_HIGHER:
            o = on_disk["results"]["onnx"][batch].get(key)
            t = on_disk["results"]["pytorch"][batch].get(key)
            if o is None:
                assert on_disk["ratios"][batch][key] is None
                continue
            assert on_disk["ratios"][batch][key] == pytest.approx(o["median"] / t["median"])
    # an RSS difference: the tiny model's PyTorch load can be smaller than what the allocator frees
    # meanwhile, so only its consistency with the ratio is checked
    mem = on_disk["memory"]
    torch_load, onnx_load = mem["pytorch"]["load_rss_mb"], mem["onnx"]["load_rss_mb"]
    assert math.isfinite(torch_load) and math.isfinite(onnx_load)
    assert mem["ratio_load_rss"] == (pytest.approx(onnx_load / torch_load) if torch_load > 0 else None)
    assert on_disk["goals"]["streams_b8"]["met"] is None  # batch 8 not run
    table = format_table(report)
    assert "onnx/pytorch" in table and "batch 2" in table


def test_bench_cli_plain_engine_without_baseline(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    res = CliRunner().invoke(
        main,
        ["bench", "--artifact", str(tiny_artifacts["fp32"]), "--batch", "1", "--steps", "6", "--reps", "1",
         "--threads", "1", "--engine", "plain", "--warmup-steps", "2", "--stream-lookahead", "4", "--json", str(out)],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["artifact"]["gpt_engine"] == "plain"
    assert report["settings"]["stream_lookahead_frames"] == 4
    assert report["settings"]["stream_exact_lookahead_frames"] > 4
    assert report["ratios"] is None and report["baseline"] is None
    assert "pytorch" not in report["results"]
    assert report["results"]["onnx"]["1"]["gpt_step_ms"]["n"] == 5
    assert "GPT step" in res.output


def test_bench_errors(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["bench", "--artifact", str(tiny_artifacts["fp32"]), "--batch", "1,x"])
    assert res.exit_code == 2 and "error: --batch" in res.output
    # fp16/ has no fused GPT graph (convert writes gpt_fast.onnx into fp32/ only).
    res = runner.invoke(main, ["bench", "--artifact", str(tiny_artifacts["fp16"]), "--engine", "fast", "--steps", "4"])
    assert res.exit_code == 2 and "no gpt_fast component" in res.output
    with pytest.raises(ForgeError, match="not an artifact folder"):
        run_bench(tmp_path)
    with pytest.raises(ForgeError, match="--steps"):
        run_bench(tiny_artifacts["fp32"], steps=1)
