"""The figures of scorers.md: SIM matrix of the four Flite voices (held-out split), SIM of slt's damaged
copies to slt's reference, DNSMOS of every set, each mean with its 95% bootstrap interval.

    .venv/bin/python docs/measurements/2026-12-01-xeon/scorers_measure.py [--sim-only]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from chattts_forge.evaluate.naturalness import KEYS, Dnsmos
from chattts_forge.evaluate.speaker import SpeakerEncoder, pooled_reference, similarity
from chattts_forge.evaluate.stats import bootstrap_interval

DATA = Path(__file__).resolve().parents[3] / "tests" / "data" / "speech"
VOICES = ("slt", "rms", "awb", "kal16")
SETS = {**{v: f"voices/{v}" for v in VOICES}, "slt-noise10db": "degraded/slt-noise10db", "slt-crush4bit": "degraded/slt-crush4bit"}
REF, TEST = range(1, 6), range(6, 11)


def load(rel: str, ids) -> list[tuple[np.ndarray, int]]:
    return [sf.read(DATA / rel / f"{i:03d}.wav", dtype="float32") for i in ids]


def fmt(values: list[float]) -> str:
    lo, hi = bootstrap_interval(values)
    return f"{np.mean(values):.3f} [{lo:.3f}, {hi:.3f}]"


def main() -> None:
    enc = SpeakerEncoder.load()
    t0 = time.perf_counter()
    refs = {v: pooled_reference(enc.embed_many(load(SETS[v], REF))) for v in VOICES}
    tests = {name: enc.embed_many(load(rel, TEST)) for name, rel in SETS.items()}
    print(f"embedded {5 * len(VOICES) + 5 * len(SETS)} utterances in {time.perf_counter() - t0:.1f} s\n")
    print("| test utterances (006-010) \\ reference (001-005) | " + " | ".join(VOICES) + " | own - best other |")
    print("| --- |" + " --- |" * (len(VOICES) + 1))
    for name in SETS:
        sims = {r: [similarity(e, refs[r]) for e in tests[name]] for r in VOICES}
        own = name.split("-")[0]
        margin = np.mean(sims[own]) - max(np.mean(sims[r]) for r in VOICES if r != own)
        print(f"| {name} | " + " | ".join(fmt(sims[r]) for r in VOICES) + f" | {margin:.3f} |")
    print("\n| single-utterance reference | " + " | ".join(VOICES) + " |")
    print("| --- |" + " --- |" * len(VOICES))
    for k in REF:
        one = {v: enc.embed_many(load(SETS[v], [k]))[0] for v in VOICES}
        row = []
        for v in VOICES:
            means = {r: np.mean([similarity(e, one[r]) for e in tests[v]]) for r in VOICES}
            row.append(f"{means[v]:.3f} (+{means[v] - max(means[r] for r in VOICES if r != v):.3f})")
        print(f"| {k:03d}.wav | " + " | ".join(row) + " |")
    if "--sim-only" in sys.argv:
        return
    dnsmos = Dnsmos.load(threads=2)
    print("\n| set (001-010) | " + " | ".join(k.upper() for k in KEYS) + " |")
    print("| --- |" + " --- |" * len(KEYS))
    t0 = time.perf_counter()
    for name, rel in SETS.items():
        scores = [dnsmos.score(a, sr) for a, sr in load(rel, range(1, 11))]
        print(f"| {name} | " + " | ".join(fmt([s[k] for s in scores]) for k in KEYS) + " |")
    print(f"\nDNSMOS of {10 * len(SETS)} clips in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
