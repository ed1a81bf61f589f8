#!/usr/bin/env bash
# Issue 37's soaks, one after another on a quiet machine, from the repository root:
#   docs/measurements/2026-12-04-epyc/soak/run_soaks.sh STEP OUT
# STEP: tiny (60 min, concurrency 8, a reload at half time) | full (20 min of int8-dynamic-kv8 at
# concurrency 8) | overload (5 min at twice full's request rate, --max-queue 4, clients retrying until
# admitted) | memory (4 min, 16 clients, --memory-limit below full's unlimited peak). TINY, KV8 and
# KV8_CACHE name the inputs.
set -euo pipefail
step=$1
out=$2
mkdir -p "$out"
F=.venv/bin/chattts-forge
TINY=${TINY:-artifacts/chattts-synthetic-tiny-seed0/v1}
KV8=${KV8:?the full-size int8-dynamic-kv8 variant folder}
KV8_CACHE=${KV8_CACHE:?its phrase cache (chattts-forge warm --artifact KV8 ...)}

serve() {  # port, serve arguments...: start, wait for /readyz
    local port=$1
    shift
    $F serve --port "$port" --admin-loopback "$@" >"$out/serve-$step.log" 2>&1 &
    echo $! >"$out/serve-$step.pid"
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
        sleep 1
    done
    echo "server on $port not ready" >&2
    return 1
}

stop() {
    kill -TERM "$(cat "$out/serve-$step.pid")"
    wait "$(cat "$out/serve-$step.pid")" || true
}

soak() {  # port, bench arguments...
    local port=$1
    shift
    local rc=0
    $F bench --url "http://127.0.0.1:$port" --json "$out/$step.json" --plot "$out/$step.png" "$@" \
        >"$out/$step.txt" 2>"$out/$step.progress" || rc=$?
    echo "$step: exit $rc" >>"$out/$step.txt"
}

case $step in
tiny)
    serve 8801 --artifact "$TINY" --memory-limit 4G
    soak 8801 --artifact "$TINY" --soak 3600 --concurrency 8 --reload-every 1800
    stop
    ;;
full)
    serve 8802 --artifact "$KV8" --cache "$KV8_CACHE"
    soak 8802 --artifact "$KV8" --phrase-cache "$KV8_CACHE" --soak 1200 --concurrency 8
    stop
    ;;
overload)
    rate=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(2 * d['requests'] / d['config']['seconds'])" \
        "$out/full.json")
    serve 8803 --artifact "$KV8" --cache "$KV8_CACHE" --max-queue 4
    # bench --soak --rate, with clients that retry until admitted (overload.py: bench gives up after 8)
    rc=0
    .venv/bin/python "$(dirname "$0")/overload.py" http://127.0.0.1:8803 "$rate" 300 "$KV8_CACHE" "$KV8" \
        "$out/overload" >"$out/overload.txt" 2>"$out/overload.progress" || rc=$?
    echo "overload: exit $rc" >>"$out/overload.txt"
    stop
    ;;
memory)
    limit=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(int(0.9 * d['drift']['rss_peak_bytes']))" \
        "$out/full.json")
    serve 8804 --artifact "$KV8" --cache "$KV8_CACHE" --memory-limit "$limit"
    soak 8804 --artifact "$KV8" --phrase-cache "$KV8_CACHE" --soak 240 --concurrency 16
    curl -s http://127.0.0.1:8804/metrics | grep -E '^forge_(shed|memory|rss|errors_total)' >"$out/memory-metrics.txt"
    stop
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
