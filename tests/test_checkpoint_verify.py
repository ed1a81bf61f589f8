"""`checkpoint verify`: real vs synthetic vs broken (each fault its own error), HF-cache resolution."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from chattts_forge.checkpoint import verify as verify_mod
from chattts_forge.checkpoint.layout import ASSET_FILES, MARKER_NAME, TINY, resolve_asset_dir
from chattts_forge.checkpoint.release import release_sha256_map
from chattts_forge.checkpoint.safetensors_io import build_header
from chattts_forge.checkpoint.verify import CheckpointError, verify_checkpoint
from chattts_forge.cli import main
from chattts_forge.integrity import sha256_file


@pytest.fixture()
def ckpt(tiny_ckpt: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint that a test may break."""
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "asset"))


def _cli(*args: str):
    return CliRunner().invoke(main, ["checkpoint", *args])


def _assert_broken(path: Path, kind: str, file: str, pattern: str) -> None:
    """Library and CLI both name the file and the fault, in one line, with a non-zero exit."""
    with pytest.raises(CheckpointError) as exc:
        verify_checkpoint(path)
    assert exc.value.kind == kind and exc.value.file == file
    msg = str(exc.value)
    assert "\n" not in msg and file.split("/")[-1] in msg
    assert re.search(pattern, msg), msg
    result = _cli("verify", str(path))
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert result.output.startswith("error: ") and msg in result.output


def test_synthetic_is_recognised(tiny_ckpt: Path) -> None:
    report = verify_checkpoint(tiny_ckpt)
    assert report.kind == "synthetic" and report.preset == "tiny" and report.seed == 0
    assert report.asset_dir == tiny_ckpt
    assert [f.path for f in report.files] == list(ASSET_FILES)
    assert all(f.sha256 == f.expected_sha256 for f in report.files)
    assert {f.path: f.tensors for f in report.files}[
        "gpt/model.safetensors"
    ] == 2 + 9 * TINY.num_hidden_layers
    result = _cli("verify", str(tiny_ckpt))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("synthetic:") and "tiny" in result.output and "seed 0" in result.output
    data = json.loads(_cli("verify", str(tiny_ckpt), "--json").output)
    assert data["kind"] == "synthetic" and len(data["files"]) == 9


def test_missing_file(ckpt: Path) -> None:
    (ckpt / "Vocos.safetensors").unlink()
    _assert_broken(ckpt, "missing", "Vocos.safetensors", "missing file")


def test_missing_tokenizer_file(ckpt: Path) -> None:
    (ckpt / "tokenizer" / "tokenizer_config.json").unlink()
    _assert_broken(ckpt, "missing", "tokenizer/tokenizer_config.json", "missing file")


def test_truncated_file(ckpt: Path) -> None:
    p = ckpt / "Embed.safetensors"
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size - 1000)
    _assert_broken(ckpt, "truncated", "Embed.safetensors", "truncated safetensors")


def test_truncated_inside_header(ckpt: Path) -> None:
    p = ckpt / "DVAE.safetensors"
    with open(p, "r+b") as f:
        f.truncate(100)
    _assert_broken(ckpt, "truncated", "DVAE.safetensors", "truncated safetensors")


def test_not_a_safetensors_file(ckpt: Path) -> None:
    (ckpt / "Decoder.safetensors").write_bytes(b"<html>404 Not Found</html>\n" * 10)
    _assert_broken(ckpt, "not_safetensors", "Decoder.safetensors", "not a safetensors file")


def test_wrong_shape(ckpt: Path) -> None:
    """A well-formed safetensors file whose tensor shapes do not fit the dims."""
    p = ckpt / "Decoder.safetensors"
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(p))
    tensors["out_conv.weight"] = tensors["out_conv.weight"][:, :-1, :].copy()
    save_file(tensors, str(p), metadata={"format": "pt"})
    _assert_broken(ckpt, "wrong_shape", "Decoder.safetensors", r"wrong shape for 'out_conv.weight'")


def test_unexpected_tensor(ckpt: Path) -> None:
    p = ckpt / "Vocos.safetensors"
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(p))
    tensors["backbone.extra.weight"] = tensors["backbone.norm.weight"]
    save_file(tensors, str(p), metadata={"format": "pt"})
    _assert_broken(ckpt, "wrong_shape", "Vocos.safetensors", "unexpected tensor 'backbone.extra.weight'")


def test_hash_mismatch_synthetic(ckpt: Path) -> None:
    """Same size and structure, one flipped byte in the tensor data: only the hash can tell."""
    p = ckpt / "gpt" / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[-5] ^= 0xFF
    p.write_bytes(bytes(data))
    _assert_broken(
        ckpt, "hash_mismatch", "gpt/model.safetensors", "sha256 mismatch against the synthetic marker"
    )


def test_hash_mismatch_tokenizer(ckpt: Path) -> None:
    p = ckpt / "tokenizer" / "tokenizer.json"
    p.write_text(p.read_text(encoding="utf-8").replace('"[UNK]"', '"[unk]"', 1), encoding="utf-8")
    _assert_broken(ckpt, "hash_mismatch", "tokenizer/tokenizer.json", "sha256 mismatch")


def test_marker_inconsistent_with_gpt_config(ckpt: Path) -> None:
    cfg_path = ckpt / "gpt" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_hidden_layers"] = 3
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    _assert_broken(ckpt, "inconsistent", "gpt/config.json", "'num_hidden_layers' is 3")


def test_marker_dims_inconsistent_with_tensors(ckpt: Path) -> None:
    """A marker claiming other dims (with matching config) is caught by the tensor shapes."""
    import dataclasses

    marker = json.loads((ckpt / MARKER_NAME).read_text())
    dims = dataclasses.replace(TINY, intermediate_size=96)
    marker["dims"] = dims.to_dict()
    marker["preset"] = "custom"
    (ckpt / MARKER_NAME).write_text(json.dumps(marker))
    (ckpt / "gpt" / "config.json").write_text(
        json.dumps(dims.gpt_config_json(), indent=2, sort_keys=True) + "\n"
    )
    _assert_broken(
        ckpt, "wrong_shape", "gpt/model.safetensors", "wrong shape for 'layers.0.mlp.gate_proj.weight'"
    )


def test_no_marker_and_not_released_is_a_hash_mismatch(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a marker the folder must be the release; tiny tensors fail the released shapes first."""
    (ckpt / MARKER_NAME).unlink()
    with pytest.raises(CheckpointError) as exc:
        verify_checkpoint(ckpt)
    assert exc.value.kind == "wrong_shape" and "the released checkpoint" in str(exc.value)
    # With the released dims in force, the hashes decide (tokenizer/config equal the release's).
    monkeypatch.setattr(verify_mod, "_released_dims", lambda: TINY)
    _assert_broken(
        ckpt, "hash_mismatch", "Decoder.safetensors", r"sha256 mismatch against ChatTTS's res/sha256_map.json"
    )


def _pretend_released(monkeypatch: pytest.MonkeyPatch, asset: Path) -> None:
    """Make this folder's hashes 'the released ones' so the real-checkpoint path can be exercised."""
    hashes = {rel: sha256_file(asset / rel) for rel in ASSET_FILES}
    monkeypatch.setattr(verify_mod, "release_sha256_map", lambda: (hashes, "test map"))
    monkeypatch.setattr(verify_mod, "_released_dims", lambda: TINY)


def test_real_checkpoint_recognised(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ckpt / MARKER_NAME).unlink()
    _pretend_released(monkeypatch, ckpt)
    report = verify_checkpoint(ckpt)
    assert report.kind == "real" and report.preset is None and report.hash_source == "test map"
    result = _cli("verify", str(ckpt))
    assert result.exit_code == 0 and result.output.startswith("real:"), result.output


def test_release_map_from_package_and_vendored_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from chattts_forge.checkpoint import release

    hashes, origin = release_sha256_map()
    assert origin.endswith("sha256_map.json") and "vendored" not in origin
    assert set(hashes) == set(ASSET_FILES)
    assert hashes["gpt/config.json"] == "0aaa1ecd96c49ad4f473459eb1982fa7ad79fa5de08cde2781bf6ad1f9a0c236"
    # without the chattts package: the vendored copy, same hashes
    monkeypatch.setattr(release, "_package_file", lambda rel: None)
    fallback, origin = release.release_sha256_map.__wrapped__()
    assert "vendored" in origin and fallback == hashes
    assert release.release_spk_stat.__wrapped__() == release.release_spk_stat()


def test_tiny_shares_released_tokenizer_hashes(tiny_ckpt: Path) -> None:
    hashes, _ = release_sha256_map()
    for rel in (
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "tokenizer/special_tokens_map.json",
    ):
        assert sha256_file(tiny_ckpt / rel) == hashes[rel]


# --- where a checkpoint can live ----------------------------------------------------------------


def _fake_hf_cache(root: Path, asset: Path, rev: str = "1a3c04a8b0651689bd9242fbb55b1f4b5a9aef84") -> Path:
    """The huggingface_hub cache layout: snapshot files are relative symlinks into blobs/."""
    repo = root / "hub" / "models--2Noise--ChatTTS"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    snap = repo / "snapshots" / rev
    for src in sorted(asset.rglob("*")):
        if not src.is_file():
            continue
        rel = src.relative_to(asset)
        blob = repo / "blobs" / hashlib.sha256(src.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(src, blob)
        link = snap / "asset" / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    # an older snapshot that refs/main does not point to
    (repo / "snapshots" / "0000000000000000000000000000000000000000" / "asset").mkdir(parents=True)
    return snap


def test_hf_cache_via_hf_home(tiny_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf_home = tmp_path / "hf"
    snap = _fake_hf_cache(hf_home, tiny_ckpt)
    assert (snap / "asset" / "gpt" / "model.safetensors").is_symlink()
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert resolve_asset_dir(None) == snap / "asset"
    report = verify_checkpoint(None)
    assert report.kind == "synthetic" and report.asset_dir == snap / "asset"
    result = _cli("verify")  # no PATH: the default HF cache
    assert result.exit_code == 0 and result.output.startswith("synthetic:"), result.output
    # the cache root, the hub folder, the snapshot root and the asset folder all resolve alike
    for p in (hf_home, hf_home / "hub", snap, snap / "asset"):
        assert verify_checkpoint(p).asset_dir == snap / "asset"


def test_hf_cache_real_and_dangling_blob(
    tiny_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Path(shutil.copytree(tiny_ckpt, tmp_path / "plain"))
    (plain / MARKER_NAME).unlink()
    snap = _fake_hf_cache(tmp_path / "hf", plain)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _pretend_released(monkeypatch, plain)
    assert verify_checkpoint(None).kind == "real"
    # an interrupted download leaves a link to a blob that is not there
    target = (snap / "asset" / "Vocos.safetensors").resolve()
    target.unlink()
    with pytest.raises(CheckpointError, match="dangling link") as exc:
        verify_checkpoint(None)
    assert exc.value.kind == "missing" and exc.value.file == "Vocos.safetensors"


def test_not_a_checkpoint_and_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _cli("verify", str(tmp_path))
    assert result.exit_code == 2 and "is not a ChatTTS checkpoint" in result.output
    result = _cli("verify", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "does not exist" in result.output
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    result = _cli("verify")
    assert result.exit_code == 2 and "no ChatTTS snapshot in the Hugging Face cache" in result.output


def test_header_writer_is_what_safetensors_reads(tmp_path: Path) -> None:
    """Our streaming writer's header layout is accepted by the safetensors library."""
    import numpy as np
    from safetensors.numpy import load_file

    from chattts_forge.checkpoint.safetensors_io import write_safetensors

    arrays = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones((5,), np.float32)}
    p = tmp_path / "x.safetensors"
    write_safetensors(p, [(k, v.shape, "F32") for k, v in arrays.items()], lambda k: arrays[k])
    loaded = load_file(str(p))
    assert set(loaded) == {"a", "b"}
    for k in arrays:
        np.testing.assert_array_equal(loaded[k], arrays[k])
    head, _ = build_header([(k, v.shape, "F32") for k, v in arrays.items()])
    (n,) = struct.unpack("<Q", head[:8])
    assert (8 + n) % 8 == 0 and json.loads(head[8:])["__metadata__"] == {"format": "pt"}


def test_cli_help_explains_itself() -> None:
    for args in (["--help"], ["synthesize", "--help"], ["verify", "--help"], ["inspect", "--help"]):
        result = _cli(*args)
        assert result.exit_code == 0 and "Usage:" in result.output
    assert "released" in _cli("verify", "--help").output
    assert "--preset" in _cli("synthesize", "--help").output


def test_cli_synthesize_and_inspect(tmp_path: Path) -> None:
    out = tmp_path / "cli-tiny"
    result = _cli("synthesize", "--preset", "tiny", "--seed", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "synthetic tiny checkpoint (seed 3)" in result.output
    report = verify_checkpoint(out)
    assert report.kind == "synthetic" and report.seed == 3
    result = _cli("inspect", str(out))
    assert (
        result.exit_code == 0
        and "synthetic tiny (seed 3)" in result.output
        and "gpt/model.safetensors" in result.output
    )
    result = _cli("inspect", "--preset", "full")
    assert result.exit_code == 0 and "1217.4 MB" in result.output
