"""Whole decodes (40 random lengths) with and without the memory pattern, interleaved, 5 rounds: python pat_speed.py ARTIFACT."""
import sys
import time

import numpy as np

import chattts_forge.runtime.session as S
from chattts_forge.runtime.pipeline import Pipeline

A = sys.argv[1]
S.NO_MEM_PATTERN_COMPONENTS = frozenset()
on = Pipeline(A, threads=2)
S.NO_MEM_PATTERN_COMPONENTS = S.NO_SPIN_COMPONENTS
off = Pipeline(A, threads=2)
H = on.dims.hidden_size
rng = np.random.default_rng(0)
hids = [rng.standard_normal((int(rng.integers(10, 430)), H)).astype(np.float32) for _ in range(40)]
def run(p):
    t = time.perf_counter()
    for h in hids:
        p.vocos(p.decode_mel(h, True))
    return time.perf_counter() - t
run(on)
run(off)
res = {"on": [], "off": []}
for r in range(5):
    for name, p in (("on", on), ("off", off)) if r % 2 == 0 else (("off", off), ("on", on)):
        res[name].append(run(p))
print({k: round(float(np.median(v)), 3) for k, v in res.items()}, "ratio off/on", round(float(np.median(res["off"]) / np.median(res["on"])), 3))
