"""What a warm phrase cache does to latency: the report's ``phrase_cache`` section.

`measure_cache_effect(artifact, phrases, hit_ratio=0.6)` synthesizes each phrase with the plain
pipeline (a miss: code stage + Decoder + Vocos), makes a phrase cache of them from those misses'
code stage output (the entries `runtime.phrase_cache_build.build_phrase_cache` writes: the same request,
so the same codes; in a temporary file, so the code stage does not run twice), then synthesizes each
with the cached pipeline (a hit: Vocos only), same speaker and seed, and checks the two waveforms
agree. The latency a service sees at a hit ratio h
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
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.phrase_cache import cache_knobs, check_cacheable, payload_sha256, write_cache
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
    from chattts_forge.runtime.phrase_cache_build import cached_phrase

    plain = Pipeline(artifact, threads=threads, provider=provider)
    params = SynthParams(code=InferCodeParams(spk_emb=plain.random_speaker(seed), seed=seed, max_new_token=max_new_token))
    check_cacheable(params)
    plain.synthesize(phrases[0], params)  # warm-up (sessions, allocators)
    miss, misses = [], []
    for text in phrases:  # the misses first: their code stage's output is what the cache stores
        t0 = time.perf_counter()
        [a] = plain.synthesize(text, params)
        miss.append(time.perf_counter() - t0)
        misses.append(a)
    variant, payload = str(plain.artifact.variant), payload_sha256(artifact)
    entries = {}  # normalised text -> entry: what build_phrase_cache stores for it, from the miss
    for text, a in zip(phrases, misses, strict=True):
        norm = plain.normalize(text, params)
        entries.setdefault(norm, (norm, variant, payload,
                                  cached_phrase(plain, norm, a.text, a.codes, a.hiddens, params.use_decoder)))
    with tempfile.TemporaryDirectory(prefix="forge-phrases-") as tmp:
        path = write_cache(Path(tmp) / "phrases.cache", cache_knobs(params, plain.num_vq), {variant: payload},
                           list(entries.values()))
        cache_bytes = path.stat().st_size
        cached = Pipeline(artifact, threads=threads, provider=provider, cache=path)
        cached.synthesize(phrases[0], params)  # warm-up of the cached pipeline
        hit, diff = [], 0.0
        for text, a in zip(phrases, misses, strict=True):
            t0 = time.perf_counter()
            [b] = cached.synthesize(text, params)
            hit.append(time.perf_counter() - t0)
            if not b.cached:
                raise RuntimeError(f"phrase {text!r} missed the cache it was just warmed into")
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
        "cache_bytes": cache_bytes,
        "method": f"each phrase synthesized alone: every miss (plain pipeline; the cache made of their code stage's "
                  "output, as build_phrase_cache makes it), then every hit (phrase cache: Vocos only), "
                  f"seed {seed}, max_new_token {max_new_token}, {threads} threads; latency at hit ratio h = "
                  "h * mean(hit) + (1 - h) * mean(miss)",
    }
