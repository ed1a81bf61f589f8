#!/bin/bash
# Issue 27 acceptance, on a QUIET machine: is the `auto` artifact built beside a CPU-bound job
# slower than all-INT8 (int8-dynamic from the same FP32)? Two interleaved timings, <= 5 minutes
# on 2 cores:
#   1. the runtime's batch-1 GPT decode step at context 200 (the step auto's search times), the two
#      artifacts interleaved round by round (chattts_forge.runtime.interleave) until the ratio's
#      90% interval is within +-0.02 or 60 s, with each one's bandwidth floor (bytes per step /
#      measured read bandwidth; docs/measurements/2026-12-01-xeon/floor.py, JSON kept in $OUTDIR);
#   2. whole `chattts-forge synth` processes with forced steps (EOS masked), A B B A ... rounds of
#      240 and 40 steps each; per step = (t240 - t40) / 200 per round (load and decode cancel),
#      ratio auto/int8 per round, median and 90% interval.
# Usage (repo root): docs/measurements/2026-12-01-xeon/quiet_check.sh [AUTO_DIR] [INT8_DIR] [ROUNDS]
# Env: PY (python with chattts_forge; default .venv/bin/python), THREADS (2).
set -euo pipefail
AUTO=${1:-/tmp/speed-full/auto}
INT8=${2:-/tmp/speed-full/int8-dynamic}
ROUNDS=${3:-4}
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-2}
FLOOR=${FLOOR:-docs/measurements/2026-12-01-xeon/floor.py}
OUTDIR=${OUTDIR:-$(mktemp -d /tmp/speed-quiet-XXXXXX)}; mkdir -p "$OUTDIR"
for d in "$AUTO" "$INT8"; do
  [ -f "$d/artifact.json" ] || { echo "speed-quiet-check: $d is not an artifact folder" >&2; exit 2; }
done
echo "date $(date -u +%FT%TZ); loadavg before: $(cut -d' ' -f1-3 /proc/loadavg); nproc $(nproc)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
timeout 100 "$PY" "$FLOOR" "$INT8" "$AUTO" --threads "$THREADS" > "$OUTDIR/floor.json"
echo "[1] floor and interleaved step: $OUTDIR/floor.json"
timeout 190 "$PY" - "$AUTO" "$INT8" "$ROUNDS" "$THREADS" "$OUTDIR/floor.json" <<'EOF'
import json, os, subprocess, sys, tempfile, time
from pathlib import Path

from chattts_forge.runtime.interleave import median_interval

auto, int8, rounds, threads = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    auto_meta = json.loads((auto / "artifact.json").read_text())
    final = ((auto_meta.get("quantization") or {}).get("auto") or {}).get("final_timing") or {}
    print("auto shipped:", final.get("chosen"), "| its build-time decision:", final.get("decision"))
except (OSError, ValueError):
    pass

# 1. decode steps, interleaved, and the floor (floor.py's JSON)
floor = json.loads(Path(sys.argv[5]).read_text())
c = floor["comparison"]["candidates"][auto.name]
print(f"[1] GPT step b1 ctx200: auto {c['step_ms']:.3f} ms, int8-dynamic {c['reference_step_ms']:.3f} ms, "
      f"ratio {c['ratio']:.3f} [90% {c['low']:.3f}-{c['high']:.3f}], {c['rounds']} rounds "
      f"({floor['comparison']['stopped']}); load {floor['loadavg_before'][0]:.2f}")
for name, v in floor["variants"].items():
    print(f"    {name}: {v['total_bytes'] / 1e6:.1f} MB/step, floor {v['floor_ms']:.3f} ms at "
          f"{floor['read_bandwidth']['used_gb_per_s']} GB/s, step {v['step_ms']:.3f} ms = {v['ratio_to_floor']}x floor")

# 2. whole synth processes with forced steps, interleaved
forge = str(Path(sys.executable).with_name("chattts-forge"))
out = Path(tempfile.mkdtemp(prefix="speed-quiet-"))


def synth(folder: Path, n: int) -> float:
    cmd = [forge, "synth", "--artifact", str(folder), "--text", "今天天气很好，我们一起去公园散步吧。", "--seed", "0",
           "--no-refine", "--min-new-token", str(n), "--max-new-token", str(n), "--threads", str(threads),
           "--out", str(out / "x.wav")]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "CHATTTS_FORGE_AUTOTUNE": "0"})
    return time.perf_counter() - t0


for folder in (int8, auto):  # warm the page cache once each
    synth(folder, 40)
per_step = {"auto": [], "int8-dynamic": []}
ratios = []
for r in range(rounds):
    order = [("int8-dynamic", int8), ("auto", auto)]
    if r % 2:
        order.reverse()
    t = {}
    for name, folder in order:
        runs = {n: synth(folder, n) for n in ((240, 40) if r % 2 == 0 else (40, 240))}
        t[name] = (runs[240] - runs[40]) / 200
    for name in t:
        per_step[name].append(t[name] * 1e3)
    ratios.append(t["auto"] / t["int8-dynamic"])
    print(f"    round {r + 1}: auto {t['auto'] * 1e3:.2f} ms/step, int8-dynamic {t['int8-dynamic'] * 1e3:.2f} ms/step")
mid, lo, hi = median_interval(ratios)
med = {k: median_interval(v)[0] for k, v in per_step.items()}
print(f"[2] synth (240 - 40 forced steps) / 200: auto {med['auto']:.2f} ms/step, int8-dynamic "
      f"{med['int8-dynamic']:.2f} ms/step, ratio {mid:.3f} [90% {lo:.3f}-{hi:.3f}] over {rounds} interleaved rounds")
slower = c["low"] > 1.0
print("verdict:", "auto is SLOWER than int8-dynamic beyond the noise (step interval above 1)" if slower else
      "auto is not slower than int8-dynamic (step ratio interval reaches or is below 1)")
EOF
echo "loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
