#!/usr/bin/env bash
# First audio and throughput of the default stream (the artifact's recorded look-ahead, first chunk
# first) against the exact stream without priority (the stream before issue 52), interleaved: two
# servers of ARTIFACT (default / --no-first-chunk-priority), then per round and arm
# `bench --load --url` at concurrency 1 and 8 (HTTP first, then in-process, the same plan). Usage:
#   scripts/bench_first_audio.sh ARTIFACT OUT_DIR [ROUNDS]
# (docs/measurements/2026-12-06-first-audio; summary: scripts/first_audio_table.py OUT_DIR)
set -euo pipefail
artifact=$1 out=$2 rounds=${3:-2}
forge=${FORGE:-.venv/bin/chattts-forge}
mkdir -p "$out"
serve() {  # port, extra options...
  local port=$1; shift
  "$forge" serve --artifact "$artifact" --port "$port" --threads 2 --admin-loopback "$@" >"$out/serve-$port.log" 2>&1 &
  echo $!
}
new_pid=$(serve 8561) old_pid=$(serve 8562 --no-first-chunk-priority)
trap 'kill $new_pid $old_pid 2>/dev/null || true' EXIT
for port in 8561 8562; do
  for _ in $(seq 300); do curl -sf "localhost:$port/readyz" >/dev/null && break; sleep 1; done
done
run() {  # name, concurrency, requests, options...
  local name=$1 c=$2 n=$3; shift 3
  echo "== $name: concurrency $c, $n requests, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$forge" bench --artifact "$artifact" --load --concurrency "$c" --requests "$n" --threads 2 "$@" \
    --json "$out/$name.json" >"$out/$name.txt"
}
for r in $(seq "$rounds"); do
  run "default-c1-r$r" 1 8 --url http://127.0.0.1:8561
  run "exact-c1-r$r" 1 8 --url http://127.0.0.1:8562 --stream-lookahead exact --no-first-chunk-priority
  run "exact-c8-r$r" 8 32 --url http://127.0.0.1:8562 --stream-lookahead exact --no-first-chunk-priority
  run "default-c8-r$r" 8 32 --url http://127.0.0.1:8561
done
