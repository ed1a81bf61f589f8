"""What a warm phrase cache does to latency: the report's ``phrase_cache`` section.

`measure_cache_effect(artifact, phrases, hit_ratio=0.6)` builds a phrase cache of `phrases` for the
artifact (runtime.phrase_cache, in a temporary file), then synthesizes each phrase with the plain
pipeline (a miss: code stage + Decoder + Vocos) and with the cached one (a hit: Vocos only), same
speaker and seed, and checks the two waveforms agree. The latency a service sees at a hit ratio h
(seed 004's customer-service traffic: 60% of requests are ~200 phrases) is
``h * mean(hit) + (1 - h) * mean(miss)``, stated against no cache (``mean(miss)``).

Section::

    {"hit_ratio", "phrases", "miss_seconds": percentiles, "hit_seconds": percentiles,
     "hit_over_miss" (mean hit / mean miss), "mean_seconds_no_cache", "mean_seconds_at_hit_ratio",
     "speedup_at_hit_ratio", "max_abs_diff" (hit vs miss waveforms), "cache_bytes", "method"}
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.log import get_logger
from chattts_forge.runtime.timing import percentiles

log = get_logger(__name__)

DEFAULT_HIT_RATIO = 0.6


def measure_cache_effect(
    artifact: Path,
    phrases: list[str],
    *,
    hit_ratio: float = DEFAULT_HIT_RATIO,
    max_new_token: int = 96,
    seed: int = 0,
    threads: int | None = 2,
    provider: str = "cpu",
) -> dict[str, Any]:
    from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
    from chattts_forge.runtime.phrase_cache import build_phrase_cache

    plain = Pipeline(artifact, threads=threads, provider=provider)
    params = SynthParams(code=InferCodeParams(spk_emb=plain.random_speaker(seed), seed=seed, max_new_token=max_new_token))
    with tempfile.TemporaryDirectory(prefix="forge-phrases-") as tmp:
        listing = Path(tmp) / "phrases.txt"
        listing.write_text("\n".join(phrases) + "\n", encoding="utf-8")
        # warmed with the pipeline the misses are timed on (no second copy of its sessions to load)
        built = build_phrase_cache(artifact, listing, Path(tmp) / "phrases.cache", params, pipeline=plain)
        cached = Pipeline(artifact, threads=threads, provider=provider, cache=built["path"])
        plain.synthesize(phrases[0], params)  # warm-up of both (sessions, allocators)
        cached.synthesize(phrases[0], params)
        miss, hit, diff = [], [], 0.0
        for text in phrases:
            t0 = time.perf_counter()
            [a] = plain.synthesize(text, params)
            t1 = time.perf_counter()
            [b] = cached.synthesize(text, params)
            t2 = time.perf_counter()
            if not b.cached:
                raise RuntimeError(f"phrase {text!r} missed the cache it was just warmed into")
            miss.append(t1 - t0)
            hit.append(t2 - t1)
            diff = max(diff, float(np.max(np.abs(a.wav - b.wav))) if a.wav.size else 0.0)
        cached.cache.cache.close()
    mean_miss, mean_hit = float(np.mean(miss)), float(np.mean(hit))
    mixed = hit_ratio * mean_hit + (1 - hit_ratio) * mean_miss
    log.info("phrase cache: hit %.1f ms vs miss %.1f ms (%.1f%%); at %.0f%% hits %.1f ms vs %.1f ms without a cache",
             1e3 * mean_hit, 1e3 * mean_miss, 100 * mean_hit / mean_miss, 100 * hit_ratio, 1e3 * mixed, 1e3 * mean_miss)
    return {
        "hit_ratio": hit_ratio,
        "phrases": len(phrases),
        "miss_seconds": percentiles(miss),
        "hit_seconds": percentiles(hit),
        "hit_over_miss": mean_hit / mean_miss if mean_miss else None,
        "mean_seconds_no_cache": mean_miss,
        "mean_seconds_at_hit_ratio": mixed,
        "speedup_at_hit_ratio": mean_miss / mixed if mixed else None,
        "max_abs_diff": diff,
        "cache_bytes": built["bytes"],
        "method": f"each phrase synthesized alone, miss (plain pipeline) then hit (phrase cache: Vocos only), "
                  f"seed {seed}, max_new_token {max_new_token}, {threads} threads; latency at hit ratio h = "
                  "h * mean(hit) + (1 - h) * mean(miss)",
    }
