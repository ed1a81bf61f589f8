import sys, time
from chattts_forge.evaluate.latency import LatencyConfig, _Measured
from chattts_forge.runtime.memory_probe import measure_memory
from chattts_forge.calibration_data.corpus import load_corpus
art = sys.argv[1]
s = load_corpus("builtin:evaluation", max_sentences=8).sentences
cfg = LatencyConfig(progress=False)
t=time.perf_counter(); m=_Measured(art, cfg); print("load", time.perf_counter()-t)
t=time.perf_counter(); m.warm_up(s[0]); print("warmup", time.perf_counter()-t)
t=time.perf_counter(); m.engine.run([s[0]], cfg.request(0)); print("one sentence", time.perf_counter()-t)
t=time.perf_counter()
for i in range(3): m.time_first_audio(s[i], i)
print("first audio x3", time.perf_counter()-t)
for b in (1,4,8):
    t=time.perf_counter(); m.time_batch(s, b); print("batch", b, time.perf_counter()-t)
t=time.perf_counter(); measure_memory(art, s[0], 2); print("memory probe", time.perf_counter()-t)
