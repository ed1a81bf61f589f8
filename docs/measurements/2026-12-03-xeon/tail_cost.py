"""What the FP32 reference's latency tail costs against one sentence: load, warm-up, one sentence,
first audio x3, throughput at batch 1/4/8, the fresh-process memory probe (seconds, in that order).

    python tail_cost.py ARTIFACT_FP32
"""
import sys
import time

from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.evaluate.latency import LatencyConfig, _Measured
from chattts_forge.runtime.memory_probe import measure_memory


def timed(label: str, call) -> None:
    t0 = time.perf_counter()
    call()
    print(label, round(time.perf_counter() - t0, 1), flush=True)


art = sys.argv[1]
sentences = load_corpus("builtin:evaluation", max_sentences=8).sentences
cfg = LatencyConfig(progress=False)
side: list[_Measured] = []
timed("load", lambda: side.append(_Measured(art, cfg)))
m = side[0]
timed("warmup", lambda: m.warm_up(sentences[0]))
timed("one sentence", lambda: m.engine.run([sentences[0]], cfg.request(0)))
timed("first audio x3", lambda: [m.time_first_audio(sentences[i], i) for i in range(3)])
for b in (1, 4, 8):
    timed(f"batch {b}", lambda b=b: m.time_batch(sentences, b))
timed("memory probe", lambda: measure_memory(art, sentences[0], 2))
