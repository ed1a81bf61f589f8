"""RSS of N threads running whole decodes (Decoder + Vocos, random lengths 10-430 steps) on one Pipeline:

    ROUNDS=12 python dec_rss.py ARTIFACT N      # prints RSS MiB every 100 decodes
"""
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from rss_now import rss

from chattts_forge.runtime.pipeline import Pipeline

pipe = Pipeline(sys.argv[1], threads=1)
workers = int(sys.argv[2])
H = pipe.dims.hidden_size
def one(i):
    rng = np.random.default_rng(i)
    T = int(rng.integers(10, 430))
    hid = rng.standard_normal((T, H)).astype(np.float32)
    mel = pipe.decode_mel(hid, True)
    pipe.vocos(mel)
print("start", round(rss()), flush=True)
with ThreadPoolExecutor(workers) as pool:
    for k in range(int(__import__("os").environ.get("ROUNDS", "6"))):
        list(pool.map(one, range(k * 100, (k + 1) * 100)))
        print((k + 1) * 100, round(rss()), flush=True)
