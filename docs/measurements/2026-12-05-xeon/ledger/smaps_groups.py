"""Resident memory of a process by kind of mapping, from /proc/PID/smaps (Linux).

    python smaps_groups.py PID [LABEL]   # one JSON line: MiB resident per group

Groups: `heap` (glibc's main arena), `anon-arena` (anonymous mappings on a 64 MiB boundary: glibc's
thread arenas), `anon-large` (other anonymous mappings of 1 MiB or more: big malloc blocks, numpy
buffers, onnxruntime's arenas), `anon-small`, `stack`, and file-backed ones by file suffix
(`.so`, `.onnx`, `.data`, `.bin`, other).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict

HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$")


def groups(pid: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    name, size, kind = "", 0, ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = HEADER.match(line)
            if m:
                start, end, name = int(m.group(1), 16), int(m.group(2), 16), m.group(3).strip()
                size = end - start
                if name == "[heap]":
                    kind = "heap"
                elif name.startswith("[stack"):
                    kind = "stack"
                elif name.startswith("["):
                    kind = "other"
                elif name:
                    suffix = next((s for s in (".so", ".onnx", ".data", ".bin") if s in name.rsplit("/", 1)[-1]), "")
                    kind = "file" + suffix if suffix else "file-other"
                elif start % (64 << 20) == 0:  # glibc's thread arenas start on a 64 MiB boundary
                    kind = "anon-arena"
                elif size >= 1 << 20:
                    kind = "anon-large"
                else:
                    kind = "anon-small"
            elif line.startswith("Rss:"):
                out[kind] += int(line.split()[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items())}


if __name__ == "__main__":
    pid = int(sys.argv[1])
    g = groups(pid)
    print(json.dumps({"label": sys.argv[2] if len(sys.argv) > 2 else "", "t": round(time.time(), 1),
                      "total_mib": round(sum(g.values()), 1), "mib": g}))
