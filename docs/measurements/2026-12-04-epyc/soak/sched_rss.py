"""RSS of a Scheduler over many mixed-length requests at concurrency 8: which native part grows?"""
import sys
import threading
import time

import onnxruntime as ort
from rss_now import rss

mode = sys.argv[2]
orig = ort.SessionOptions
def patched():
    o = orig()
    if "nopattern" in mode:
        o.enable_mem_pattern = False
    if "noarena" in mode:
        o.enable_cpu_mem_arena = False
    return o
ort.SessionOptions = patched

from chattts_forge.evaluate.load_bench import corpus_requests  # noqa: E402 - after the patch
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, SynthParams  # noqa: E402 - after the patch
from chattts_forge.runtime.scheduler import Scheduler  # noqa: E402 - after the patch

pipe = Pipeline(sys.argv[1], threads=1)
sched = Scheduler(pipe, max_batch=8, max_queue=64).start()
reqs = corpus_requests("builtin:evaluation", 64, 0)
n_total = int(sys.argv[3])
sem = threading.Semaphore(8)
done = [0]
def one(i):
    text, steps = reqs[i % len(reqs)]
    steps = min(steps, 430)
    p = SynthParams(code=InferCodeParams(seed=i % 1000, max_new_token=steps, min_new_token=steps), refine=None)
    try:
        h = sched.submit(text, p)
        h.result(timeout=600)
    finally:
        done[0] += 1
        sem.release()
t0 = time.time()
print("start", round(rss()), flush=True)
for i in range(n_total):
    sem.acquire()
    threading.Thread(target=one, args=(i,), daemon=True).start()
    if i % 100 == 99:
        print(i + 1, round(rss()), round(time.time() - t0), flush=True)
while done[0] < n_total:
    time.sleep(0.1)
print("end", round(rss()), flush=True)
sched.close()
