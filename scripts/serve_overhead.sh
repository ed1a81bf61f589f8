#!/usr/bin/env bash
# HTTP vs in-process load, interleaved: `bench --load --url` against two servers of the same version
# (e.g. the code before and after a change), new / old / new, so every ratio pairs an HTTP run with the
# in-process run that follows it in the same bench process. Usage:
#   scripts/serve_overhead.sh VERSION_DIR VARIANT NEW_URL OLD_URL OUT_DIR
# (docs/measurements/2026-12-01-xeon/serve.md, 2026-12-02 section)
set -euo pipefail
version=$1 variant=$2 new=$3 old=$4 out=$5
forge=${FORGE:-.venv/bin/chattts-forge}
mkdir -p "$out"
run() {  # name url concurrency
  echo "== $1: $2, concurrency $3, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$forge" bench --artifact "$version/$variant" --load --url "$2" --concurrency "$3" --requests 16 --threads 2 \
    --json "$out/$1.json" | tee "$out/$1.txt"
}
run new-1 "$new" 1,8
run old-2 "$old" 8
run new-3 "$new" 8
