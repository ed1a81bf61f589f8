"""Decoder and Vocos time per call against the window a streamed chunk decodes (GPT steps -> 2 mel
frames each), median of 5, on an artifact's sessions as the runtime opens them.
Usage: python decoder_window.py ARTIFACT"""

import sys
import time

import numpy as np

from chattts_forge.runtime.pipeline import Pipeline

pipe = Pipeline(sys.argv[1], threads=2, engine="fast")
rng = np.random.default_rng(0)
print(f"decoder radius {pipe.decoder_radius} frames, vocos radius {pipe.vocos_radius} frames")
for steps in (8, 24, 48, 80, 132, 200):
    hidden = rng.standard_normal((steps, pipe.dims.hidden_size)).astype(np.float32)
    mel = pipe.decode_mel(hidden, True)
    dec, voc = [], []
    for _ in range(5):
        t = time.perf_counter()
        mel = pipe.decode_mel(hidden, True)
        dec.append(time.perf_counter() - t)
        t = time.perf_counter()
        pipe.vocos(mel)
        voc.append(time.perf_counter() - t)
    print(f"{steps:4d} steps ({2 * steps} frames): Decoder {1000 * np.median(dec):6.1f} ms, Vocos {1000 * np.median(voc):6.1f} ms")
