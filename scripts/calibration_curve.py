"""The calibration-size curve: fidelity of the calibrated variants against the number of calibration sentences.

    .venv/bin/python scripts/calibration_curve.py FP32_ARTIFACT OUT_DIR [--sizes 8,32,128,500] [--preset tiny]

For each size: `calibrate` (time and peak RSS measured in a child process, as the CLI runs it), then
static INT8, dynamic INT8 with an INT8 KV cache (kv8), INT4 GPTQ and importance, and auto quantized from it; prints
and writes (OUT_DIR/curve.json) each variant's teacher-forced top-1 agreement, hidden-state cosine
and mel SNR from quantize's fidelity record (held-out evaluation split, same settings for every size).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

TINY_CALIBRATE = ["--max-new-token", "48"]
TINY_QUANTIZE = {"fidelity_sentences": 4, "fidelity_steps": 32, "block_size": 32}
VARIANTS = {
    "int8-static": {"method": "static"},
    "int8-dynamic-kv8": {"method": "dynamic", "kv_cache": "int8"},
    "int4-gptq": {"method": "int4", "algorithm": "gptq"},
    "int4-importance": {"method": "int4", "algorithm": "importance"},
    "auto": {"method": "auto"},
}


def _calibrate(fp32: Path, out: Path, size: int | str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "chattts_forge.cli", "calibrate", "--artifact", str(fp32), "--out", str(out),
           "--max-samples", str(size), "--threads", "2", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far (KiB)
    m = json.loads((out / "manifest.json").read_text())
    disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"sentences": m["sentences"]["used"], "seconds": round(seconds, 1),
            "peak_rss_mb": round(max(after, before) / 1024, 1) if after > before else None,
            "manifest_peak_rss_mb": round(m["run"]["peak_rss_bytes"] / 2**20, 1), "disk_mb": round(disk / 2**20, 2)}


def _fidelity(meta: dict) -> dict:
    f = meta["fidelity"]
    fast = f.get("gpt_fast") or {}
    src = fast if fast.get("teacher_forced") else f  # the graph the runtime runs
    return {"agreement": round(src["teacher_forced"]["top1_agreement"]["mean"], 4),
            "cosine": round(src["hidden_cosine"]["mean"], 5),
            "mel_snr_db": round(f["mel"]["snr_db"], 2)}


def main() -> None:
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact
    from chattts_forge.quantize.config import options_read_by

    ap = argparse.ArgumentParser()
    ap.add_argument("fp32", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", default="8,32,128,500")
    ap.add_argument("--preset", default="tiny", choices=["tiny", "full"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    extra_cal = TINY_CALIBRATE if args.preset == "tiny" else []
    qargs = TINY_QUANTIZE if args.preset == "tiny" else {}
    rows = []
    for size in args.sizes.split(","):
        calib = args.out / f"calib-{size}"
        row = {"size": size, "calibrate": _calibrate(args.fp32, calib, size, extra_cal), "variants": {}}
        for name, opts in VARIANTS.items():
            dst = args.out / f"{name}-{size}"
            t0 = time.perf_counter()
            config = QuantizeConfig(calibration=calib, threads=2, **opts, **options_read_by(opts["method"], qargs))
            quantize_artifact(args.fp32, dst, config)
            meta = json.loads((dst / "artifact.json").read_text())
            row["variants"][name] = {**_fidelity(meta), "quantize_seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "curve.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
