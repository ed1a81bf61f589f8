#!/usr/bin/env bash
# Issue 13's memory figures: batch 1 (200 and 422 steps) and batch 8 (422 steps), each in its own
# process, for the artifacts given, in rotated order over two rounds.
# usage: run_memory.sh OUT LABEL=ARTIFACT_DIR...
set -euo pipefail
out=$1; shift
mkdir -p "$out"
for round in 1 2; do
  for pair in "$@"; do
    label=${pair%%=*}; art=${pair#*=}
    chattts-forge bench --artifact "$art" --batch 1 --steps 200 --reps 2 --threads 2 --no-first-audio --json "$out/$label-b1-200-r$round.json" >/dev/null 2>&1
    chattts-forge bench --artifact "$art" --batch 1 --steps 422 --reps 2 --threads 2 --json "$out/$label-b1-422-r$round.json" >/dev/null 2>&1
    chattts-forge bench --artifact "$art" --batch 8 --steps 422 --reps 1 --threads 2 --no-first-audio --json "$out/$label-b8-422-r$round.json" >/dev/null 2>&1
  done
  set -- "${@:2}" "$1"  # rotate the order for the next round
done
