"""publish / verify / index on fake artifact folders with sealed stand-in reports (fast, no torch).

A real report written by `evaluate`, handed to `publish`, is tested in test_report.py.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from stand_in_report import write_stand_in_report

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.publish import publish_artifact, verify_path
from chattts_forge.publish.index import INDEX_NAME, LOCK_NAME, STAGING_NAME
from chattts_forge.publish.manifest import MANIFEST_SCHEMA

MODEL = "chattts-synthetic-tiny-seed0"


def make_artifact(folder: Path, variant: str = "int8-dynamic", salt: str = "") -> Path:
    """A small artifact folder in the contract's layout (contents are stand-in bytes)."""
    folder.mkdir(parents=True)
    payload = {
        "gpt.onnx": hashlib.sha256(f"gpt{variant}{salt}".encode()).digest() * 40,
        "vocos.onnx": b"vocos-fp32" * 50,
        "tokenizer.json": b'{"model": "wordpiece"}',
        "speaker_stats.npy": bytes(range(64)),
    }
    for name, data in payload.items():
        (folder / name).write_bytes(data)
    precision = {"fp32": "fp32", "fp16": "fp16", "int4": "int4"}.get(variant, "int8")
    meta = {
        "schema": "chattts-forge/artifact/1",
        "name": "chattts",
        "variant": variant,
        "components": {
            "gpt": {"file": "gpt.onnx", "precision": precision, "opset": 17},
            "vocos": {"file": "vocos.onnx", "precision": "fp32", "opset": 17},
        },
        "source": {"kind": "synthetic", "preset": "tiny", "seed": 0, "hashes": {"gpt/model.safetensors": "ab" * 32}},
        "quantization": {
            "method": "static",
            "calibration": {"corpus": "/x/zh_calibration.txt", "sha256": "cd" * 32, "samples": 12},
        }
        if variant != "fp32"
        else None,
        "versions": {"torch": "2.9.1", "chattts": "0.2.5", "onnx": "1.23.2", "onnxruntime": "1.32.0"},
        "toolchain": {"name": "chattts-forge", "version": "0.1.0", "git_commit": "deadbeef"},
        "created_at": "2026-11-30T01:00:00Z",
    }
    (folder / "artifact.json").write_text(json.dumps(meta, indent=2))
    return folder


def make_report(report_dir: Path, artifact: Path, passed: bool = True) -> Path:
    """A sealed stand-in report judging `artifact` (tests/stand_in_report.py; real ones: test_report.py)."""
    return write_stand_in_report(report_dir, artifact, passed=passed)


@pytest.fixture
def art(tmp_path: Path) -> tuple[Path, Path]:
    a = make_artifact(tmp_path / "build" / "int8-dynamic")
    return a, make_report(tmp_path / "reports" / "int8-dynamic", a)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file's bytes but the signatures': an ECDSA signature is randomized, so two signings of the
    same files differ (both verify: `signatures_verify`); everything else is the same."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "model.sig"}


def signatures_verify(root: Path) -> bool:
    result = verify_path(root, public_key=root / "signing-key.pub")
    return result.ok and len(result.signatures) == len(result.variants) + len(result.versions)


def test_publish_happy_path(art: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, report = art
    root = tmp_path / "artifacts"
    result = publish_artifact(artifact, report, root)
    assert result.status == "published"
    assert result.path == root / MODEL / "v1" / "int8-dynamic"
    for rel in ("gpt.onnx", "vocos.onnx", "artifact.json", "tokenizer.json"):
        assert (result.path / rel).read_bytes() == (artifact / rel).read_bytes()
    assert (result.path / "report.json").read_bytes() == (report / "report.json").read_bytes()
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["schema"] == MANIFEST_SCHEMA
    assert manifest["created_at"] == "2026-11-30T02:00:00Z"  # the evaluation's time, not the clock
    assert manifest["precision"] == {"gpt": "int8", "vocos": "fp32"}
    assert manifest["source_checkpoint"]["kind"] == "synthetic"
    assert manifest["calibration_corpus"] == {
        "name": "zh_calibration.txt",
        "sha256": "cd" * 32,
        "samples": 12,
        "sentences": None,
    }
    assert manifest["gate"]["passed"] is True and manifest["gate"]["machine"]["logical_cores"] == 2
    assert manifest["licenses"]["chattts_weights"]["spdx"] == "CC-BY-NC-4.0"
    assert manifest["licenses"]["chattts_code"]["spdx"] == "AGPL-3.0-or-later"
    for name in ("torch", "chattts", "onnx", "onnxruntime", "onnxconverter-common"):
        assert name in manifest["versions"]
    listed = {f["path"]: f for f in manifest["files"]}
    # model.sig signs every other file, so it is in neither list.
    assert set(listed) == {p.name for p in result.path.iterdir()} - {"manifest.json", "SHA256SUMS", "model.sig"}
    assert listed["gpt.onnx"]["bytes"] == (artifact / "gpt.onnx").stat().st_size
    card = (result.path / "README.md").read_text()
    assert "| code_agreement | ≥ 0.75 | 0.75 | pass |" in card and "Synthetic weights" in card
    assert "| code_kl | ≤ 0.25 | 0.25 nats | pass |" in card
    # SHA256SUMS is what coreutils expects.
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=result.path, check=True)
    index = json.loads((root / INDEX_NAME).read_text())
    assert [(e["path"], e["gate_passed"]) for e in index["variants"]] == [(f"{MODEL}/v1/int8-dynamic", True)]
    figures = index["variants"][0]["figures"]
    assert figures["variant"] == "int8-dynamic" and figures["passed"] is True and figures["code_agreement"] == 0.75
    assert verify_path(root).ok and verify_path(result.path).ok
    assert not (root / STAGING_NAME).exists()


def _edit_report(report: Path, change) -> None:
    data = json.loads((report / "report.json").read_text())
    change(data)
    (report / "report.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "case",
    ["other-artifact", "failed", "edited", "unsealed", "artifact-changed", "artifact-extra-file", "no-report"],
)
def test_refusals_leave_nothing(case: str, art: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, report = art
    root = tmp_path / "artifacts"
    if case == "other-artifact":
        other = make_artifact(tmp_path / "other", salt="x")
        report = make_report(tmp_path / "other-report", other)
        match = "not made for artifact"
    elif case == "failed":
        shutil.rmtree(report)
        report = make_report(report, artifact, passed=False)
        match = "gate failed \\(code_agreement\\)"
    elif case == "edited":
        _edit_report(report, lambda d: d["gate"]["checks"][-1].update(value=0.99))
        match = "edited after evaluation"
    elif case == "unsealed":
        _edit_report(report, lambda d: d.pop("integrity"))
        match = "no integrity"
    elif case == "artifact-changed":
        data = bytearray((artifact / "gpt.onnx").read_bytes())
        data[5] ^= 1
        (artifact / "gpt.onnx").write_bytes(bytes(data))
        match = "gpt.onnx differs"
    elif case == "artifact-extra-file":
        (artifact / "extra.bin").write_bytes(b"x")
        match = "extra.bin is not named by the report"
    else:
        (report / "report.json").unlink()
        match = "no evaluation report"
    with pytest.raises(ForgeError, match=match):
        publish_artifact(artifact, report, root)
    assert not root.exists() or list(root.rglob("*")) == []


def test_edited_report_refused_by_cli(art: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, report = art
    _edit_report(report, lambda d: d["gate"].update(passed=True, thresholds={"min_code_agreement": 0.1}))
    root = tmp_path / "artifacts"
    res = CliRunner().invoke(main, ["publish", "--artifact", str(artifact), "--report", str(report), "--to", str(root)])
    assert res.exit_code == 2 and "edited after evaluation" in res.output
    assert not root.exists()


def test_cli_publish_and_verify(art: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, report = art
    root = tmp_path / "artifacts"
    runner = CliRunner()
    res = runner.invoke(main, ["publish", "--artifact", str(artifact), "--report", str(report), "--to", str(root)])
    assert res.exit_code == 0, res.output
    assert f"published: {root / MODEL / 'v1' / 'int8-dynamic'}" in res.output
    res = runner.invoke(main, ["verify", str(root)])
    assert res.exit_code == 0, res.output
    assert "verified 1 published variant(s)" in res.output
    (root / MODEL / "v1" / "int8-dynamic" / "vocos.onnx").write_bytes(b"tampered")
    res = runner.invoke(main, ["verify", str(root)])
    assert res.exit_code == 2 and "vocos.onnx: changed" in res.output


def _published(tmp_path: Path, art: tuple[Path, Path]) -> tuple[Path, Path]:
    root = tmp_path / "artifacts"
    return root, publish_artifact(*art, root).path


def test_verify_flags_every_flipped_byte(art: tuple[Path, Path], tmp_path: Path) -> None:
    root, vdir = _published(tmp_path, art)
    trusted = tmp_path / "trusted.pub"  # the public key as its user keeps it, outside the tree
    trusted.write_bytes((root / "signing-key.pub").read_bytes())
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME)
    assert len(files) >= 11 and vdir / "model.sig" in files and root / "signing-key.pub" in files
    for path in files:
        original = path.read_bytes()
        for offset in (0, len(original) // 2, len(original) - 1):
            flipped = bytearray(original)
            flipped[offset] ^= 0x01
            path.write_bytes(bytes(flipped))
            problems = verify_path(root, public_key=trusted).problems
            assert any(str(path) in p for p in problems), (path, offset, problems)
            if path.parent == vdir:
                assert any(str(path) in p for p in verify_path(vdir, public_key=trusted).problems)
                if path.name != "model.sig":  # the manifests alone (no key) name the file too
                    assert any(str(path) in p for p in verify_path(vdir).problems)
            path.write_bytes(original)
    assert verify_path(root).ok and verify_path(root, public_key=trusted).ok


def test_verify_missing_and_extra(art: tuple[Path, Path], tmp_path: Path) -> None:
    root, vdir = _published(tmp_path, art)
    (vdir / "tokenizer.json").unlink()
    (vdir / "notes.txt").write_text("hi")
    (root / MODEL / "stray.bin").write_bytes(b"x")
    problems = verify_path(root).problems
    assert any(p.endswith("tokenizer.json: missing") for p in problems)
    assert any("notes.txt: extra file" in p for p in problems)
    assert any("stray.bin: extra file" in p for p in problems)
    (vdir / "manifest.json").unlink()
    assert any("manifest.json: missing" in p for p in verify_path(root).problems)


def test_republish_is_a_noop_and_new_content_gets_a_new_version(art: tuple[Path, Path], tmp_path: Path) -> None:
    root, vdir = _published(tmp_path, art)
    before = tree_bytes(root)
    again = publish_artifact(*art, root)
    assert again.status == "already-published" and again.path == vdir
    assert tree_bytes(root) == before
    # Same variant, different bytes: a new version; the published one is untouched.
    changed = make_artifact(tmp_path / "changed" / "int8-dynamic", salt="2")
    result = publish_artifact(changed, make_report(tmp_path / "changed-report", changed), root)
    assert result.path == root / MODEL / "v2" / "int8-dynamic"
    # (the index and the model's history page list every version: they gain v2)
    assert all(tree_bytes(root)[k] == v for k, v in before.items() if k not in (INDEX_NAME, f"{MODEL}/history.html"))
    # An explicit version that is taken is refused, naming it.
    other = make_artifact(tmp_path / "third" / "int8-dynamic", salt="3")
    with pytest.raises(ForgeError, match="v1/int8-dynamic is already published with different content"):
        publish_artifact(other, make_report(tmp_path / "third-report", other), root, version="v1")
    assert verify_path(root).ok
    assert [e["version"] for e in json.loads((root / INDEX_NAME).read_text())["variants"]] == ["v1", "v2"]


def test_variants_of_one_checkpoint_share_a_version(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    for variant in ("fp32", "fp16", "int4"):
        a = make_artifact(tmp_path / variant, variant=variant)
        assert publish_artifact(a, make_report(tmp_path / f"r-{variant}", a), root).version == "v1"
    assert sorted(p.name for p in (root / MODEL / "v1").iterdir()) == ["fp16", "fp32", "int4"]


def test_crash_inside_staging_leaves_nothing(art: tuple[Path, Path], tmp_path: Path, monkeypatch) -> None:
    import chattts_forge.publish.publish as pub

    def boom(manifest):
        raise RuntimeError("simulated crash while assembling")

    monkeypatch.setattr(pub, "render_model_card", boom)
    root = tmp_path / "artifacts"
    with pytest.raises(RuntimeError, match="simulated crash"):
        publish_artifact(*art, root)
    left = [p.relative_to(root).as_posix() for p in root.rglob("*")]
    assert set(left) <= {LOCK_NAME, INDEX_NAME}, left
    monkeypatch.undo()
    assert publish_artifact(*art, root).status == "published"
    assert verify_path(root).ok


def test_stale_partial_of_a_killed_run_is_cleaned(art: tuple[Path, Path], tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    stale = root / STAGING_NAME / f"{MODEL}-v1-int8-dynamic.abc.partial"
    stale.mkdir(parents=True)
    (stale / "gpt.onnx").write_bytes(b"half")
    (root / MODEL / "v1").mkdir(parents=True)  # created just before a killed rename
    assert verify_path(publish_artifact(*art, root).path).ok
    assert not (root / STAGING_NAME).exists()
    assert verify_path(root).ok and not verify_path(root).warnings


_KILL_SCRIPT = """
import os, signal, sys
import chattts_forge.publish.publish as pub
real = pub.copy_verified
count = 0
def killing_copy(src, dst, expected):
    global count
    real(src, dst, expected)
    count += 1
    if count == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
pub.copy_verified = killing_copy
pub.publish_artifact(sys.argv[1], sys.argv[2], sys.argv[3])
"""


def test_sigkill_mid_publish_then_rerun_gives_same_bytes(art: tuple[Path, Path], tmp_path: Path) -> None:
    clean_root = tmp_path / "clean"
    publish_artifact(*art, clean_root)
    root = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(art[0]), str(art[1]), str(root), "2"])
    assert proc.returncode == -9
    assert list((root / STAGING_NAME).iterdir())  # the kill left a half-built staging folder
    assert not (root / MODEL).exists()
    publish_artifact(*art, root)
    assert tree_bytes(root) == tree_bytes(clean_root)
    assert signatures_verify(root) and signatures_verify(clean_root)
    assert not (root / STAGING_NAME).exists()


def _publish_many(root: str, jobs: list[tuple[str, str]], barrier) -> None:
    barrier.wait()
    for artifact, report in jobs:
        publish_artifact(artifact, report, root)


def test_concurrent_publishers_keep_the_index_consistent(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    jobs: list[list[tuple[str, str]]] = [[], []]
    variants = ["fp32", "fp16", "int8-dynamic", "int8-static", "int4", "int4-b32"]
    for i, variant in enumerate(variants):
        a = make_artifact(tmp_path / "src" / variant, variant=variant)
        jobs[i % 2].append((str(a), str(make_report(tmp_path / "rep" / variant, a))))
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_publish_many, args=(str(root), j, barrier)) for j in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    index = json.loads((root / INDEX_NAME).read_text())
    assert sorted(e["variant"] for e in index["variants"]) == sorted(variants)
    assert {e["version"] for e in index["variants"]} == {"v1"}
    result = verify_path(root)
    assert result.ok, result.problems
    assert len(result.variants) == len(variants)
    assert not os.path.exists(root / STAGING_NAME)


def test_publish_a_real_converted_artifact(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    """The manifest reads what convert really writes (components, source, versions, opsets)."""
    fp16 = tiny_artifacts["fp16"]
    root = tmp_path / "artifacts"
    result = publish_artifact(fp16, make_report(tmp_path / "report", fp16), root)
    assert result.path == root / MODEL / "v1" / "fp16"
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["precision"]["vocos"] == "fp32" and manifest["precision"]["gpt"] == "fp16"
    assert set(manifest["precision"]) >= {"embed", "gpt", "head_code", "decoder", "dvae", "vocos"}
    assert all(isinstance(v, int) for v in manifest["opset"].values())
    assert manifest["source_checkpoint"]["kind"] == "synthetic"
    assert "gpt/model.safetensors" in manifest["source_checkpoint"]["hashes"]
    assert manifest["versions"]["torch"] and manifest["versions"]["onnxruntime"]
    assert manifest["fp16"] is not None
    gpt = result.path / "gpt.onnx"
    data = bytearray(gpt.read_bytes())
    data[len(data) // 3] ^= 0xFF
    gpt.write_bytes(bytes(data))
    assert any(p.startswith(f"{gpt}: changed") for p in verify_path(root).problems)
