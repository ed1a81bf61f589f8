"""The runtime checks what it loads: every file against its recorded sha256 before the first session,
through the verified-hash cache; the published manifest and SHA256SUMS; the signature with a key."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_publish import make_report

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.integrity import CACHE_FILE, VerifiedHashCache, check_files, expected_files, user_cache_dir
from chattts_forge.runtime.loaded_artifact import LoadedArtifact


@pytest.fixture(scope="module")
def published(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny fp32 artifact, published (manifest.json, SHA256SUMS, model.sig) with a stand-in report."""
    from chattts_forge.publish import publish_artifact

    base = tmp_path_factory.mktemp("published")
    fp32 = tiny_artifacts["fp32"]
    return publish_artifact(fp32, make_report(base / "report", fp32), base / "artifacts").path


def copy_of(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / folder.name
    shutil.copytree(folder, out)
    return out


def flip(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_convert_records_every_support_file(tiny_artifacts: dict[str, Path]) -> None:
    from chattts_forge.integrity import sha256_file

    for folder in tiny_artifacts.values():
        meta = ArtifactMeta.load(folder)
        for key in ("tokenizer", "speaker_stats", "homophones", "dvae_coef"):
            record = meta.support_record(key)
            assert record is not None and set(record) == {"file", "bytes", "sha256"}, key
            assert record["sha256"] == sha256_file(folder / record["file"])
            assert meta.support_file(key) == record["file"]


def test_every_file_of_an_artifact_is_recorded_and_checked(tiny_artifacts: dict[str, Path]) -> None:
    folder = tiny_artifacts["fp32"]
    expected = expected_files(folder, ArtifactMeta.load(folder))
    on_disk = {p.name for p in folder.iterdir()} - {"artifact.json"}
    assert set(expected) == on_disk  # every graph, its weights and every support file
    assert all(e.sha256 for e in expected.values())


@pytest.mark.parametrize("kind", ["graph", "external data", "tokenizer", "speaker statistics", "homophones",
                                  "dvae coefficients", "unused graph"])
def test_a_flipped_byte_in_any_file_kind_is_refused(tiny_artifacts: dict[str, Path], tmp_path: Path, kind: str) -> None:
    folder = copy_of(tiny_artifacts["fp32"], tmp_path)
    name = {"graph": "gpt_fast.onnx", "external data": "vocos.onnx.data", "tokenizer": "tokenizer.json",
            "speaker statistics": "speaker_stats.npy", "homophones": "homophones_map.json",
            "dvae coefficients": "dvae_coef.json", "unused graph": "dvae_encoder.onnx"}[kind]
    flip(folder / name)
    with pytest.raises(ForgeError, match=rf"{folder / name} does not match its sha256 in artifact.json"):
        LoadedArtifact(folder)
    LoadedArtifact(folder, verify="size")  # the explicit opt-out loads it (same size)


def test_synth_refuses_a_changed_tokenizer_in_one_line_without_audio(tiny_artifacts: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    folder = copy_of(tiny_artifacts["fp32"], tmp_path)
    tok = folder / "tokenizer.json"
    doc = json.loads(tok.read_text(encoding="utf-8"))
    doc["added_tokens"] = doc.get("added_tokens", [])[:-1]  # a real edit, not a flipped byte
    tok.write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / "a.wav"
    r = CliRunner().invoke(main, ["synth", "--artifact", str(folder), "--text", "你好", "--out", str(out), "--no-refine"])
    assert r.exit_code == 2
    lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(tok) in lines[0], r.output
    assert not out.exists() and not list(tmp_path.glob("*.wav"))


def test_published_folder_every_file_checked(published: Path, tmp_path: Path) -> None:
    """In a published folder the manifest covers artifact.json, report.json and the card; manifest.json
    and SHA256SUMS check each other."""
    for name in ("artifact.json", "report.json", "README.md", "manifest.json", "SHA256SUMS", "embed.onnx.data"):
        folder = copy_of(published, tmp_path / name)
        # A byte in the middle of the JSON files is a value (created_at, a figure), so it still parses.
        flip(folder / name)
        with pytest.raises(ForgeError, match=str(folder / ("SHA256SUMS" if name == "SHA256SUMS" else name))):
            LoadedArtifact(folder)
    LoadedArtifact(published)


def test_signature_checked_with_a_public_key(published: Path, tmp_path: Path) -> None:
    pub = published.parent.parent.parent / "signing-key.pub"
    art = LoadedArtifact(published, public_key=pub)
    assert art.verification.hashed == [] or art.verification.cached  # hashed once, then from the cache
    folder = copy_of(published, tmp_path)
    (folder / "notes.txt").write_text("added after signing")
    LoadedArtifact(folder)  # the records say nothing of an extra file; the signature does
    with pytest.raises(ForgeError, match=r"notes.txt: not part of what was signed"):
        LoadedArtifact(folder, public_key=pub)
    (folder / "notes.txt").unlink()
    (folder / "model.sig").unlink()
    with pytest.raises(ForgeError, match=r"model.sig: missing"):
        LoadedArtifact(folder, public_key=pub)
    with pytest.raises(ForgeError, match="cannot be combined with verify='size'"):
        LoadedArtifact(published, public_key=pub, verify="size")
    from chattts_forge.runtime.pipeline import Pipeline

    assert Pipeline(published, public_key=pub).artifact.public_key == pub
    r = CliRunner().invoke(main, ["synth", "--artifact", str(folder), "--text", "你好", "--out",
                                  str(tmp_path / "x.wav"), "--public-key", str(pub)])
    assert r.exit_code == 2 and "model.sig: missing" in r.output and not (tmp_path / "x.wav").exists()


def test_compat_load_checks_the_signature(published: Path, tmp_path: Path) -> None:
    from chattts_forge.compat import Chat

    pub = published.parent.parent.parent / "signing-key.pub"
    assert Chat().load(source="custom", custom_path=str(published), public_key=str(pub))
    folder = copy_of(published, tmp_path)
    (folder / "model.sig").unlink()
    with pytest.raises(ForgeError, match="model.sig: missing"):
        Chat().load(source="custom", custom_path=str(folder), public_key=str(pub))


def test_second_load_is_vouched_for_by_the_cache(tiny_artifacts: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    import chattts_forge.integrity as integrity

    hashed: list[str] = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path, *a, **k: (hashed.append(path.name), real(path, *a, **k))[1])
    folder = copy_of(tiny_artifacts["fp32"], tmp_path)
    first = LoadedArtifact(folder).verification
    files = set(first.files)
    assert set(first.hashed) == files and not first.cached and set(hashed) == files
    hashed.clear()
    second = LoadedArtifact(folder).verification
    assert hashed == [] and second.hashed == [] and set(second.cached) == files
    # A rewritten file (same bytes, new inode) is hashed again; the others stay vouched for.
    tok = folder / "tokenizer.json"
    data = tok.read_bytes()
    tok.unlink()
    tok.write_bytes(data)
    third = LoadedArtifact(folder).verification
    assert hashed == ["tokenizer.json"] and third.hashed == ["tokenizer.json"]
    # verify="full" never trusts the cache.
    hashed.clear()
    assert set(LoadedArtifact(folder, verify="full").verification.hashed) == files and set(hashed) == files


def test_cache_keyed_by_identity_and_expected_hash(tmp_path: Path) -> None:
    """A file changed and given its old mtime back misses (ctime, size, the expected sha256 are in the key)."""
    cache = VerifiedHashCache(tmp_path / "c.json")
    f = tmp_path / "f.bin"
    f.write_bytes(b"a" * 100)
    st = os.stat(f)
    cache.add(st, "0" * 64)
    assert cache.hit(st, "0" * 64) and not cache.hit(st, "1" * 64)
    f.write_bytes(b"b" * 100)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not cache.hit(os.stat(f), "0" * 64)


def test_corrupt_cache_is_ignored_and_rewritten(tiny_artifacts: dict[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = user_cache_dir() / CACHE_FILE
    path.parent.mkdir(parents=True)
    for junk in (b"\xff\xfe not json", b'{"schema": "other", "entries": {}}', b'{"schema": 1', b"[]"):
        path.write_bytes(junk)
        folder = tiny_artifacts["fp32"]
        assert LoadedArtifact(folder).verification.hashed  # nothing trusted from a broken cache
        doc = json.loads(path.read_text())
        assert doc["schema"] == "chattts-forge/verified-sha256/1" and len(doc["entries"]) >= len(
            LoadedArtifact(folder).verification.cached)


def test_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import chattts_forge.integrity as integrity

    monkeypatch.setattr(integrity, "CACHE_MAX_ENTRIES", 5)
    files = []
    for i in range(8):
        f = tmp_path / f"f{i}"
        f.write_bytes(bytes([i]) * 10)
        files.append(f)
    from chattts_forge.integrity import RecordedFile, sha256_file

    cache = VerifiedHashCache(tmp_path / "cache.json")
    for f in files:
        check_files(tmp_path, {f.name: RecordedFile(f.name, 10, sha256_file(f), "test")}, "sha256", cache)
    entries = json.loads((tmp_path / "cache.json").read_text())["entries"]
    assert len(entries) == 5 and set(entries.values()) == {sha256_file(f) for f in files[-5:]}


def test_unrecorded_files_need_the_opt_out(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    """An artifact made before support files were recorded (bare names in `files`)."""
    folder = copy_of(tiny_artifacts["fp32"], tmp_path)
    doc = json.loads((folder / "artifact.json").read_text())
    doc["files"] = {k: v["file"] for k, v in doc["files"].items()}
    (folder / "artifact.json").write_text(json.dumps(doc, indent=2))
    with pytest.raises(ForgeError, match=r"(dvae_coef|homophones_map|speaker_stats|tokenizer)\.(json|npy): no sha256 is recorded.*verify=.size."):
        LoadedArtifact(folder)
    assert LoadedArtifact(folder, verify="size").meta.support_file("tokenizer") == "tokenizer.json"


def test_verify_modes(tiny_artifacts: dict[str, Path]) -> None:
    folder = tiny_artifacts["fp32"]
    assert LoadedArtifact(folder, verify="cheap").verify_mode == "sha256"  # the old default's name
    assert LoadedArtifact(folder, verify="none").verification.hashed == []
    with pytest.raises(ForgeError, match="unknown verify mode 'fast'"):
        LoadedArtifact(folder, verify="fast")


def test_quantize_keeps_one_record_shape(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    """quantize copies the support files and their records; its new graphs are recorded too: the
    quantized artifact loads under the default check, and a flipped byte in it is refused."""
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    fp32 = tiny_artifacts["fp32"]
    out = quantize_artifact(fp32, tmp_path / "dyn", QuantizeConfig("dynamic", fidelity_sentences=1, fidelity_steps=8,
                                                                   threads=1))
    src, meta = ArtifactMeta.load(fp32), ArtifactMeta.load(out)
    assert meta.files == src.files
    report = LoadedArtifact(out).verification
    assert set(report.files) == {p.name for p in out.iterdir()} - {"artifact.json"}
    flip(out / "gpt_fast.onnx.data")
    with pytest.raises(ForgeError, match="gpt_fast.onnx.data does not match its sha256"):
        LoadedArtifact(out)
