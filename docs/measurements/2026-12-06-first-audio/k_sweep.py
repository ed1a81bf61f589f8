"""Sentences/s and first audio at concurrency 8 in-process when the rows still waiting for their first
chunk run alone one GPT step in k (k = 0: never; the chunk reordering stays), arms interleaved per round.
Usage: python k_sweep.py ARTIFACT REQUESTS ROUNDS K[,K...]   (e.g. KV8 32 2 0,2,3)"""

import sys

import numpy as np

from chattts_forge.evaluate.load_bench import (
    Arrival,
    _warm_params,
    corpus_requests,
    plan_requests,
    replay,
    summarize,
)
from chattts_forge.log import quiet_logger
from chattts_forge.runtime import scheduler as S
from chattts_forge.runtime.pipeline import Pipeline

art, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ks = [int(k) for k in sys.argv[4].split(",")]
pipe = Pipeline(art, threads=2, engine="fast")
plan = plan_requests(corpus_requests("builtin:evaluation", n, 0), 0)
pipe.synthesize([plan[0].text], _warm_params())
every = {"k": 3}


def first_rows(self: S.Scheduler) -> int:
    k = every["k"]
    if k == 0 or self.steps % k != k - 1:
        return 0
    return next((i for i, act in enumerate(self._active) if act.asked == 0), 0)


S.Scheduler._first_rows = first_rows
rows: dict[int, list[tuple[float, ...]]] = {}
for r in range(rounds):
    for k in ks[r % len(ks):] + ks[: r % len(ks)]:
        every["k"] = k
        with quiet_logger():
            out, wall, steps = replay(pipe, plan, 8, Arrival(), pipe.default_lookahead, None, None, True)
        s = summarize(out, wall, steps, 8, pipe.sample_rate, None)
        fa, run = s["first_audio_s"], s["first_audio_s_running"]
        rows.setdefault(k, []).append((s["sentences_per_s"], fa["p50"], fa["p95"], run["p50"], run["p95"]))
        print(k, [round(x, 3) for x in rows[k][-1]], flush=True)
for k, v in rows.items():
    med = np.median(np.array(v), axis=0)
    print(f"k {k}: sentences/s {med[0]:.3f}, first audio p50/p95 {med[1]:.2f}/{med[2]:.2f}, running {med[3]:.2f}/{med[4]:.2f}")
