#!/usr/bin/env bash
# What --memory-limit costs when the limit is far away: the tiny version at concurrency 8 for SECONDS,
# served without a limit (A) and with --memory-limit 4G (B), interleaved ROUNDS times; requests per run.
# From the repository root: docs/measurements/2026-12-05-xeon/ledger/ab_tiny.sh OUT SECONDS ROUNDS
set -euo pipefail
out=$1
secs=$2
rounds=$3
mkdir -p "$out"
F=.venv/bin/chattts-forge
TINY=${TINY:-artifacts/chattts-synthetic-tiny-seed0/v1}
one() {  # name, serve arguments...
    local name=$1
    shift
    $F serve --port 8911 --artifact "$TINY" "$@" >"$out/serve-$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 300); do curl -sf http://127.0.0.1:8911/readyz >/dev/null && break; sleep 0.5; done
    $F bench --url http://127.0.0.1:8911 --artifact "$TINY" --soak "$secs" --concurrency 8 --json "$out/$name.json" \
        >"$out/$name.txt" 2>&1 || true
    kill -TERM "$pid"
    wait "$pid" || true
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], d['requests'], d['lost_healthy'])" \
        "$out/$name.json" "$name" | tee -a "$out/summary.txt"
}
for r in $(seq "$rounds"); do
    one "A$r"
    one "B$r" --memory-limit 4G
done
