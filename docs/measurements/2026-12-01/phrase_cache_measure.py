"""Phrase cache hit vs miss, in-process: python phrase_cache_measure.py ARTIFACT N_PHRASES MAX_NEW_TOKEN.

The first N shipped customer-service phrases through `chattts_forge.evaluate.serving.measure_cache_effect`
(the evaluate report's `phrase_cache` section: warm, then each phrase as a miss and as a hit, 2 threads,
seed 0); prints its JSON. phrase_cache_full_fp32.json beside this file was written by this script's
first version, which timed the same miss/hit loop itself with no speaker and per-phrase rows (see git
history); its figures are what the README quotes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from chattts_forge.calibration_data.phrases import shipped_phrases
from chattts_forge.evaluate.serving import measure_cache_effect
from chattts_forge.log import quiet_logger


def main() -> None:
    art, n, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with quiet_logger():
        section = measure_cache_effect(art, shipped_phrases()[:n], max_new_token=steps, threads=2)
    print(json.dumps({"artifact": str(art), **section}, indent=1))


if __name__ == "__main__":
    main()
