#!/bin/bash
# One probed soak (the tiny version unless ARTIFACT is set), from the repository root:
#   docs/measurements/2026-12-05-xeon/heap/probe_soak.sh NAME SECONDS [VAR=VALUE ...]
#   ARTIFACT=KV8 SERVE_ARGS="--cache KV8_CACHE" BENCH_ARGS="--phrase-cache KV8_CACHE" probe_soak.sh ...
# The server runs under heap_probe.py (RSS and glibc's mallinfo2 every 5 s into OUT/NAME/heap.jsonl;
# TRIM_EVERY=S: malloc_trim every S seconds, RSS after it recorded), with an empty XDG cache (a fresh
# host), and `bench --soak` at concurrency 8 writes OUT/NAME/soak.json. VAR=VALUE: the server's
# environment (MALLOC_ARENA_MAX=2, TRIM_EVERY=60). OUT defaults to /tmp/heap.
set -euo pipefail
name=$1 secs=$2
shift 2
port=$((8820 + RANDOM % 100))
d=${OUT:-/tmp/heap}/$name
rm -rf "$d"
mkdir -p "$d/xdg"
V=${ARTIFACT:-artifacts/chattts-synthetic-tiny-seed0/v1}
env "$@" XDG_CACHE_HOME="$d/xdg" PROBE_OUT="$d/heap.jsonl" .venv/bin/python "$(dirname "$0")/heap_probe.py" \
    --artifact "$V" --port $port --admin-loopback --memory-limit 4G ${SERVE_ARGS:-} >"$d/serve.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 1
done
.venv/bin/chattts-forge bench --url "http://127.0.0.1:$port" --artifact "$V" --soak "$secs" --concurrency 8 ${BENCH_ARGS:-} \
    --json "$d/soak.json" --plot "$d/soak.png" >"$d/soak.txt" 2>"$d/soak.progress"
kill -TERM $pid
wait $pid || true
