#!/usr/bin/env bash
# This session's serve runs (issue 37), one after another on a quiet machine, from the repository root:
#   docs/measurements/2026-12-05-xeon/run.sh STEP OUT [ARGS]
# STEP: tiny SECONDS (the tiny version at concurrency 8, a reload at half time) | capacity SECONDS
# (full int8-dynamic-kv8 at concurrency 8 with its phrase cache: the at-capacity p99 and request rate) |
# overload SECONDS MAX_QUEUE [MAX_BATCH] (open-loop at twice capacity's rate, clients honouring
# Retry-After until admitted) | reloads SECONDS EVERY (the tiny version, a reload every EVERY seconds) |
# memory SECONDS (16 clients, --memory-limit 0.9x capacity's peak RSS).
# TINY, KV8 and KV8_CACHE name the inputs (as docs/measurements/2026-12-04-epyc/soak/run_soaks.sh).
set -euo pipefail
step=$1
out=$2
shift 2
mkdir -p "$out"
F=.venv/bin/chattts-forge
here=$(dirname "$0")
TINY=${TINY:-artifacts/chattts-synthetic-tiny-seed0/v1}

serve() {  # name, port, serve arguments...: start, wait for /readyz
    local name=$1 port=$2
    shift 2
    $F serve --port "$port" --admin-loopback "$@" >"$out/serve-$name.log" 2>&1 &
    echo $! >"$out/serve-$name.pid"
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
        sleep 1
    done
    echo "server on $port not ready" >&2
    return 1
}

stop() {  # name
    kill -TERM "$(cat "$out/serve-$1.pid")"
    wait "$(cat "$out/serve-$1.pid")" || true
}

soak() {  # name, port, bench arguments...
    local name=$1 port=$2
    shift 2
    local rc=0
    $F bench --url "http://127.0.0.1:$port" --json "$out/$name.json" --plot "$out/$name.png" "$@" \
        >"$out/$name.txt" 2>"$out/$name.progress" || rc=$?
    echo "$name: exit $rc" >>"$out/$name.txt"
}

case $step in
tiny)
    serve tiny 8901 --artifact "$TINY" --memory-limit 4G
    soak tiny 8901 --artifact "$TINY" --soak "$1" --concurrency 8 --reload-every $(($1 / 2))
    stop tiny
    ;;
reloads)
    serve reloads 8902 --artifact "$TINY"
    soak reloads 8902 --artifact "$TINY" --soak "$1" --concurrency 8 --reload-every "$2"
    stop reloads
    ;;
capacity)
    : "${KV8:?the full-size int8-dynamic-kv8 variant folder}" "${KV8_CACHE:?its phrase cache}"
    serve capacity 8903 --artifact "$KV8" --cache "$KV8_CACHE"
    soak capacity 8903 --artifact "$KV8" --phrase-cache "$KV8_CACHE" --soak "$1" --concurrency 8
    stop capacity
    ;;
overload)
    : "${KV8:?the full-size int8-dynamic-kv8 variant folder}" "${KV8_CACHE:?its phrase cache}"
    secs=$1 queue=$2 batch=${3:-8}
    name=overload-q$queue-b$batch
    rate=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(2 * d['requests'] / d['config']['seconds'])" \
        "$out/capacity.json")
    serve "$name" 8904 --artifact "$KV8" --cache "$KV8_CACHE" --max-queue "$queue" --max-batch "$batch"
    rc=0
    .venv/bin/python docs/measurements/2026-12-04-epyc/soak/overload.py http://127.0.0.1:8904 "$rate" "$secs" \
        "$KV8_CACHE" "$KV8" "$out/$name" >"$out/$name.txt" 2>"$out/$name.progress" || rc=$?
    echo "$name: exit $rc" >>"$out/$name.txt"
    stop "$name"
    ;;
memory)
    : "${KV8:?the full-size int8-dynamic-kv8 variant folder}" "${KV8_CACHE:?its phrase cache}"
    limit=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(int(0.9 * d['drift']['rss_peak_bytes']))" \
        "$out/capacity.json")
    serve memory 8905 --artifact "$KV8" --cache "$KV8_CACHE" --memory-limit "$limit"
    soak memory 8905 --artifact "$KV8" --phrase-cache "$KV8_CACHE" --soak "$1" --concurrency 16
    curl -s http://127.0.0.1:8905/metrics | grep -E '^forge_(shed|memory|rss|errors_total)' >"$out/memory-metrics.txt"
    stop memory
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
