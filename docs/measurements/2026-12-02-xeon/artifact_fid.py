"""Real quantized artifacts, their fidelity on one set of FP32 trajectories (recorded once).

    python artifact_fid.py FP32 CALIB OUT 'name=method[,key=value...]' ...

e.g. 'static=static' 'dyn=dynamic' 'rtn128=int4,algorithm=rtn' 'imp128=int4,algorithm=importance'.
The trajectories are the quantize stage's default fidelity run (8 held-out sentences x 48 steps,
seed 0), so the figures equal what `quantize` records, without recording the FP32 runs per artifact.
"""
import json
import pickle
import sys
import time
from pathlib import Path

from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.quantize import QuantizeConfig, quantize_artifact
from chattts_forge.quantize.fidelity import measure_fidelity, record_trajectories

fp32, calib, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
traj_file = out / "trajectories.pkl"
if traj_file.exists():
    trajs = pickle.loads(traj_file.read_bytes())
else:
    trajs = record_trajectories(fp32, load_corpus("builtin:evaluation"), 8, 48, 0, 2)
    traj_file.write_bytes(pickle.dumps(trajs))
for spec in sys.argv[4:]:
    name, rest = spec.split("=", 1)
    method, *kvs = rest.split(",")
    kw = {}
    for kv in kvs:
        k, v = kv.split("=")
        kw[k] = (int(v) if v.isdigit() else float(v) if v.replace(".", "").isdigit()
                 else {"True": True, "False": False}.get(v, v))
    dst = out / name
    t0 = time.perf_counter()
    if not (dst / "artifact.json").exists():
        cal = None if kw.get("algorithm") == "rtn" or method == "dynamic" and kw.get("kv_cache") != "int8" else calib
        quantize_artifact(fp32, dst, QuantizeConfig(method, calibration=cal, fidelity=False, threads=2, **kw))
    tq = time.perf_counter() - t0
    f = measure_fidelity(fp32, dst, trajectories=trajs, per_tensor=False, threads=2)
    fast = (f.get("gpt_fast") or {}).get("teacher_forced")
    row = {"name": name, "method": method, **kw,
           "agreement": round(f["teacher_forced"]["top1_agreement"]["mean"], 4),
           "agreement_fast": round(fast["top1_agreement"]["mean"], 4) if fast else None,
           "cosine": round(f["hidden_cosine"]["mean"], 5),
           "cosine_fast": round(f["gpt_fast"]["hidden_cosine"]["mean"], 5) if fast else None,
           "mel_snr_db": round(f["mel"]["snr_db"], 2), "steps": f["teacher_forced"]["steps"],
           "quantize_s": round(tq, 1), "fidelity_s": round(time.perf_counter() - t0 - tq, 1)}
    print(json.dumps(row), flush=True)
    with open(out / "results.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
