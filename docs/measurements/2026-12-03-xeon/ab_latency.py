"""A/B: each variant timed against fp32 on its own (measure_against, per evaluation before) vs all in
the same rounds (measure_against_many, the latency run). Wall seconds of each arm, and the ratios."""
import json, sys, time
from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.evaluate import latency as L
ref, n = sys.argv[1], int(sys.argv[2])
arts = dict(a.split("=", 1) for a in sys.argv[3:])
s = load_corpus("builtin:evaluation", max_sentences=n).sentences
cfg = L.LatencyConfig(progress=False, batch_sizes=(1, 4, 8))
out = {}
for arm in ("separate", "shared"):
    t = time.perf_counter()
    if arm == "separate":
        pairs = {k: L.measure_against(v, ref, s, cfg) for k, v in arts.items()}
    else:
        pairs = L.measure_against_many(arts, ref, s, cfg)
    out[arm] = {"seconds": round(time.perf_counter() - t, 1),
                "ratios": {k: {x: p.ratio[x] for x in ("ratio", "low", "high", "rounds", "stopped")} for k, p in pairs.items()}}
    print(arm, json.dumps(out[arm]), flush=True)
json.dump(out, open(sys.argv[0] + ".json", "w"), indent=1)
