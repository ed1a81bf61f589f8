"""Median GPT step (batch 1, context <= 400) per artifact over the rounds of run_rounds.sh, and the
median of the same-round ratios to a reference artifact.

    python summarize_rounds.py ROUNDS_DIR [--reference int8-dynamic]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", type=Path)
    ap.add_argument("--reference", default="int8-dynamic")
    args = ap.parse_args()
    step: dict[str, dict[int, float]] = defaultdict(dict)
    e2e: dict[str, dict[int, float]] = defaultdict(dict)
    for path in sorted(args.rounds.glob("r*-*.json")):
        rnd, name = path.stem.split("-", 1)
        res = json.loads(path.read_text())["results"]["onnx"]["1"]
        step[name][int(rnd[1:])] = res["gpt_step_ms_ctx400"]["median"]
        e2e[name][int(rnd[1:])] = res["e2e_rtf"]["median"]
    ref = step[args.reference]
    print(f"{'artifact':<20} {'step ms':>8} {'vs ' + args.reference:>18} {'e2e RTF':>8}  rounds")
    for name in sorted(step):
        rounds = sorted(step[name])
        ratios = [step[name][r] / ref[r] for r in rounds if r in ref]
        print(f"{name:<20} {statistics.median(step[name].values()):8.2f} {statistics.median(ratios):18.3f} "
              f"{statistics.median(e2e[name].values()):8.3f}  {[round(step[name][r], 2) for r in rounds]}")


if __name__ == "__main__":
    main()
