"""Facts of the released ChatTTS checkpoint that the chattts package carries: file hashes, spk_stat.

Read from the installed `chattts` distribution's files (ChatTTS/res/sha256_map.json and the
`spk_stat` default in ChatTTS/config/config.py) without importing ChatTTS, which would import torch.
When the package is not installed, the copy vendored from chattts 0.2.5 (chattts_release.json next
to this module) is used.
"""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from chattts_forge.checkpoint.layout import ASSET_FILES, sha256_map_key

VENDORED = Path(__file__).with_name("chattts_release.json")


def _package_file(rel: str) -> Path | None:
    try:
        files = metadata.files("chattts")
    except metadata.PackageNotFoundError:
        return None
    for f in files or ():
        if str(f).replace("\\", "/") == rel:
            p = Path(str(f.locate()))
            return p if p.is_file() else None
    return None


@lru_cache(maxsize=1)
def _vendored() -> dict[str, Any]:
    return json.loads(VENDORED.read_text(encoding="utf-8"))


def _spk_stat_from_source(source: str) -> str | None:
    """The default of `spk_stat` in class Config of ChatTTS/config/config.py."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == "spk_stat"
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    return stmt.value.value
    return None


@lru_cache(maxsize=1)
def release_sha256_map() -> tuple[dict[str, str], str]:
    """({asset relative path: sha256} for the 9 released files, where the hashes came from)."""
    p = _package_file("ChatTTS/res/sha256_map.json")
    raw: dict[str, str] | None = None
    origin = "vendored copy of chattts 0.2.5 res/sha256_map.json"
    if p is not None:
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
            origin = str(p)
        except (OSError, json.JSONDecodeError):
            raw = None
    if raw is None or not all(sha256_map_key(f) in raw for f in ASSET_FILES):
        raw = _vendored()["sha256_map"]
        origin = "vendored copy of chattts 0.2.5 res/sha256_map.json"
    return {f: raw[sha256_map_key(f)] for f in ASSET_FILES}, origin


@lru_cache(maxsize=1)
def release_spk_stat() -> str:
    """ChatTTS's own `Config().spk_stat` (speaker statistics of the released 768-wide GPT)."""
    p = _package_file("ChatTTS/config/config.py")
    if p is not None:
        try:
            value = _spk_stat_from_source(p.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            value = None
        if value:
            return value
    return _vendored()["spk_stat"]
