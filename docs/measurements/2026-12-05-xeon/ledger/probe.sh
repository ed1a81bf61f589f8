#!/usr/bin/env bash
# The memory run (`run.sh memory OUT SECONDS`, 16 clients, --memory-limit 0.9x the capacity run's peak) with
# the server's resident memory by kind of mapping sampled every 5 s (smaps_groups.py -> OUT/smaps.jsonl).
# From the repository root: KV8=... KV8_CACHE=... docs/measurements/2026-12-05-xeon/ledger/probe.sh OUT SECONDS
# (OUT holds the capacity run's capacity.json).
set -euo pipefail
out=$1
secs=$2
here=$(dirname "$0")
"$here/../run.sh" memory "$out" "$secs" &
run=$!
while [ ! -s "$out/serve-memory.pid" ]; do sleep 0.2; done
pid=$(cat "$out/serve-memory.pid")
while kill -0 "$run" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do
    python3 "$here/smaps_groups.py" "$pid" "$(curl -s http://127.0.0.1:8905/metrics | grep -E '^forge_(stage_depth|memory_(reserved|floor)_bytes)' | tr '\n' ' ')" >>"$out/smaps.jsonl" 2>/dev/null || true
    sleep 5
done
wait "$run"
