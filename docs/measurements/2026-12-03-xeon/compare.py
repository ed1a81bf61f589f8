"""Which published files differ between two artifacts folders (byte for byte).

    python compare.py BEFORE/artifacts AFTER/artifacts
"""
import sys
from collections import Counter
from pathlib import Path

a, b = Path(sys.argv[1]), Path(sys.argv[2])
fa = {p.relative_to(a).as_posix(): p for p in a.rglob("*") if p.is_file()}
fb = {p.relative_to(b).as_posix(): p for p in b.rglob("*") if p.is_file()}
only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
diff = sorted(k for k in set(fa) & set(fb) if fa[k].read_bytes() != fb[k].read_bytes())
print(len(fa), "files before,", len(fb), "after;", len(diff), "differ; only before:", only_a, "only after:", only_b)
print(Counter(Path(k).name for k in diff))
for k in diff:
    print(" ", k)
