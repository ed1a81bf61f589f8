"""Phrase-cache hit vs miss time over HTTP against `chattts-forge serve` (docs/measurements/*/serve.md).

    python scripts/serve_hit_miss.py http://127.0.0.1:8000 artifacts/<model>/<version>/phrase_cache.bin [N]

For each of the first N (default 5) phrases of the cache: one request with the server's defaults (a
hit when the cache was warmed with the defaults, as a build's is: served by Vocos alone) and one of
the same phrase with another seed (a miss, synthesized), both whole responses (`"stream": false`,
wav); prints the medians and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import time

import httpx

from chattts_forge.runtime.phrase_cache import PhraseCache


def timed(url: str, body: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/audio/speech", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.headers["x-forge-cached"]


def main() -> None:
    url, cache = sys.argv[1].rstrip("/"), sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    phrases = PhraseCache(cache).texts()[:count]
    hits, misses = [], []
    for phrase in phrases:
        body = {"model": "tts-1", "input": phrase, "response_format": "wav", "stream": False}
        hit, hit_cached = timed(url, body)
        miss, miss_cached = timed(url, {**body, "seed": 12345})
        if hit_cached != "true" or miss_cached != "false":
            raise SystemExit(f"{phrase!r}: expected a hit then a miss, got cached={hit_cached}, {miss_cached}")
        hits.append(hit)
        misses.append(miss)
    h, m = statistics.median(hits), statistics.median(misses)
    print(f"phrases {len(phrases)}; hit median {h * 1000:.1f} ms {[round(x * 1000, 1) for x in hits]}; "
          f"miss median {m * 1000:.1f} ms {[round(x * 1000, 1) for x in misses]}; hit/miss {h / m:.3f}")


if __name__ == "__main__":
    main()
