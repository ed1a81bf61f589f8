"""`artifacts/index.json` and the publish lock.

The index is rebuilt from the published manifests (never patched), under an exclusive `fcntl.flock`
on `artifacts/.publish.lock`, and written with one atomic rename. Every publish takes the same lock
for its whole critical section (version choice, rename into place, index rewrite), so concurrent
publishers never lose each other's entries, and the index is a pure function of what is published:
`verify` rebuilds it and compares bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import sha256_file
from chattts_forge.publish.history import HISTORY_NAME, history_bytes, write_history
from chattts_forge.publish.manifest import MANIFEST_NAME, load_manifest

INDEX_NAME = "index.json"
INDEX_SCHEMA = "chattts-forge/index/1"
LOCK_NAME = ".publish.lock"
STAGING_NAME = ".staging"


@contextlib.contextmanager
def publish_lock(root: str | os.PathLike[str]) -> Iterator[None]:
    """Exclusive lock on `root/.publish.lock`; released by the OS if the holder dies."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ForgeError(f"cannot open the publish lock in {root}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def version_number(version: str) -> int:
    m = re.fullmatch(r"v(\d+)", version)
    return int(m.group(1)) if m else -1


def iter_variant_dirs(root: Path) -> list[Path]:
    """Published variant folders (`<model>/<version>/<variant>/` holding a manifest), sorted."""
    out = []
    if not root.is_dir():
        return out
    for model in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for version in sorted(
            (p for p in model.iterdir() if p.is_dir() and not p.name.startswith(".")),
            key=lambda p: (version_number(p.name), p.name),
        ):
            for variant in sorted(p for p in version.iterdir() if p.is_dir() and not p.name.startswith(".")):
                if (variant / MANIFEST_NAME).is_file():
                    out.append(variant)
    return out


def headline_figures(manifest: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader compares variants by: the report's headline (report_schema.HEADLINE_KEYS)."""
    return dict((manifest.get("gate") or {}).get("headline") or {})


def index_entry(root: Path, variant_dir: Path) -> dict[str, Any]:
    manifest = load_manifest(variant_dir / MANIFEST_NAME)
    return {
        "model": manifest["model"],
        "version": manifest["version"],
        "variant": manifest["variant"],
        "path": variant_dir.relative_to(root).as_posix(),
        "manifest_sha256": sha256_file(variant_dir / MANIFEST_NAME),
        "created_at": manifest["created_at"],
        "source_kind": manifest["source_checkpoint"]["kind"],
        "precision": manifest["precision"],
        "total_bytes": manifest.get("total_bytes"),
        "gate_passed": manifest["gate"]["passed"],
        "figures": headline_figures(manifest),
    }


def build_index(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The index: every published variant, and (when any version has its own manifest: routing.json,
    phrase cache; publish.version_files) a `versions` list."""
    from chattts_forge.publish.version_files import version_index_entries

    root = Path(root)
    index: dict[str, Any] = {"schema": INDEX_SCHEMA, "variants": [index_entry(root, d) for d in iter_variant_dirs(root)]}
    versions = version_index_entries(root)
    if versions:  # absent otherwise, so trees without version files keep their index bytes
        index["versions"] = versions
    models = sorted({d.parent.parent.name for d in iter_variant_dirs(root)})
    if models:  # each model's history page (publish.history), rewritten with the index

        index["histories"] = [{"model": m, "path": f"{m}/{HISTORY_NAME}",
                               "sha256": hashlib.sha256(history_bytes(root / m)).hexdigest()} for m in models]
    return index


def index_bytes(index: dict[str, Any]) -> bytes:
    return (json.dumps(index, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def rewrite_index(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Rebuild `root/index.json` from the manifests (written only when it changes); hold the lock."""
    index = build_index(root)
    for entry in index.get("histories", []):  # first: the index names their bytes
        write_history(Path(root) / entry["model"])
    want = index_bytes(index)
    path = Path(root) / INDEX_NAME
    if not path.is_file() or path.read_bytes() != want:
        atomic_write_bytes(path, want)
    return index


def update_index(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Take the lock and rebuild the index (e.g. after removing a variant by hand)."""
    with publish_lock(root):
        return rewrite_index(root)
