"""Phrase cache hit vs miss, in-process: python phrase_cache_measure.py ARTIFACT OUT.cache N_PHRASES MAX_NEW_TOKEN.

Warms the first N shipped customer-service phrases into OUT.cache, then synthesizes each phrase with
the plain pipeline (a miss) and the cached one (a hit), seed 0, 2 threads; prints JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from chattts_forge.calibration_data.phrases import shipped_phrases
from chattts_forge.log import quiet_logger
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.phrase_cache import build_phrase_cache


def main() -> None:
    art, out, n, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    phrases = shipped_phrases()[:n]
    listing = out.with_suffix(".txt")
    listing.write_text("\n".join(phrases) + "\n", encoding="utf-8")
    params = SynthParams(code=InferCodeParams(seed=0, max_new_token=steps))
    with quiet_logger():
        t0 = time.perf_counter()
        build_phrase_cache(art, listing, out, params, threads=2)
        warm_s = time.perf_counter() - t0
        plain, cached = Pipeline(art, threads=2), Pipeline(art, threads=2, cache=out)
        plain.synthesize(phrases[0], params)
        cached.synthesize(phrases[0], params)
        rows = []
        for text in phrases:
            a0 = time.perf_counter()
            [a] = plain.synthesize(text, params)
            a1 = time.perf_counter()
            [b] = cached.synthesize(text, params)
            b1 = time.perf_counter()
            rows.append({"text": text, "miss_s": a1 - a0, "hit_s": b1 - a1, "audio_s": len(a.wav) / a.sample_rate,
                         "max_abs_diff": float(np.abs(a.wav - b.wav).max()), "cached": b.cached})
    miss = float(np.mean([r["miss_s"] for r in rows]))
    hit = float(np.mean([r["hit_s"] for r in rows]))
    print(json.dumps({"artifact": str(art), "phrases": n, "max_new_token": steps, "warm_seconds": warm_s,
                      "mean_miss_s": miss, "mean_hit_s": hit, "hit_over_miss": hit / miss,
                      "at_60pct_s": 0.6 * hit + 0.4 * miss, "max_abs_diff": max(r["max_abs_diff"] for r in rows),
                      "cache_bytes": out.stat().st_size, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
