"""Refuse an environment that holds the other onnxruntime distribution (run by `make env`).

`onnxruntime` (CPU) and `onnxruntime-gpu` install the same `onnxruntime` package folder: with both
in one environment the files of whichever was installed last win, and uninstalling one breaks the
other. So an environment holds exactly one of them.

    python scripts/check_ort_dist.py onnxruntime|onnxruntime-gpu
"""

from __future__ import annotations

import sys
from importlib import metadata

DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in DISTRIBUTIONS:
        print(f"usage: check_ort_dist.py {'|'.join(DISTRIBUTIONS)}", file=sys.stderr)
        return 2
    wanted = argv[0]
    (other,) = (d for d in DISTRIBUTIONS if d != wanted)
    version = installed(other)
    if version is not None:
        print(
            f"error: {sys.prefix} holds {other} {version}, which shares its package folder with {wanted}; "
            f"use another VENV (GPU=1 defaults to .venv-gpu) or `pip uninstall -y {other} {wanted}` first",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
