"""Signed published folders (OpenSSF Model Signing through `model-signing`), checked with the library's
own command line (`model_signing verify key`), with `chattts-forge verify --public-key`, and keys."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_publish import MODEL, make_artifact, make_report

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.publish import publish_artifact, verify_path
from chattts_forge.publish.version_files import sign_version_folder
from chattts_forge.signing import (
    PRIVATE_KEY_NAME,
    PUBLIC_KEY_NAME,
    load_signing_key,
    sign_folder,
    user_signing_key,
    verify_folder,
)


def library_verify(folder: Path, public_key: Path) -> subprocess.CompletedProcess:
    """The library's own command, in a process that imports nothing of ours."""
    return subprocess.run(
        [sys.executable, "-m", "model_signing", "verify", "key", str(folder), "--signature", str(folder / "model.sig"),
         "--public_key", str(public_key)],
        capture_output=True, text=True, timeout=120,
    )


def new_key(path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


@pytest.fixture
def own_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user of our own for this test: its config folder (where the key pair is made)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "chattts-forge"


def test_published_variant_verifies_with_the_library_cli_and_rejects_a_change(tmp_path: Path, own_user: Path) -> None:
    artifact = make_artifact(tmp_path / "build" / "int8-dynamic")
    result = publish_artifact(artifact, make_report(tmp_path / "report", artifact), tmp_path / "artifacts")
    vdir, pub = result.path, tmp_path / "artifacts" / "signing-key.pub"
    assert result.public_key == pub and pub.read_bytes() == (own_user / PUBLIC_KEY_NAME).read_bytes()
    # The signature covers every file of the folder, manifest.json and SHA256SUMS included.
    statement = json.loads(__import__("base64").b64decode(json.loads((vdir / "model.sig").read_text())
                                                            ["dsseEnvelope"]["payload"]))
    signed = {r["name"] for r in statement["predicate"]["resources"]}
    assert signed == {p.name for p in vdir.iterdir()} - {"model.sig"}
    assert {"manifest.json", "SHA256SUMS", "artifact.json", "report.json", "README.md"} <= signed
    ok = library_verify(vdir, pub)
    assert ok.returncode == 0 and "Verification succeeded" in ok.stdout, ok.stderr
    for name in ("gpt.onnx", "manifest.json", "SHA256SUMS"):
        path = vdir / name
        original = path.read_bytes()
        path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        bad = library_verify(vdir, pub)
        assert bad.returncode != 0 and name in bad.stderr, (name, bad.stderr)
        with pytest.raises(ForgeError, match=f"{path}: differs from the file that was signed"):
            verify_folder(vdir, pub)
        path.write_bytes(original)
    (vdir / "extra.txt").write_text("not signed")
    assert library_verify(vdir, pub).returncode != 0
    with pytest.raises(ForgeError, match="extra.txt: not part of what was signed"):
        verify_folder(vdir, pub)


def test_verify_public_key_names_a_coherently_changed_file(tmp_path: Path, own_user: Path) -> None:
    """A file changed together with its manifest and SHA256SUMS passes the manifest check; only the
    signature tells, and `verify --public-key` names the file."""
    from chattts_forge.integrity import sha256_file, sha256sums_text

    artifact = make_artifact(tmp_path / "build" / "int8-dynamic")
    root = tmp_path / "artifacts"
    vdir = publish_artifact(artifact, make_report(tmp_path / "report", artifact), root).path
    trusted = tmp_path / "trusted.pub"
    trusted.write_bytes((root / "signing-key.pub").read_bytes())
    (vdir / "tokenizer.json").write_text('{"model": "evil"}')
    manifest = json.loads((vdir / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["path"] == "tokenizer.json":
            entry["sha256"], entry["bytes"] = sha256_file(vdir / "tokenizer.json"), (vdir / "tokenizer.json").stat().st_size
    (vdir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    sums = {e["path"]: e["sha256"] for e in manifest["files"]} | {"manifest.json": sha256_file(vdir / "manifest.json")}
    (vdir / "SHA256SUMS").write_text(sha256sums_text(sums))
    # index.json quotes the manifest's sha256, so the tree check still notices; the folder alone does not.
    assert verify_path(vdir).ok
    res = CliRunner().invoke(main, ["verify", str(vdir), "--public-key", str(trusted)])
    assert res.exit_code == 2
    # Every file that differs from what was signed is named: the payload and the two lists.
    assert f"{vdir / 'SHA256SUMS'}: differs from the file that was signed (also: manifest.json, tokenizer.json)" in (
        res.output.replace("\n", ""))
    # The signature that a second key made does not verify with the first.
    other = tmp_path / "other.pem"
    new_key(other)
    sign_folder(vdir, load_signing_key(other))
    res = CliRunner().invoke(main, ["verify", str(vdir), "--public-key", str(trusted)])
    assert res.exit_code == 2 and "signed with another key" in res.output


def test_version_folder_signature_covers_its_own_files_only(tmp_path: Path, own_user: Path) -> None:
    root = tmp_path / "artifacts"
    for variant in ("fp32", "int8-dynamic"):
        a = make_artifact(tmp_path / "build" / variant, variant=variant)
        publish_artifact(a, make_report(tmp_path / "reports" / variant, a), root)
    version = root / MODEL / "v1"
    (version / "routing.json").write_text('{"stand-in": true}\n')
    (version / "phrase_cache.bin").write_bytes(b"\0" * 100)
    key = user_signing_key()
    sign_version_folder(version, key)
    pub = root / "signing-key.pub"
    assert library_verify(version, pub).returncode == 0
    statement = json.loads(__import__("base64").b64decode(json.loads((version / "model.sig").read_text())
                                                            ["dsseEnvelope"]["payload"]))
    assert {r["name"] for r in statement["predicate"]["resources"]} == {"routing.json", "phrase_cache.bin"}
    assert {"fp32", "int8-dynamic", "model.sig"} <= set(statement["predicate"]["serialization"]["ignore_paths"])
    # A variant joining the version: publish signs the version folder again (its ignore list names it).
    a = make_artifact(tmp_path / "build" / "int8-static", variant="int8-static")
    publish_artifact(a, make_report(tmp_path / "reports" / "int8-static", a), root)
    assert library_verify(version, pub).returncode == 0
    (version / "routing.json").write_text('{"stand-in": false}\n')
    bad = library_verify(version, pub)
    assert bad.returncode != 0 and "routing.json" in bad.stderr


def test_user_key_pair_made_once_private_0600(own_user: Path) -> None:
    first = user_signing_key()
    assert first.private_path == own_user / PRIVATE_KEY_NAME
    assert stat.S_IMODE(os.stat(first.private_path).st_mode) == 0o600
    assert (own_user / PUBLIC_KEY_NAME).read_bytes() == first.public_pem
    before = first.private_path.read_bytes()
    again = user_signing_key()
    assert again.public_pem == first.public_pem and first.private_path.read_bytes() == before


def test_sign_key_option_and_a_tree_signed_by_another_key(tmp_path: Path, own_user: Path) -> None:
    pem = new_key(tmp_path / "release.pem")
    artifact = make_artifact(tmp_path / "build" / "int8-dynamic")
    report = make_report(tmp_path / "report", artifact)
    root = tmp_path / "artifacts"
    res = CliRunner().invoke(main, ["publish", "--artifact", str(artifact), "--report", str(report), "--to", str(root),
                                    "--sign-key", str(pem)])
    assert res.exit_code == 0, res.output
    assert (root / "signing-key.pub").read_bytes() == load_signing_key(pem).public_pem
    assert not (own_user / PRIVATE_KEY_NAME).exists()  # the given key was used; no key pair was made
    vdir = root / MODEL / "v1" / "int8-dynamic"
    assert library_verify(vdir, root / "signing-key.pub").returncode == 0
    other = make_artifact(tmp_path / "build" / "fp16", variant="fp16")
    with pytest.raises(ForgeError, match="signing-key.pub is another key"):
        publish_artifact(other, make_report(tmp_path / "report16", other), root)  # the user's own key
    assert not (root / MODEL / "v1" / "fp16").exists()
    res = CliRunner().invoke(main, ["verify", str(root), "--public-key", str(root / "signing-key.pub")])
    assert res.exit_code == 0 and "signatures verified" in res.output, res.output


def test_bad_keys_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(ForgeError, match="is not a PEM private key"):
        load_signing_key(tmp_path / "junk.pem")
    with pytest.raises(ForgeError, match="does not exist"):
        load_signing_key(tmp_path / "missing.pem")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ed = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ed.pem").write_bytes(ed.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    with pytest.raises(ForgeError, match="not an EC P-256"):
        load_signing_key(tmp_path / "ed.pem")
    res = CliRunner().invoke(main, ["verify", str(tmp_path), "--public-key", str(tmp_path / "junk.pem")])
    assert res.exit_code == 2 and "is not a PEM public key" in res.output
