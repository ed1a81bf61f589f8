#!/usr/bin/env bash
# Sentences/s at concurrency 8 in-process, three arms interleaved per round (order rotated): the default
# (recorded look-ahead, first chunk first), the look-ahead without priority, the exact stream without
# priority (before issue 52). Usage: throughput_arms.sh ARTIFACT OUT_DIR [ROUNDS] [REQUESTS]
set -euo pipefail
artifact=$1 out=$2 rounds=${3:-3} n=${4:-48}
forge=${FORGE:-.venv/bin/chattts-forge}
mkdir -p "$out"
arm() {  # name
  case $1 in
    default) set -- default ;;
    lookahead-only) set -- lookahead-only --no-first-chunk-priority ;;
    exact) set -- exact --stream-lookahead exact --no-first-chunk-priority ;;
  esac
  local name=$1; shift
  echo "== $name round $r, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$forge" bench --artifact "$artifact" --load --concurrency 8 --requests "$n" --threads 2 "$@" \
    --json "$out/$name-c8-r$r.json" >"$out/$name-c8-r$r.txt"
}
arms=(default lookahead-only exact)
for r in $(seq "$rounds"); do
  for i in 0 1 2; do arm "${arms[$(( (i + r) % 3 ))]}"; done
done
