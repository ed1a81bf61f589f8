"""The longest silences in a build log and each step's time: `python log_gaps.py BUILD.log`.

Every line that carries chattts_forge.log's HH:MM:SS stamp counts, wherever a side-by-side step's
label puts it (`HH:MM:SS [step] ...` since 2026-12-04, `[step] HH:MM:SS ...` before).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

STAMP = re.compile(r"^(?:\[[^\]]+\] )?(\d\d):(\d\d):(\d\d) ")


def main() -> int:
    lines = Path(sys.argv[1]).read_text(encoding="utf-8", errors="replace").splitlines()
    stamps: list[tuple[int, str]] = []
    for line in lines:
        m = STAMP.match(line)
        if m:
            h, mi, s = map(int, m.groups())
            t = h * 3600 + mi * 60 + s
            if stamps and t < stamps[-1][0] - 43200:  # past midnight
                t += 86400
            stamps.append((t, line))
    gaps = sorted(((b[0] - a[0], a[1]) for a, b in zip(stamps, stamps[1:], strict=False)), reverse=True)[:5]
    print(f"{len(stamps)} stamped lines, {stamps[-1][0] - stamps[0][0]} s from first to last")
    for gap, before in gaps:
        print(f"gap {gap:4d} s after: {before[:140]}")
    for _, line in stamps:
        if "chattts_forge.pipeline:" in line and " done in " in line:
            print(line[:110])
    return 0


if __name__ == "__main__":
    sys.exit(main())
