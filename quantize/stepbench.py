"""Quick GPT decode-step timing of artifacts' plain `gpt.onnx` graphs (a benchmark, never a test).

    python -m chattts_forge.quantize.stepbench ART_FP32 ART_DYNAMIC ART_INT4 ART_STATIC \\
        [--threads 2] [--past 64] [--batch 1] [--runs 30] [--json OUT]

Times one decode step (S = 1) of each artifact's plain GPT step - the runtime's own `GptStep` on the
session `bench` and the evaluate stage run (`runtime.timed_engine.OnnxEngine`, engine "plain") - with a
past of `--past` positions (random, seeded: latency does not depend on the values), and reports
the median and quartiles, plus the GPT file size and its ratio to the first artifact's. End-to-end
figures against ChatTTS come from `chattts-forge bench`; this isolates the graph the quantize stage
produced.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from chattts_forge.artifact import GPT
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.runtime.timed_engine import OnnxEngine, decode_step_call
from chattts_forge.runtime.timing import quantiles, time_interleaved


def time_gpt_steps(
    artifacts: list[Path], threads: int = 2, past: int = 64, batch: int = 1, runs: int = 30
) -> list[dict[str, Any]]:
    """Decode-step latency of each artifact's gpt.onnx, runs interleaved round by round so that
    background load hits every artifact alike."""
    engines = [OnnxEngine(a, threads, engine="plain") for a in artifacts]
    calls = [decode_step_call(e.gpt_step, e.pipe.dims.hidden_size, past, batch) for e in engines]
    times = time_interleaved(calls, runs, warmup=3)
    rows = []
    for art, eng, t in zip(artifacts, engines, times, strict=True):
        q1, median, q3 = quantiles([x * 1e3 for x in t], [25, 50, 75]) or []
        rows.append({
            "artifact": str(art),
            "variant": eng.pipe.artifact.variant,
            "gpt_bytes": eng.pipe.artifact.component_path(GPT).stat().st_size,
            "step_ms_median": round(float(median), 2),
            "step_ms_q1": round(float(q1), 2),
            "step_ms_q3": round(float(q3), 2),
            "threads": threads,
            "past": past,
            "batch": batch,
            "runs": runs,
        })
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--past", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = time_gpt_steps(args.artifacts, args.threads, args.past, args.batch, args.runs)
    base = rows[0]
    for r in rows:
        r["bytes_ratio_to_first"] = round(r["gpt_bytes"] / base["gpt_bytes"], 4)
        r["speedup_vs_first"] = round(base["step_ms_median"] / r["step_ms_median"], 2)
        print(f"{r['variant']:>14}  {r['step_ms_median']:8.2f} ms  (q1 {r['step_ms_q1']:.2f}, q3 {r['step_ms_q3']:.2f})"
              f"  x{r['speedup_vs_first']:.2f}  gpt {r['gpt_bytes'] / 1e6:8.1f} MB ({100 * r['bytes_ratio_to_first']:.0f}%)")
    if args.json:
        atomic_write_json(args.json, rows)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
