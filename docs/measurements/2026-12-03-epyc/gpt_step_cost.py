"""CPU seconds of one fused-GPT decode step by batch rows: `python gpt_step_cost.py FP32_ARTIFACT [THREADS]`.

Prefills a 64-token random prompt per row, then times 24 decode steps at a past of ~64-88, reporting
process CPU seconds per step (what other load on a shared machine moves least) and wall seconds.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> int:
    from chattts_forge.runtime import Pipeline

    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    pipe = Pipeline(sys.argv[1], threads=threads)
    gpt = pipe.gpt
    hidden = pipe.dims.hidden_size
    rng = np.random.default_rng(0)
    out = {}
    for rows in (1, 8, 16, 32):
        gpt.reserve(64 + 32)
        gpt.reset(rows)
        mask = np.ones((rows, 64), np.int64)
        gpt(rng.normal(size=(rows, 64, hidden)).astype(np.float32), mask, np.tile(np.arange(64), (rows, 1)))
        steps = 24
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            mask = np.concatenate([mask, np.ones((rows, 1), np.int64)], axis=1)
            gpt(rng.normal(size=(rows, 1, hidden)).astype(np.float32), mask, mask.sum(axis=1, keepdims=True) - 1)
        cpu, wall = (time.process_time() - c0) / steps, (time.perf_counter() - w0) / steps
        out[rows] = {"cpu_s_per_step": round(cpu, 4), "wall_s_per_step": round(wall, 4),
                     "cpu_s_per_row_step": round(cpu / rows, 5)}
        print(rows, out[rows], flush=True)
    print(json.dumps({"threads": threads, "steps": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
