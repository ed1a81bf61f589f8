"""RSS of the encoders (whole and streamed, random lengths), 600 encodes: python enc_rss.py mp3|opus|flac|wav."""
import sys

import numpy as np
from rss_now import rss

from chattts_forge.runtime.serve.formats import StreamEncoder, encode_whole

rng = np.random.default_rng(0)
fmt = sys.argv[1]
print(fmt, "start", round(rss()))
for i in range(1, 601):
    n = int(rng.integers(2000, 200000))
    wav = (rng.standard_normal(n) * 0.1).astype(np.float32)
    if i % 2:
        encode_whole(wav, 24000, fmt)
    else:
        enc = StreamEncoder(fmt, 24000)
        for c in np.array_split(wav, 8):
            enc.write(c)
        enc.close()
    if i % 150 == 0:
        print(fmt, i, round(rss()), flush=True)
