"""Gated, atomic publication of one artifact: `publish_artifact(artifact_dir, report_dir, to)`.

Refuses (ForgeError, nothing written under `to`) unless:
- the report's integrity seal matches (not edited after the fact) and its gate passed;
- the report names exactly the artifact's files, re-hashed now (same paths, same sha256);
- the artifact is well formed (artifact.json, vocoder FP32, source checkpoint named and hashed).

Layout: `to/<model>/<version>/<variant>/`. The model name is `chattts` for a real checkpoint and
`chattts-synthetic-<preset>-seed<seed>` for a synthetic one (override with `model=`). Versions are
`v1`, `v2`, ...: a variant joins the newest version of its model when that version was built from
the same source checkpoint and does not hold this variant yet; otherwise a new version is opened.
Published versions are never overwritten: an artifact whose files are identical to an already
published variant of the model is a no-op ("already-published"); different content gets a new
version number (or, with an explicit `version=` that is taken, a clear refusal).

Signing: every published variant folder gets `model.sig` (OpenSSF Model Signing, chattts_forge.signing)
over all its files, made in the staging folder before the rename, with `sign_key` (a PEM private key)
or the user's own key pair; the public half is written beside the index as `to/signing-key.pub`. A
tree is signed by one key: publishing into a tree whose signing-key.pub is another key is refused.
An already-published variant without a signature (published before signing existed) is signed in
place; a version folder that has a signature is signed again when a variant joins it.

Crash safety: everything is assembled in `to/.staging/<...>.partial/<variant>/` and moved into place
with one `rename`; a failure removes the staging folder, a killed run's leftovers are removed by the next
publish. The whole critical section holds the publish lock (see index.py), so concurrent publishers
serialize and `index.json` always lists exactly what is published.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_forge.artifact import (
    ArtifactMeta,
)
from chattts_forge.errors import BadInput, ForgeError, IntegrityError
from chattts_forge.evaluate.report_schema import SealedReport, read_report
from chattts_forge.folder_files import FileEntry, hash_tree
from chattts_forge.fsutil import atomic_write_bytes, fsync_dir
from chattts_forge.integrity import (
    MISSING,
    SHA256,
    SIGNATURE_NAME,
    UNRECORDED,
    RecordedFile,
    compare_files,
    sha256_file,
    sha256sums_text,
)
from chattts_forge.log import get_logger
from chattts_forge.publish.index import (
    STAGING_NAME,
    iter_variant_dirs,
    publish_lock,
    rewrite_index,
    version_number,
)
from chattts_forge.publish.manifest import (
    CARD_NAME,
    MANIFEST_NAME,
    REPORT_COPY_NAME,
    RESERVED_NAMES,
    SUMS_NAME,
    build_manifest_core,
    check_safe_name,
    default_model_name,
    finish_manifest,
    load_manifest,
    manifest_bytes,
    manifest_files,
    source_checkpoint,
    source_fingerprint,
)
from chattts_forge.publish.modelcard import render_model_card
from chattts_forge.publish.version_files import sign_version_folder
from chattts_forge.signing import SigningKey, resolve_signing_key, sign_folder

log = get_logger(__name__)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PublishResult:
    status: str  # "published" or "already-published"
    path: Path
    model: str
    version: str
    variant: str
    manifest_sha256: str
    public_key: Path | None = None  # the tree's signing-key.pub


PUBLIC_KEY_FILE = "signing-key.pub"  # beside index.json: the public half of the key the tree is signed with


def record_public_key(root: Path, key: SigningKey, write: bool = True) -> Path:
    """Write `root/signing-key.pub` (call with the publish lock held; `write=False`: only check);
    refuse a tree signed by another key."""
    path = root / PUBLIC_KEY_FILE
    if path.is_file() or not write:
        if path.is_file() and path.read_bytes() != key.public_pem:
            raise ForgeError(
                f"{path} is another key than {key.private_path} (sha256 {key.fingerprint[:16]}...): the variants "
                f"of {root} are signed with it; publish with that key's private half (--sign-key) or to another tree"
            )
        return path
    atomic_write_bytes(path, key.public_pem)
    log.info("public signing key written to %s (sha256 %s); check a published folder with: model_signing verify "
             "key DIR --signature DIR/%s --public_key %s", path, key.fingerprint, SIGNATURE_NAME, path)
    return path


def check_report_matches(report: SealedReport, files: dict[str, FileEntry], artifact_dir: Path) -> None:
    """The report must have judged exactly these bytes: same file set, same hashes."""
    judged = {rel: RecordedFile(rel, None, sha, "the report") for rel, sha in report.artifact_files.items()}
    wording = {UNRECORDED: "{} is not named by the report", MISSING: "the report names {}, which the artifact lacks",
               SHA256: "{} differs from the file the report judged"}
    mismatches = compare_files(judged, {rel: e.bytes for rel, e in files.items()},
                               {rel: e.sha256 for rel, e in files.items()}, complete=True)
    problems = [wording[m.problem].format(m.rel) for m in mismatches]
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ForgeError(
            f"report {report.path} was not made for artifact {artifact_dir}: {'; '.join(problems[:3])}{more}"
        )


def _write_file(path: Path, data: bytes) -> FileEntry:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return FileEntry(path.name, len(data), sha256_file(path))


def copy_verified(src: Path, dst: Path, expected: FileEntry) -> None:
    """Copy src to dst, hashing the bytes written; they must be the bytes the report judged."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    if h.hexdigest() != expected.sha256 or size != expected.bytes:
        raise IntegrityError(f"{src} changed while it was being published; nothing was published")
    shutil.copymode(src, dst)


def payload_hashes(manifest_path: Path) -> dict[str, str]:
    """The artifact's own files of a published variant (what identifies its content)."""
    entries = manifest_files(load_manifest(manifest_path))
    return {p: e.sha256 for p, e in entries.items() if p not in RESERVED_NAMES}


def clean_leftovers(root: Path) -> list[Path]:
    """Remove what a killed publish left behind (call with the publish lock held)."""
    removed: list[Path] = []
    staging = root / STAGING_NAME
    if staging.is_dir():
        removed += list(staging.iterdir())
        shutil.rmtree(staging, ignore_errors=True)
    # Empty <model>/<version>/ folders created just before a killed rename.
    if root.is_dir():
        for model in (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for version in (p for p in model.iterdir() if p.is_dir()):
                with contextlib.suppress(OSError):
                    version.rmdir()  # only succeeds when empty
                    removed.append(version)
            with contextlib.suppress(OSError):
                model.rmdir()
                removed.append(model)
    for p in removed:
        log.info("removed leftover of an interrupted publish: %s", p)
    return removed


def find_identical(root: Path, model: str, variant: str, payload: dict[str, str]) -> Path | None:
    model_dir = root / model
    if not model_dir.is_dir():
        return None
    for vdir in iter_variant_dirs(root):
        if vdir.parent.parent == model_dir and vdir.name == variant:
            if payload_hashes(vdir / MANIFEST_NAME) == payload:
                return vdir
    return None


def choose_version(root: Path, model: str, variant: str, source_fp: str, requested: str | None) -> str:
    model_dir = root / model
    published = [d for d in iter_variant_dirs(root) if d.parent.parent == model_dir]
    if requested is not None:
        check_safe_name("version", requested)
        if (model_dir / requested / variant).exists():
            raise ForgeError(
                f"{model}/{requested}/{variant} is already published with different content; "
                "published versions are never overwritten (omit --version to publish a new version)"
            )
        return requested
    versions = sorted({d.parent.name for d in published}, key=lambda v: (version_number(v), v))
    numbered = [v for v in versions if version_number(v) >= 1]
    if numbered:
        latest = numbered[-1]
        members = [d for d in published if d.parent.name == latest]
        same_source = all(
            source_fingerprint(load_manifest(d / MANIFEST_NAME)["source_checkpoint"]) == source_fp for d in members
        )
        if same_source and variant not in {d.name for d in members}:
            return latest
        return f"v{version_number(latest) + 1}"
    return "v1"


def publish_artifact(
    artifact: str | os.PathLike[str],
    report: str | os.PathLike[str],
    to: str | os.PathLike[str] = "artifacts",
    *,
    model: str | None = None,
    version: str | None = None,
    sign_key: str | os.PathLike[str] | None = None,
    regression: dict[str, Any] | None = None,
) -> PublishResult:
    """Publish `artifact` (an artifact folder) judged by `report` (its evaluation report folder),
    signed with `sign_key` (a PEM private key; None: the user's own key pair). `regression`: the
    build's comparison with the previous version (publish.regression), recorded in the manifest."""
    artifact_dir = Path(artifact)
    root = Path(to)
    meta = ArtifactMeta.load(artifact_dir)
    key = resolve_signing_key(sign_key)
    log.info("signing with %s (public key sha256 %s)", key.private_path, key.fingerprint)
    gate = read_report(report)
    if not gate.passed:
        failed = ", ".join(c.metric for c in gate.failed_checks()) or "see report"
        raise BadInput(f"{gate.path}: the quality gate failed ({failed}); refusing to publish")
    log.info("re-hashing %s", artifact_dir)
    files = hash_tree(artifact_dir)
    check_report_matches(gate, files, artifact_dir)
    clash = sorted(set(files) & RESERVED_NAMES)
    if clash:
        raise BadInput(f"{artifact_dir} contains {clash[0]}, a name publish reserves for itself")
    variant = check_safe_name("variant", meta.variant)
    source = source_checkpoint(meta)
    model = check_safe_name("model", model) if model else default_model_name(meta, source)
    payload = {p: e.sha256 for p, e in files.items()}

    with publish_lock(root):
        clean_leftovers(root)
        record_public_key(root, key, write=False)  # refused before anything is written
        same = find_identical(root, model, variant, payload)
        if same is not None:
            log.info("already published: %s (identical files)", same)
            if not (same / SIGNATURE_NAME).is_file():  # published before signing existed
                sign_folder(same, key)
                log.info("signed %s (it had no %s)", same, SIGNATURE_NAME)
            public_key = record_public_key(root, key)
            rewrite_index(root)
            return PublishResult(
                "already-published",
                same,
                model,
                same.parent.name,
                variant,
                sha256_file(same / MANIFEST_NAME),
                public_key,
            )
        chosen = choose_version(root, model, variant, source_fingerprint(source), version)
        target = root / model / chosen / variant
        staging_parent = root / STAGING_NAME
        staging_parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{model}-{chosen}-{variant}.", suffix=".partial", dir=staging_parent))
        # Assembled under its final name, so the signature names the variant, not a temporary folder.
        stage = staging / variant
        stage.mkdir()
        os.chmod(stage, 0o755)  # a published folder is for everyone to read
        try:
            core = build_manifest_core(model=model, version=chosen, variant=variant, meta=meta, report=gate,
                                       regression=regression)
            _assemble(stage, artifact_dir, files, gate, core)
            sign_folder(stage, key)  # last: model.sig covers every file above
            fsync_dir(stage)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(stage, target)  # the one step that makes it visible
            fsync_dir(target.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            clean_leftovers(root)
            raise
        shutil.rmtree(staging_parent, ignore_errors=True)
        if (target.parent / SIGNATURE_NAME).is_file():  # the version's signature ignores its variants by name
            sign_version_folder(target.parent, key)
        public_key = record_public_key(root, key)
        rewrite_index(root)
    log.info("published %s -> %s (signed: %s)", artifact_dir, target, target / SIGNATURE_NAME)
    return PublishResult("published", target, model, chosen, variant, sha256_file(target / MANIFEST_NAME), public_key)


def _assemble(stage: Path, artifact_dir: Path, files: dict[str, FileEntry], gate: SealedReport,
              core: dict[str, Any]) -> None:
    """Fill the staging folder: payload, report copy, card, manifest (`core`, `build_manifest_core`'s,
    finished with every file's entry), SHA256SUMS."""
    for rel, entry in files.items():
        copy_verified(artifact_dir / rel, stage / rel, entry)
    entries = dict(files)
    entries[REPORT_COPY_NAME] = _entry(stage, REPORT_COPY_NAME, gate.raw_bytes)
    entries[CARD_NAME] = _entry(stage, CARD_NAME, render_model_card(core).encode("utf-8"))
    manifest = finish_manifest(core, entries)
    manifest_entry = _entry(stage, MANIFEST_NAME, manifest_bytes(manifest))
    sums = {p: e.sha256 for p, e in entries.items()}
    sums[MANIFEST_NAME] = manifest_entry.sha256
    _write_file(stage / SUMS_NAME, sha256sums_text(sums).encode("utf-8"))
    for dirpath, _dirs, _files in os.walk(stage):
        fsync_dir(Path(dirpath))


def _entry(stage: Path, rel: str, data: bytes) -> FileEntry:
    e = _write_file(stage / rel, data)
    return FileEntry(rel, e.bytes, e.sha256)
