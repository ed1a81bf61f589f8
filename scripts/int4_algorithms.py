"""INT4 algorithms side by side at one block size: fidelity of the runtime graph and mel SNR.

    .venv/bin/python scripts/int4_algorithms.py FP32 CALIB OUT BLOCK FIDELITY_SENTENCES FIDELITY_STEPS rtn,importance
"""
import json
import sys
import time
from pathlib import Path

from chattts_forge.quantize import QuantizeConfig, quantize_artifact

fp32, calib, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
bs, fs, st = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
for algo in sys.argv[7].split(","):
    dst = out / f"int4-{algo}-{bs}"
    t0 = time.perf_counter()
    quantize_artifact(fp32, dst, QuantizeConfig("int4", calibration=calib if algo != "rtn" else None, algorithm=algo,
                                                block_size=bs, fidelity_sentences=fs, fidelity_steps=st, threads=2))
    f = json.loads((dst / "artifact.json").read_text())["fidelity"]
    src = f.get("gpt_fast") if (f.get("gpt_fast") or {}).get("teacher_forced") else f
    print(json.dumps({"algorithm": algo, "block": bs, "agreement": round(src["teacher_forced"]["top1_agreement"]["mean"], 4),
                      "cosine": round(src["hidden_cosine"]["mean"], 5), "mel_snr_db": round(f["mel"]["snr_db"], 2),
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
