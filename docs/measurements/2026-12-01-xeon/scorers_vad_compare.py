"""One-off: the SIM matrix with three silence-trimming choices (scorers.md): ours (energy threshold),
resemblyzer's own trim_long_silences with the real webrtcvad, and none.

    .venv/bin/pip install --target /tmp/vadpkg webrtcvad-wheels==2.0.14.post1   # scratch, not the venv
    .venv/bin/python docs/measurements/2026-12-01-xeon/scorers_vad_compare.py
"""

from __future__ import annotations

import sys
import types

import numpy as np
import soundfile as sf

sys.path.insert(0, "/tmp/vadpkg")
import webrtcvad  # noqa: E402, F401  (the real one, for resemblyzer's audio module)

# resemblyzer.audio imports librosa at the top for functions not used here.
_fake = types.ModuleType("librosa")
_fake.feature = types.SimpleNamespace()
sys.modules["librosa"] = _fake
from resemblyzer import audio as ra  # noqa: E402

from chattts_forge.evaluate import speaker as S  # noqa: E402

V = ["slt", "rms", "awb", "kal16"]
D = "tests/data/speech/voices"
enc = S.SpeakerEncoder.load()

raw = {v: [sf.read(f"{D}/{v}/{i:03d}.wav", dtype="float32")[0] for i in range(1, 11)] for v in V}
def matrix(prep):
    emb = {v: enc.embed_preprocessed_many([prep(w) for w in raw[v]]) for v in V}
    refs = {v: S.pooled_reference(emb[v][:5]) for v in V}
    return {v: {r: float(np.mean([S.similarity(e, refs[r]) for e in emb[v][5:]])) for r in V} for v in V}
preps = {
    "energy (ours)": lambda w: S.preprocess(w, 16000),
    "webrtcvad (resemblyzer)": lambda w: ra.trim_long_silences(S._normalise_volume(w)),
    "no trimming": lambda w: S._normalise_volume(w),
}
kept = {n: np.mean([len(p(w)) / len(w) for v in V for w in raw[v]]) for n, p in preps.items()}
for name, p in preps.items():
    m = matrix(p)
    print(f"## {name}: kept {kept[name]:.3f} of the samples")
    print("| test \\ reference | " + " | ".join(V) + " | margin |")
    print("| --- |" + " --- |" * (len(V) + 1))
    for v in V:
        margin = m[v][v] - max(m[v][r] for r in V if r != v)
        print(f"| {v} | " + " | ".join(f"{m[v][r]:.3f}" for r in V) + f" | {margin:.3f} |")
