"""A folder's files: every regular file under a folder (`list_files`, symlinks and odd files refused),
hashed (`hash_tree` -> {relative path: `FileEntry`}: what evaluate records and publish copies), and
one support file as artifact.json records it (`file_record`). Hashing is chattts_forge.integrity's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_forge import integrity  # integrity.sha256_file, the one hasher, looked up when called
from chattts_forge.errors import BadInput, NotFound


@dataclass(frozen=True)
class FileEntry:
    """One file of a folder as `hash_tree` finds it."""

    path: str  # relative, '/'-separated
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


def file_record(folder: str | os.PathLike[str], rel: str) -> dict[str, Any]:
    """{"file", "bytes", "sha256"} of a file of an artifact folder: how artifact.json records a support
    file (and a graph's external data)."""
    path = Path(folder) / rel
    return {"file": rel, "bytes": path.stat().st_size, "sha256": integrity.sha256_file(path)}


def list_files(root: str | os.PathLike[str]) -> list[str]:
    """Every regular file under root as sorted relative posix paths; symlinks and odd files refused."""
    root = Path(root)
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if p.is_symlink():
                raise BadInput(f"{p}: symbolic links are not allowed in an artifact")
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_file():
                raise BadInput(f"{p}: not a regular file")
            out.append(p.relative_to(root).as_posix())
    return sorted(out)


def hash_tree(root: str | os.PathLike[str]) -> dict[str, FileEntry]:
    """Hash every file of a folder, recursively: {relative path: FileEntry}.

    The one definition of "an artifact's files": evaluate records it in its report, publish checks
    the report against it and copies exactly these files.
    """
    root = Path(root)
    if not root.is_dir():
        raise NotFound(f"{root} is not a folder")
    return {
        rel: FileEntry(rel, (root / rel).stat().st_size, integrity.sha256_file(root / rel)) for rel in list_files(root)
    }
