"""The build driver with the real stages on `tiny`: a step re-runs when code in its import closure changes.

The driver keys steps on closures read from a COPY of the source tree (`--code-root`), and the
tests edit only that copy; the stages that run are the installed ones. Three variants (fp32,
int8-dynamic and int8-dynamic-kv8, which needs the calibration step for its KV cache's scales) keep the
chain short while covering convert -> calibrate -> quantize -> evaluate -> publish.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_forge.codegraph import Layout
from chattts_forge.publish import verify_path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("fp32", "int8-dynamic", "int8-dynamic-kv8")
# Lighter than the tiny preset's settings (these come after them, so they win): the test is about
# which steps run, not about what they measure.
LIGHTER = (
    "--stage-args", "calibrate=--max-samples 3 --max-new-token 16",
    "--stage-args", "quantize=--fidelity-sentences 1 --fidelity-steps 16",
    "--stage-args", "evaluate=--max-sentences 1 --max-new-token 24 --fidelity-sentences 1 --fidelity-steps 16 --batch 1"
    " --bucket-sentences 1 --cache-phrases 1",
    "--stage-args", "warm=--max-new-token 8",
)  # fmt: skip
WARM = "warm-chattts-synthetic-tiny-seed0-v1"  # the version's phrase cache (runtime code, like convert)


def copy_source_tree(dest: Path) -> Path:
    """pyproject.toml and every package folder it maps, as they are now (caches left out)."""
    dest.mkdir()
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    for folder in Layout.from_pyproject(REPO).package_dirs.values():  # a subpackage's folder may be copied already
        shutil.copytree(folder, dest / folder.relative_to(REPO), ignore=shutil.ignore_patterns("__pycache__"),
                        dirs_exist_ok=True)
    return dest


class DriverRun:
    def __init__(self, base: Path) -> None:
        self.source = copy_source_tree(base / "source")
        self.build = base / "build"
        self.to = base / "artifacts"

    def run(self) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable, "-m", "chattts_forge.driver", "--preset", "tiny",
            "--build", str(self.build), "--to", str(self.to), "--variants", ",".join(VARIANTS),
            "--code-root", str(self.source), *LIGHTER,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    def append_comment(self, rel: str) -> None:
        path = self.source / rel
        assert path.is_file(), path
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n# a comment added by a test: the code key changes, behaviour does not\n")


def steps_ran(proc: subprocess.CompletedProcess[str]) -> list[str]:
    line = re.search(r"^pipeline finished in .* s; ran: (.*)$", proc.stdout, re.M)
    assert line, proc.stdout
    return [] if line.group(1).startswith("nothing") else line.group(1).split(", ")


def published_status(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+pass\s+\S+ \((published|already-published)\)", proc.stdout, re.M))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> DriverRun:
    """One full tiny run, keyed on an unchanged copy of the source tree."""
    driver = DriverRun(tmp_path_factory.mktemp("driver"))
    proc = driver.run()
    assert steps_ran(proc) == [
        "checkpoint", "checkpoint-verify", "convert", "calibrate", "evaluate-reference", "quantize-int8-dynamic",
        "quantize-int8-dynamic-kv8", "evaluate-latency", "evaluate-fp32", "evaluate-int8-dynamic",
        "evaluate-int8-dynamic-kv8", WARM,
    ]  # fmt: skip
    assert published_status(proc) == {v: "published" for v in VARIANTS}
    return driver


def test_a_runtime_change_reruns_convert_and_everything_downstream(built: DriverRun) -> None:
    built.append_comment("runtime/fast_gpt.py")
    proc = built.run()
    assert steps_ran(proc) == ["convert", "calibrate", "evaluate-reference", "quantize-int8-dynamic",
                               "quantize-int8-dynamic-kv8", "evaluate-latency", "evaluate-fp32",
                               "evaluate-int8-dynamic", "evaluate-int8-dynamic-kv8", WARM]
    assert re.search(r"convert\s+running \(its code changed\)", proc.stderr), proc.stderr[-3000:]
    # The stages themselves did not change, so the re-built artifacts are the bytes already published.
    assert published_status(proc) == {v: "already-published" for v in VARIANTS}
    assert verify_path(built.to).ok


def test_a_comment_in_publish_code_redoes_only_publish(built: DriverRun) -> None:
    built.append_comment("publish/publish.py")
    proc = built.run()
    assert steps_ran(proc) == []
    assert published_status(proc) == {v: "already-published" for v in VARIANTS}
    assert verify_path(built.to).ok


def test_the_build_publishes_an_int8_kv_cache_variant(built: DriverRun) -> None:
    """The default build's int8-dynamic-kv8: dynamic INT8 weights, the fused GPT's cache in int8 with
    scales calibrated from the build's calibration folder, gated and published like the others."""
    version = built.to / "chattts-synthetic-tiny-seed0" / "v1"
    meta = json.loads((version / "int8-dynamic-kv8" / "artifact.json").read_text(encoding="utf-8"))
    assert meta["variant"] == "int8-dynamic-kv8" and meta["quantization"]["method"] == "dynamic"
    kv = meta["quantization"]["kv_cache"]
    assert kv["dtype"] == "int8" and kv["calibration_samples"] > 0
    assert meta["components"]["gpt_fast"]["kv_cache"] == kv
    assert kv["calibration"]["corpus"] == "v1:calibration"
    # Its gate judged the graph the runtime runs (the int8-cache fused graph) as well as gpt.onnx.
    assert meta["fidelity"]["gpt_fast"]["teacher_forced"]["steps"] > 0
    plain = json.loads((version / "int8-dynamic" / "artifact.json").read_text(encoding="utf-8"))
    assert "kv_cache" not in plain["quantization"] and "kv_cache" not in plain["components"]["gpt_fast"]
    # The version's routing table knows it (whether a bucket routes to it depends on measured speed).
    routing = json.loads((version / "routing.json").read_text(encoding="utf-8"))
    assert "int8-dynamic-kv8" in routing["variants"]
