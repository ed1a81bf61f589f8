"""Where the continuous-batching scheduler's time goes in an in-process closed-loop replay: GPT steps by
batch size, Decoder + Vocos decodes, prefills; first audio split into the opening burst and the rest.
Usage: python where_time_goes.py ARTIFACT LOOKAHEAD(exact|N) CONCURRENCY REQUESTS [on|off: first-chunk priority]"""

import collections
import json
import sys
import time

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

art, look, c, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lookahead = None if look == "exact" else int(look)
priority = (sys.argv[5] if len(sys.argv) > 5 else "on") == "on"
pipe = Pipeline(art, threads=2, engine="fast")
reqs = corpus_requests("builtin:evaluation", n, 0)
plan = plan_requests(reqs, 0)
total: dict[str, float] = collections.defaultdict(float)
count: collections.Counter[str] = collections.Counter()


def timed(f, key):
    def run(self, *a, **k):
        t = time.perf_counter()
        try:
            return f(self, *a, **k)
        finally:
            name = key(self)
            total[name] += time.perf_counter() - t
            count[name] += 1
    return run


S.Scheduler._gpt_step = timed(S.Scheduler._gpt_step, lambda s: f"gpt step, {len(s._active)} rows")
S.Scheduler._decode = timed(S.Scheduler._decode, lambda s: "decode (Decoder + Vocos)")
S.Scheduler._prefill_request = timed(S.Scheduler._prefill_request, lambda s: "prefill")
pipe.synthesize([reqs[0][0]], _warm_params())
total.clear()
count.clear()
with quiet_logger():
    out, wall, steps = replay(pipe, plan, c, Arrival(), lookahead, None, None, priority)
s = summarize(out, wall, steps, c, pipe.sample_rate, None)
print(json.dumps({k: s[k] for k in ("first_audio_s", "first_audio_s_running", "sentences_per_s")}))
print(f"wall {wall:.2f} s, {steps} batched steps, mean request {np.mean([r[1] for r in reqs]):.0f} steps")
for k in sorted(total):
    print(f"{k:26s} n={count[k]:5d} total={total[k]:7.2f} s mean={1000 * total[k] / count[k]:7.1f} ms")
