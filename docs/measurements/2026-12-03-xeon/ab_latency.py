"""A/B of the latency lever: every variant timed against fp32 on its own (`measure_against`, what each
evaluation did) and all of them in the same rounds (`measure_against_many`, the build's latency run),
one arm after the other. Prints each arm's wall seconds and ratios; writes them to ab_latency.json.

    python ab_latency.py ARTIFACT_FP32 SENTENCES NAME=ARTIFACT [NAME=ARTIFACT ...]
"""
import json
import sys
import time

from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.evaluate import latency as L

ref, n = sys.argv[1], int(sys.argv[2])
artifacts = dict(a.split("=", 1) for a in sys.argv[3:])
sentences = load_corpus("builtin:evaluation", max_sentences=n).sentences
cfg = L.LatencyConfig(progress=False)
out = {}
for arm in ("separate", "shared"):
    t0 = time.perf_counter()
    if arm == "separate":
        pairs = {k: L.measure_against(v, ref, sentences, cfg) for k, v in artifacts.items()}
    else:
        pairs = L.measure_against_many(artifacts, ref, sentences, cfg)
    out[arm] = {"seconds": round(time.perf_counter() - t0, 1),
                "ratios": {k: {x: p.ratio[x] for x in ("ratio", "low", "high", "rounds", "stopped")}
                           for k, p in pairs.items()}}
    print(arm, json.dumps(out[arm]), flush=True)
with open("ab_latency.json", "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
