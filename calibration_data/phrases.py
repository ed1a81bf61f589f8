"""The shipped phrase lists a warm phrase cache is built from (versioned, like the corpora).

    calibration_data/phrases/v1/customer_service.txt   # zh and en, one phrase per line
    calibration_data/phrases/v1/manifest.json          # lines per language, sha256, purpose

The customer-service list holds the kind of short, frequent phrases that make up most of a service's
traffic (greetings, hold, transfer, order/refund/delivery status, verification, menus, apologies),
written for chattts-forge; it shares no line with the held-out evaluation split (tested), so a cache
never flatters the quality gate. A new version is a new folder; old ones stay so recorded hashes
stay reproducible. After editing run `python -m chattts_forge.calibration_data.phrases` to rewrite
the manifest (a test checks it).

How `chattts-forge warm` treats a phrase list's bad lines (runtime.phrase_cache_build.read_phrase_list):
blank lines and duplicates (same normalised text as an earlier line) are skipped with a warning
naming the line; a line with nothing speakable is refused naming the line; so is a file that is
missing, not UTF-8 or empty.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import sha256_file

PHRASES_DIR = Path(__file__).resolve().parent / "phrases"
PHRASES_SCHEMA = "chattts-forge/phrases/1"
MANIFEST_NAME = "manifest.json"
SHIPPED_LIST = "customer_service"
PURPOSE = {
    SHIPPED_LIST: "frequent customer-service phrases (greetings, hold, transfer, order/refund/delivery status, "
                  "verification, IVR menus, apologies), zh and en",
}
_HAN = re.compile(r"[\u4e00-\u9fff]")


def latest_version() -> str:
    versions = sorted((p.name for p in PHRASES_DIR.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name)),
                      key=lambda v: int(v[1:]))
    if not versions:
        raise ForgeError(f"no phrase list versions under {PHRASES_DIR}")
    return versions[-1]


def shipped_phrase_file(name: str = SHIPPED_LIST, version: str | None = None) -> Path:
    """The path of a shipped phrase list (newest version unless `version`)."""
    path = PHRASES_DIR / (version or latest_version()) / f"{name}.txt"
    if not path.is_file():
        raise ForgeError(f"no shipped phrase list {path}")
    return path


def shipped_phrases(name: str = SHIPPED_LIST, version: str | None = None) -> list[str]:
    """The phrases of a shipped list, in file order (its lines are all non-blank and distinct)."""
    return [line.strip() for line in shipped_phrase_file(name, version).read_text(encoding="utf-8").splitlines()
            if line.strip()]


def language_of(phrase: str) -> str:
    return "zh" if _HAN.search(phrase) else "en"


def build_manifest(version_dir: Path) -> dict[str, Any]:
    files = []
    for path in sorted(version_dir.glob("*.txt")):
        phrases = [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]
        langs: dict[str, int] = {}
        for p in phrases:
            langs[language_of(p)] = langs.get(language_of(p), 0) + 1
        files.append({"path": path.name, "name": path.stem, "purpose": PURPOSE.get(path.stem, "user-added list"),
                      "lines": len(phrases), "languages": dict(sorted(langs.items())),
                      "sha256": sha256_file(path)})
    return {"schema": PHRASES_SCHEMA, "version": version_dir.name,
            "format": "UTF-8, one phrase per line",
            "license": "written for chattts-forge (no third-party text)", "files": files}


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


if __name__ == "__main__":  # maintenance: python -m chattts_forge.calibration_data.phrases [VERSION]
    import sys

    vdir = PHRASES_DIR / (sys.argv[1] if len(sys.argv) > 1 else latest_version())
    atomic_write_bytes(vdir / MANIFEST_NAME, manifest_bytes(build_manifest(vdir)))
    print(vdir / MANIFEST_NAME)
