"""fp32 judged against itself: fidelity with the plain graphs replayed (before) and with the FP32
recording taken as the replay (after, ReplaySessions.same_plain). Same record to the bit? Seconds of
each arm, alternated (before, after, before, after).

    python self_fidelity.py ARTIFACT_FP32 SENTENCES STEPS
"""
import json
import sys
import time

from chattts_forge.quantize import fidelity as F

art, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
corpus = F.load_corpus("builtin:evaluation")
runs = F.record_trajectories(F.Path(art), corpus, n, steps, 0, 2, progress=False)
seconds: dict[str, list[float]] = {"before": [], "after": []}
records = {}
for arm in ("before", "after", "before", "after"):
    sessions = F.ReplaySessions(art, art, 2)
    sessions.same_plain = arm == "after"
    t0 = time.perf_counter()
    record = F.summarize_fidelity(F.Path(art), corpus, [sessions.compare(t) for t in runs], {})
    record["per_tensor"] = sessions.tensor_table(runs, 8, False)
    seconds[arm].append(round(time.perf_counter() - t0, 2))
    records[arm] = json.dumps(record, sort_keys=True)
print(json.dumps({"identical_records": records["before"] == records["after"], "seconds": seconds}))
