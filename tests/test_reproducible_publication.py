"""Issue 34 item 4: a publication names no path of the machine that built it, and two builds of the
same inputs in different folders publish the same bytes, except where a build measures or signs.

The real driver (`make artifacts PRESET=tiny`'s, with three variants: the FP32 reference, a calibrated
one and auto, whose records carried the corpus files, the calibration set, the gate and the reference
run) builds twice, into folders of different names and depths. Every published byte is searched for
either build folder, either publication folder, the checkout and the Python environment; every file
is compared byte for byte, and the files that hold what a build measures (timings, the machine, dates)
or signs are listed with why, and compared on what they record besides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import chattts_forge

VARIANTS = "fp32,int8-static,auto"
CHECKOUT = Path(chattts_forge.__file__).resolve().parent.parent

# Files whose bytes differ between two builds of the same inputs, by name, and why.
DIFFERS = {
    "model.sig": "ECDSA signatures are randomized: a fresh nonce for every signature (each verifies with the key)",
    "report.json": "the evaluation's measurements: latency/RTF, per-bucket and phrase-cache timings, peak RSS (its "
                   "memory section), the machine's load, created_at, evaluate_seconds",
    "README.md": "the model card quotes the report's measured figures and its date",
    "manifest.json": "the gate's results, the report's sha256 and evaluated_at (a variant's); the routing (a version's)",
    "SHA256SUMS": "lists manifest.json's sha256",
    "report.html": "the version page shows the measured figures",
    "routing.json": "each length bucket goes to the fastest passing variant, by measured RTF",
    "phrase_cache.bin": "its phrases are warmed through routing.json, so on the variant the timings chose",
    "index.json": "lists each variant's gate verdict and headline figures and each version's routing",
    "history.html": "the model's history page shows each variant's measured headline figures and evaluation date",
}
AUTO_ARTIFACT = "auto/artifact.json"  # the search records each candidate's measured step time (and seconds)
# What a report records besides its measurements: these sections are equal between the two builds.
REPORT_RECORDS = ("schema", "reference", "corpus", "settings", "fidelity", "notes", "toolchain", "versions")


def build(root: Path) -> Path:
    """Build and publish tiny with the real stages into `root`; the publication folder."""
    out = root / "published"
    cmd = [sys.executable, "-m", "chattts_forge.driver", "--preset", "tiny", "--seed", "0", "--build",
           str(root / "build"), "--to", str(out), "--variants", VARIANTS, "-q"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[Path, Path], tuple[Path, Path]]:
    one = tmp_path_factory.mktemp("first")
    two = tmp_path_factory.mktemp("second-build") / "some" / "deeper" / "folder"
    two.mkdir(parents=True)
    return (one, build(one)), (two, build(two))


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_publication_names_no_path_of_the_build_machine(two_builds) -> None:
    environments = {sys.prefix, sys.base_prefix, *(p for p in sys.path if p.endswith("site-packages"))}
    for root, published in two_builds:
        forbidden = {str(root), str(root.resolve()), str(published), str(CHECKOUT), *environments}
        named = {f"{rel}: {needle}" for rel, data in files_of(published).items()
                 for needle in forbidden if needle.encode() in data}
        named |= {f"{rel}: site-packages" for rel, data in files_of(published).items() if b"site-packages" in data}
        assert not named, sorted(named)[:20]


@pytest.mark.slow
def test_two_builds_in_other_folders_publish_the_same_bytes_but_measurements_and_signatures(two_builds) -> None:
    (_, first), (_, second) = two_builds
    a, b = files_of(first), files_of(second)
    assert sorted(a) == sorted(b)
    differ = sorted(rel for rel in a if a[rel] != b[rel])
    unexplained = [rel for rel in differ if Path(rel).name not in DIFFERS and not rel.endswith(AUTO_ARTIFACT)]
    assert not unexplained, unexplained  # payloads, artifact.json records, calibration, keys: identical
    payloads = [rel for rel in a if rel.endswith((".onnx", ".data", ".npy", ".json")) and Path(rel).name not in DIFFERS]
    assert len(payloads) > 30 and all(a[rel] == b[rel] for rel in payloads if not rel.endswith(AUTO_ARTIFACT))
    # what the differing records hold besides their measurements is the same
    for rel in a:
        if rel.endswith("/report.json"):
            ra, rb = json.loads(a[rel]), json.loads(b[rel])
            assert {k: ra[k] for k in REPORT_RECORDS} == {k: rb[k] for k in REPORT_RECORDS}, rel
            if not rel.endswith("auto/report.json"):
                assert ra["artifact"] == rb["artifact"], rel
        if rel.endswith(AUTO_ARTIFACT):
            qa, qb = (json.loads(x[rel]) for x in (a, b))
            assert _without_search_timings(qa) == _without_search_timings(qb)


def _without_search_timings(meta: dict[str, Any]) -> dict[str, Any]:
    """auto's record without what the search timed (on tiny it ranks by bytes, so its choice is the same)."""
    auto = {k: v for k, v in meta["quantization"]["auto"].items() if k not in ("seconds", "final_timing")}
    auto["candidates"] = [{k: v for k, v in c.items() if k not in ("step_ms", "step_vs_int8", "pareto")}
                          for c in auto["candidates"]]
    return {**meta, "quantization": {**meta["quantization"], "auto": auto}}
