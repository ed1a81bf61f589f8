"""Issue 50: each variant's memory is its own, measured in a process of its own as `bench` measures it,
judged against FP32, compared with the previous version, shown per batch size and checked by `serve
--memory-limit` at start.

No memory goal here: the figures are checked to be recorded, positive, the child's own (not the process
that started it) and consistent with `bench` within a generous factor; the rules on constructed numbers.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recorded_reports import BEFORE_MEMORY, publish_report, recorded_report
from stand_in_report import stand_in_report

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.report_record import ReportRecord
from chattts_forge.evaluate.report_schema import headline, read_report, seal, validate, write_report
from chattts_forge.evaluate.version_page import VariantEntry, render_version_page
from chattts_forge.gate import judge, load_gate
from chattts_forge.publish.history import history_bytes
from chattts_forge.publish.manifest import MANIFEST_SCHEMA
from chattts_forge.publish.regression import MEMORY_REPEATABILITY, compare
from chattts_forge.publish.version_files import memory_figures
from chattts_forge.runtime.memory_probe import measure_memory, probe_command
from chattts_forge.runtime.serve.guard import MemoryGuard, batch_figure, memory_warning
from chattts_forge.runtime.timing import peak_rss_bytes

MIB = 2**20
BALLAST_MIB = 384  # what the test process holds while it starts the children


@pytest.fixture
def ballast() -> Any:
    """This process made larger than any tiny child: a child that reported its parent's memory would show it."""
    block = np.ones(BALLAST_MIB * MIB, dtype=np.uint8)  # touched: resident
    yield block
    del block


def test_a_child_process_reports_its_own_peak_not_its_parents(ballast: np.ndarray) -> None:
    # Before issue 50, peak_rss_bytes read getrusage's ru_maxrss, which exec carries over from the
    # parent's memory map: every probe a large process started reported the large process's peak.
    code = "from chattts_forge.runtime.timing import peak_rss_bytes; print(peak_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 < child < peak_rss_bytes() - BALLAST_MIB * MIB // 2


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM counters")
def test_a_variants_memory_is_measured_alone_and_agrees_with_bench(tiny_artifacts: dict[str, Path], tmp_path: Path,
                                                                    ballast: np.ndarray) -> None:
    fp32 = tiny_artifacts["fp32"]
    record = measure_memory(fp32, threads=1, steps=32, label="fp32")
    by_batch = record["peak_rss_mb_by_batch"]
    assert set(by_batch) == {"1", "8"} and record["peak_rss_mb"] == by_batch["1"]
    assert by_batch["1"] >= record["load_peak_mb"] >= record["after_load_mb"] > record["python_baseline_mb"] > 0
    assert by_batch["8"] >= 0.9 * by_batch["1"]
    # the child's own: far under this process, which holds the ballast
    assert by_batch["8"] < peak_rss_bytes() / MIB - BALLAST_MIB / 2
    assert record["command"] == "python -m chattts_forge.runtime.memory_probe --artifact fp32 --batch 1,8 --steps 32 " \
                                "--threads 1"
    assert record["command"] == probe_command("fp32", threads=1, steps=32)
    assert str(fp32.parent) not in json.dumps(record)  # recorded by the variant's name, no path of this machine
    assert record["steps"] == 32 and record["batches"] == [1, 8] and record["seconds"] > record["probe_seconds"] > 0

    # the same figure as `chattts-forge bench --batch 1` (its process peak), within a generous factor:
    # the two processes import different modules (the CLI's) around the same runtime and workload
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, "-m", "chattts_forge.cli", "bench", "--artifact", str(fp32), "--batch", "1",
                    "--steps", "32", "--reps", "1", "--threads", "1", "--no-first-audio", "--json", str(out)],
                   capture_output=True, text=True, check=True, timeout=600)
    bench_peak = json.loads(out.read_text())["memory"]["process_peak_rss_mb"]
    assert 1 / 1.5 < by_batch["1"] / bench_peak < 1.5

    # the command repeats it: the probe's module run from the artifact's parent folder
    words = record["command"].split()[1:]
    again = subprocess.run([sys.executable, *words], cwd=fp32.parent, capture_output=True, text=True, check=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    repeated = json.loads(again.stdout.strip().splitlines()[-1])
    assert 1 / 1.5 < repeated["peak_rss_mb_by_batch"]["1"] / by_batch["1"] < 1.5


def test_a_probe_that_fails_says_why_in_one_line_without_a_path(tmp_path: Path) -> None:
    broken = tmp_path / "not-an-artifact"
    broken.mkdir()
    record = measure_memory(broken, steps=4, label="int8-dynamic")
    assert record["peak_rss_mb"] is None and record["peak_rss_mb_by_batch"] == {}
    assert record["error"] and "\n" not in record["error"] and str(tmp_path) not in record["error"]
    bad = subprocess.run([sys.executable, "-m", "chattts_forge.runtime.memory_probe", "--artifact", str(broken),
                          "--batch", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--batch values must be >= 1" in bad.stderr


# ---- the gate's and the pages' figures, on constructed numbers --------------------------------------------


def _with_memory(report: dict[str, Any], b1: float, b8: float, ratio: float) -> dict[str, Any]:
    report["metrics"] = {**report["metrics"], "peak_rss_mb": b1, "peak_rss_b8_mb": b8,
                         "peak_rss_ratio_vs_reference": ratio}
    gate = load_gate(None)
    verdict = judge(gate, report["metrics"])
    report["gate"] = {**verdict, "thresholds": report["gate"]["thresholds"], "regression": gate["regression"]}
    report["passed"] = verdict["passed"]
    report["headline"] = headline(report["artifact"]["variant"], report["passed"], report["metrics"])
    report["memory"] = {"artifact": {"peak_rss_mb": b1, "peak_rss_mb_by_batch": {"1": b1, "8": b8},
                                     "after_load_mb": b1 - 10, "python_baseline_mb": 60.0, "steps": 422, "threads": 2,
                                     "provider": "cpu", "command": probe_command("fp32")},
                        "reference": None, "ratio_vs_reference": {"1": ratio}, "definition": "test"}
    return report


def test_reports_without_the_new_headline_figures_still_read(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    report = stand_in_report(tiny_artifacts["fp32"])
    assert {"peak_rss_b8_mb", "peak_rss_ratio_vs_reference"} <= set(report["headline"])
    validate(_with_memory(report, 120.0, 140.0, 1.0))
    for key in ("peak_rss_b8_mb", "peak_rss_ratio_vs_reference"):  # a report written before issue 50
        del report["headline"][key]
    del report["memory"]
    validate(report)
    report["headline"]["peak_rss_b8_mb"] = "140"
    with pytest.raises(ForgeError, match="headline.peak_rss_b8_mb must be"):
        validate(report)


def test_the_version_page_shows_batch_1_and_batch_8_per_variant(tiny_artifacts: dict[str, Path],
                                                               tmp_path: Path) -> None:
    entries = []
    for variant, b1, b8, ratio in (("fp32", 1345.0, 2210.0, 1.0), ("int8-dynamic", 435.0, 1097.0, 0.32)):
        report = stand_in_report(tiny_artifacts["fp32"])
        report["artifact"] = {**report["artifact"], "variant": variant}
        out = write_report(seal(_with_memory(report, b1, b8, ratio)), tmp_path / variant)
        entries.append(VariantEntry(variant, "published", read_report(out).record, out))
    page = render_version_page("chattts", "v1", entries, None).decode("utf-8")
    assert "<th>peak RSS MB b1</th>" in page and "<th>peak RSS MB b8</th>" in page
    row = re.search(r"<tr id='variant-int8-dynamic'>(.*?)</tr>", page, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[-2].startswith("435") and "peak_rss_ratio_vs_reference = 0.32" in row  # with the gate's check
    assert cells[-1].startswith("1097")


def _manifest(folder: Path, variant: str, head: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({
        "schema": MANIFEST_SCHEMA, "model": "m", "version": folder.parent.name, "variant": variant, "created_at": "x",
        "gate": {"passed": True, "headline": head}, "source_checkpoint": {"kind": "synthetic", "hashes": {}},
        "precision": {}, "files": []}))


def test_the_history_page_shows_memory_only_where_it_was_each_variants_own(tmp_path: Path) -> None:
    model = tmp_path / "m"
    # v1 was evaluated before issue 50: its peak_rss_mb is the shared latency process's (5,260 MB at full size)
    _manifest(model / "v1" / "int8-dynamic", "int8-dynamic", {"peak_rss_mb": 5260.0, "size_mb": 190.0})
    _manifest(model / "v2" / "int8-dynamic", "int8-dynamic", {"peak_rss_mb": 435.0, "peak_rss_b8_mb": 1097.0,
                                                               "size_mb": 190.0})
    page = history_bytes(model).decode("utf-8")
    rows = re.findall(r"<tr><th><a href='(v\d)/report.html'>.*?</tr>", page, re.S)
    assert rows == ["v1", "v2"] and "peak RSS MB b1" in page and "peak RSS MB b8" in page
    v1, v2 = (re.search(rf"<tr><th><a href='{v}/report.html'>(.*?)</tr>", page, re.S).group(1) for v in ("v1", "v2"))
    assert "5260" not in v1 and re.findall(r"<td>(.*?)</td>", v1)[-3:-1] == ["-", "-"]
    assert re.findall(r"<td>(.*?)</td>", v2)[-3:-1] == ["435", "1097"]


def test_the_regression_gate_compares_the_memory_ratio_with_the_previous_version(tmp_path: Path) -> None:
    tolerances = load_gate(None)["regression"]
    assert tolerances["peak_rss_ratio_vs_reference"] == pytest.approx(0.10)

    def report(ratio: float) -> ReportRecord:  # the recorded tiny report at another memory ratio, nothing waived
        def edit(report: dict[str, Any]) -> None:
            report["metrics"]["peak_rss_ratio_vs_reference"] = ratio
            report["gate"]["waived"] = {}
        return recorded_report(edit=edit)

    folder = tmp_path / "v1" / "int8-dynamic"
    core = {"schema": MANIFEST_SCHEMA, "model": "m", "version": "v1", "variant": "int8-dynamic", "created_at": "x",
            "gate": {"passed": True}, "precision": {}, "source_checkpoint": {"kind": "synthetic", "hashes": {"a": "b"}},
            "quantization": {"method": "dynamic", "options": {}}, "files": []}
    publish_report(folder, report(0.40))
    (folder / "manifest.json").write_text(json.dumps(core))
    same = compare(report(0.41), core, folder, "v1", tolerances)["figures"]["peak_rss_ratio_vs_reference"]
    assert same["status"] == "same" and same["high"] - same["low"] == pytest.approx(2 * MEMORY_REPEATABILITY)
    worse = compare(report(0.55), core, folder, "v1", tolerances)
    entry = worse["figures"]["peak_rss_ratio_vs_reference"]
    assert worse["verdict"] == "regression" and entry["status"] == "regression" and entry["relative"]
    assert worse["regressions"] == ["peak_rss_ratio_vs_reference"]  # the report's other figures are unchanged
    assert "batch-1 peak RSS over its FP32" in entry["message"]
    assert compare(report(0.30), core, folder, "v1", tolerances)["improvements"] == ["peak_rss_ratio_vs_reference"]
    # a baseline measured before issue 50 has no such figure: not compared, never a false regression
    before = recorded_report(BEFORE_MEMORY)
    assert "peak_rss_ratio_vs_reference" not in before.metrics
    publish_report(folder, before)
    assert "peak_rss_ratio_vs_reference" not in compare(report(0.55), core, folder, "v1", tolerances)["figures"]


# ---- routing.json and serve --memory-limit -----------------------------------------------------------------


def test_routing_records_each_variants_memory_from_its_report(tiny_artifacts: dict[str, Path]) -> None:
    report = _with_memory(stand_in_report(tiny_artifacts["fp32"]), 435.0, 1097.0, 0.32)
    figures = memory_figures(validate(report))
    assert figures["peak_rss_mb_by_batch"] == {"1": 435.0, "8": 1097.0} and figures["steps"] == 422
    assert figures["command"].startswith("python -m chattts_forge.runtime.memory_probe --artifact ")
    assert memory_figures(validate(stand_in_report(tiny_artifacts["fp32"]))) is None  # a report without memory


def test_batch_figures_between_and_beyond_the_measured_batch_sizes() -> None:
    by_batch = {"1": 400.0, "8": 1100.0}
    assert batch_figure(by_batch, 8) == (1100.0, True) and batch_figure(by_batch, 1) == (400.0, True)
    assert batch_figure(by_batch, 4) == (pytest.approx(700.0), False)  # 100 MiB a row
    assert batch_figure(by_batch, 16) == (pytest.approx(1900.0), False)
    assert batch_figure({"1": 400.0}, 8) == (400.0, False) and batch_figure({"1": "x"}, 8) is None


def test_the_memory_warning_names_the_variant_its_figure_and_the_batch() -> None:
    record = {"peak_rss_mb_by_batch": {"1": 435.0, "8": 1097.0}, "python_baseline_mb": 60.0, "steps": 422}
    assert memory_warning({"int8-dynamic": record}, 2048 * MIB, 8) is None  # fits under 85% of 2 GiB
    line = memory_warning({"int8-dynamic": record}, 1024 * MIB, 8)
    assert line is not None and "\n" not in line
    assert "--memory-limit 1024 MiB" in line and "--max-batch 8" in line and "int8-dynamic 1097 MiB" in line
    assert "422 steps a row" in line
    # at --max-batch 1 the same variant fits the same limit
    assert memory_warning({"int8-dynamic": record}, 1024 * MIB, 1) is None
    # two routed variants in one process: the runtime's own start counted once
    fp32 = {"peak_rss_mb_by_batch": {"1": 1345.0, "8": 2210.0}, "python_baseline_mb": 60.0, "steps": 422}
    both = memory_warning({"int8-dynamic": record, "fp32": fp32}, 3000 * MIB, 8)
    assert both is not None and "fp32 2210 MiB, int8-dynamic 1097 MiB" in both
    assert f"together ~{2210 + 1097 - 60:.0f} MiB" in both
    assert memory_warning({"int8-dynamic": None, "fp32": {"peak_rss_mb_by_batch": "?"}}, MIB, 8) is None
    estimated = memory_warning({"int8-dynamic": record}, 512 * MIB, 4)
    assert estimated is not None and "estimated from its batch-1 and batch-8 figures" in estimated
    assert MemoryGuard.SOFT < 1


def test_serve_warns_at_start_when_the_limit_cannot_hold_the_routed_variants(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from chattts_forge.runtime.serve import state as state_mod
    from chattts_forge.runtime.serve.config import ServeConfig

    class Version:  # what open_version needs of a loaded version
        model_id, pipes, file_cache = "m/v1", {"int8-dynamic": None}, None

        def warm(self, phrases: list[str]) -> int:
            return 0

        def memory_figures(self) -> dict[str, Any]:
            return {"int8-dynamic": {"peak_rss_mb_by_batch": {"1": 435.0, "8": 1097.0}, "python_baseline_mb": 60.0,
                                     "steps": 422}}

    monkeypatch.setattr(state_mod, "ServedVersion", lambda *args, **kwargs: Version())
    state = state_mod.ServerState(ServeConfig(artifact="unused", memory_limit=1024 * MIB, max_batch=8))
    try:
        with caplog.at_level(logging.WARNING, logger="chattts_forge.runtime.serve.state"):
            state.open_version("unused")
        # (the guard's own sampling may warn too: this test process is large)
        warned = [r.getMessage() for r in caplog.records
                  if r.levelno == logging.WARNING and r.name == "chattts_forge.runtime.serve.state"]
        assert len(warned) == 1 and "int8-dynamic 1097 MiB" in warned[0] and "--max-batch 8" in warned[0]
    finally:
        state.shutdown()
