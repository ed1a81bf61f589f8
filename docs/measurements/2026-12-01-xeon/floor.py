"""Batch-1 GPT decode step of full-size variants against their bandwidth floor (issue 27, cost model).

    .venv/bin/python docs/measurements/2026-12-01-xeon/floor.py REFERENCE_DIR [OTHER_DIR ...] [--context 200]

The runtime's own GPT step (fused graph when present, as `Pipeline` runs it) at batch 1 and a fixed
context, every artifact interleaved with the first one round by round (runtime.interleave; the
ratio's 90% interval within +-0.02 or 60 s), then per artifact: bytes one step reads
(runtime.costmodel.bytes_per_step: GPT graph + head_code files + the KV cache at the context), the
machine's read bandwidth measured now (numpy sum of 256 MiB, one thread, best of 5, not cached), the
floor (bytes / bandwidth) and the measured step over it. Prints one JSON object; the load average
before and after is part of it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from chattts_forge.runtime.autotune import RuntimeSteps
from chattts_forge.runtime.costmodel import bytes_per_step, floor_ms, measure_read_bandwidth
from chattts_forge.runtime.interleave import RatioSettings, compare_interleaved
from chattts_forge.runtime.machine import cpu_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifacts", nargs="+", type=Path)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    load_before = os.getloadavg()
    bandwidth = measure_read_bandwidth()
    steps = RuntimeSteps("cpu", args.threads)
    names = [p.name for p in args.artifacts]
    try:
        calls = {n: steps(p, args.context) for n, p in zip(names, args.artifacts, strict=True)}
        comp = compare_interleaved((names[0], calls.pop(names[0])), calls,
                                   RatioSettings(bound=0.02, time_cap_s=60.0, min_rounds=10, warmup_rounds=2,
                                                 min_sample_s=0.05, untimed_calls=2))
    finally:
        steps.close()
    bandwidth_after = measure_read_bandwidth()
    gbps = max(bandwidth["gb_per_s"], bandwidth_after["gb_per_s"])
    ref_ms = next(iter(comp.estimates.values())).reference_seconds * 1e3
    out = {"cpu": cpu_model(), "threads": args.threads, "context": args.context,
           "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "read_bandwidth": {"before": bandwidth, "after": bandwidth_after, "used_gb_per_s": gbps},
           "comparison": comp.to_dict(), "variants": {}}
    for name, path in zip(names, args.artifacts, strict=True):
        step_ms = ref_ms if name == names[0] else comp.estimates[name].seconds * 1e3
        read = bytes_per_step(path, args.context)
        floor = floor_ms(read["total_bytes"], gbps)
        out["variants"][name] = {**read, "step_ms": round(step_ms, 3), "floor_ms": round(floor, 3),
                                 "ratio_to_floor": round(step_ms / floor, 3)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
