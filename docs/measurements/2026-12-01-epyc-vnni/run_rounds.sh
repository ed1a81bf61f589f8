#!/usr/bin/env bash
# GPT step at batch 1 of several artifacts, five rounds, the order rotated each round, so that every
# round gives same-session ratios (summarize_rounds.py reads the JSON this writes).
#   bash run_rounds.sh OUT_DIR ARTIFACT_DIR...   (the first artifact is the ratios' reference)
set -euo pipefail
out=$1; shift
arts=("$@")
n=${#arts[@]}
mkdir -p "$out"
for r in 1 2 3 4 5; do
  for ((i = 0; i < n; i++)); do
    a=${arts[$(( (i + r * 3) % n ))]}
    chattts-forge bench --artifact "$a" --batch 1 --steps 200 --reps 3 --threads 2 --no-first-audio \
      --json "$out/r$r-$(basename "$a").json" > /dev/null 2> "$out/.bench.log" || { cat "$out/.bench.log" >&2; exit 1; }
  done
  echo "round $r done"
done
