#!/usr/bin/env bash
# The GPU measurement, prepared to run once on a machine with an NVIDIA GPU (make gpu-bench).
#
# 1. builds the GPU environment (make env GPU=1: onnxruntime-gpu alone, CUDA 13 runtime wheels),
# 2. synthesizes the full-size checkpoint (seed 0) and converts it (fp32 + fused GPT, fp16),
#    quantizes dynamic INT8,
# 3. runs `bench --provider cuda` on fp32, fp16 and int8-dynamic at batch 1/4/8 against ChatTTS's
#    PyTorch pipeline on CUDA in the same run, one JSON per artifact.
#
# Budget: under 10 minutes on an H200 machine (16 cores) once the packages are reachable; every step
# prints its wall time. Output: $OUT_DIR (default build/gpu-bench), plus nvidia-smi and the
# provider probe, so a failed run still says why.
#   OUT_DIR=/path VENV=.venv-gpu STEPS=422 REPS=2 bash scripts/gpu-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-build/gpu-bench}
VENV=${VENV:-.venv-gpu}
STEPS=${STEPS:-422}
REPS=${REPS:-2}
BATCHES=${BATCHES:-1,4,8}
THREADS=${THREADS:-4}
mkdir -p "$OUT_DIR"
log() { printf '%s gpu-bench: %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT_DIR/gpu-bench.log" >&2; }
timed() { local name=$1; shift; local t0=$SECONDS; "$@"; log "$name: $((SECONDS - t0)) s"; }

{ nvidia-smi || true; } > "$OUT_DIR/nvidia-smi.txt" 2>&1
log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi unavailable')"

timed "environment" make env GPU=1 VENV="$VENV"
PY="$VENV/bin/python"
FORGE="$VENV/bin/chattts-forge"
"$PY" - > "$OUT_DIR/providers.json" <<'EOF'
import json, onnxruntime as ort, torch
from chattts_forge.runtime.providers import cuda_status
usable, why = cuda_status()
print(json.dumps({"onnxruntime": ort.__version__, "available": ort.get_available_providers(),
                  "cuda_usable": usable, "why": why, "torch": torch.__version__,
                  "torch_cuda": torch.cuda.is_available(),
                  "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
EOF
log "providers: $(cat "$OUT_DIR/providers.json")"

WORK="$OUT_DIR/work"
CKPT="$WORK/checkpoint"
[ -f "$CKPT/chattts_forge_synthetic.json" ] || timed "checkpoint" "$FORGE" checkpoint synthesize --preset full --seed 0 --out "$CKPT"
[ -d "$WORK/convert/fp32" ] || timed "convert" "$FORGE" convert --checkpoint "$CKPT" --out "$WORK/convert" --precision all
[ -d "$WORK/int8-dynamic" ] || timed "quantize int8-dynamic" "$FORGE" quantize --artifact "$WORK/convert/fp32" --method dynamic --out "$WORK/int8-dynamic" --fidelity-sentences 2 --fidelity-steps 16

for variant in fp32 fp16 int8-dynamic; do
  dir="$WORK/convert/$variant"; [ -d "$dir" ] || dir="$WORK/$variant"
  timed "bench $variant" "$FORGE" bench --artifact "$dir" --provider cuda --baseline pytorch --baseline-device cuda \
    --checkpoint "$CKPT" --batch "$BATCHES" --steps "$STEPS" --reps "$REPS" --threads "$THREADS" \
    --json "$OUT_DIR/bench-gpu-$variant.json" | tee "$OUT_DIR/bench-gpu-$variant.txt"
done
log "done: $(ls "$OUT_DIR"/bench-gpu-*.json | tr '\n' ' ')"
