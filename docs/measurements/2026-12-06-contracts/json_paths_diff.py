"""Path-by-path differences of every JSON file of two published trees.

    python json_paths_diff.py BASE HEAD

Prints each file that differs and its differing key paths: `~` a changed value, `+` only in HEAD,
`-` only in BASE; lists of equal length are compared item by item (`[]`), others as one value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def differences(a: Any, b: Any, path: str, out: set[tuple[str, str]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in set(a) | set(b):
            if key not in a:
                out.add(("+", f"{path}.{key}"))
            elif key not in b:
                out.add(("-", f"{path}.{key}"))
            else:
                differences(a[key], b[key], f"{path}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for x, y in zip(a, b, strict=True):
            differences(x, y, f"{path}[]", out)
    elif a != b:
        out.add(("~", path))


def main(base: Path, head: Path) -> None:
    for f in sorted(base.rglob("*.json")):
        g = head / f.relative_to(base)
        if not g.exists():
            print(f"only in base: {f.relative_to(base)}")
            continue
        out: set[tuple[str, str]] = set()
        differences(json.loads(f.read_text()), json.loads(g.read_text()), "", out)
        if out:
            print(f.relative_to(base), len(out))
            for sign, key in sorted(out, key=lambda r: r[1]):
                print("   ", sign, key)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
