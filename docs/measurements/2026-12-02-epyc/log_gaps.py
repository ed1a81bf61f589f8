"""The longest silence in a build log and each step's time: `python log_gaps.py BUILD.log`.

Reads the HH:MM:SS stamp that starts each log line (chattts_forge.log's format; a step run side by
side labels its lines `HH:MM:SS [step] ...`, before 2026-12-04 `[step] HH:MM:SS ...`: both count) and
prints the largest gaps between consecutive stamped lines, then the driver's "done in" line of every step.
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
            if stamps and t < stamps[-1][0]:  # past midnight
                t += 86400
            stamps.append((t, line))
    gaps = sorted(((b[0] - a[0], a[1]) for a, b in zip(stamps, stamps[1:], strict=False)), reverse=True)[:5]
    print(f"{len(stamps)} stamped lines, {stamps[-1][0] - stamps[0][0]} s from first to last")
    for gap, before in gaps:
        print(f"gap {gap:4d} s after: {before[:140]}")
    for line in lines:
        if " done in " in line and "chattts_forge.pipeline" in line:
            print(line[:120])
    return 0


if __name__ == "__main__":
    sys.exit(main())
