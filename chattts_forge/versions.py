"""Versions of the libraries and the toolchain actually in use, for every manifest."""

from __future__ import annotations

import os
import subprocess
import time
from importlib import metadata
from pathlib import Path

from chattts_forge import __version__

TRACKED_DISTRIBUTIONS = (
    "torch",
    "torchaudio",
    "chattts",
    "vocos",
    "transformers",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxconverter-common",
    "numpy",
    "tokenizers",
    "faster-whisper",
    "ctranslate2",
    "jiwer",
)


def library_versions(names: tuple[str, ...] = TRACKED_DISTRIBUTIONS) -> dict[str, str | None]:
    """Installed version of each distribution, None where it is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    """The toolchain's git commit (with '-dirty' when the tree has changes), None outside a checkout."""
    here = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def toolchain_info() -> dict[str, str | None]:
    return {"name": "chattts-forge", "version": __version__, "git_commit": git_commit()}


def build_timestamp() -> str:
    """UTC ISO-8601 time to stamp into build outputs.

    Honours SOURCE_DATE_EPOCH (reproducible-builds convention; `make artifacts` sets it to the
    toolchain's commit time) so that a rerun after a crash writes the same bytes as an
    uninterrupted run; the wall clock otherwise.
    """
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    seconds = int(epoch) if epoch and epoch.isdigit() else int(time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
