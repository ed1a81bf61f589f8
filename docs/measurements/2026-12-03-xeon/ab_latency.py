"""A/B of the latency lever: every variant timed against fp32 on its own (`measure_against`, what each
evaluation did) and all of them in the same rounds (`measure_against_many`, the build's latency run),
one arm after the other. Prints each arm's wall seconds, its CPU seconds (this process and its
children: the memory probes; less moved by other load on the machine than wall time) and the ratios;
writes them to ab_latency.json. BATCHES (default 1,4,8): the throughput batch sizes.

    python ab_latency.py ARTIFACT_FP32 SENTENCES NAME=ARTIFACT [NAME=ARTIFACT ...] [--batch 1,4]
"""
import json
import resource
import sys
import time

from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.evaluate import latency as L

args = sys.argv[1:]
batches = (1, 4, 8)
if "--batch" in args:
    k = args.index("--batch")
    batches = tuple(int(b) for b in args[k + 1].split(","))
    del args[k:k + 2]
ref, n = args[0], int(args[1])
artifacts = dict(a.split("=", 1) for a in args[2:])
sentences = load_corpus("builtin:evaluation", max_sentences=n).sentences
cfg = L.LatencyConfig(progress=False, batch_sizes=batches)
out = {}


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


for arm in ("separate", "shared"):
    t0, c0 = time.perf_counter(), cpu_seconds()
    if arm == "separate":
        pairs = {k: L.measure_against(v, ref, sentences, cfg) for k, v in artifacts.items()}
    else:
        pairs = L.measure_against_many(artifacts, ref, sentences, cfg)
    out[arm] = {"seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(cpu_seconds() - c0, 1),
                "ratios": {k: {x: p.ratio[x] for x in ("ratio", "low", "high", "rounds", "stopped")}
                           for k, p in pairs.items()}}
    print(arm, json.dumps(out[arm]), flush=True)
with open("ab_latency.json", "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
