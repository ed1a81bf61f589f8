"""Quick GPT decode-step timing of artifacts' plain `gpt.onnx` graphs (a benchmark, never a test).

    python -m chattts_forge.quantize.stepbench ART_FP32 ART_DYNAMIC ART_INT4 ART_STATIC \\
        [--threads 2] [--past 64] [--batch 1] [--runs 30] [--json OUT]

Feeds one decode step (S = 1) with a past of `--past` positions (random, seeded: latency does not
depend on the values) and reports the median and quartiles of `session.run`, plus the GPT file size
and its ratio to the first artifact's. End-to-end figures against ChatTTS come from `chattts-forge
bench`; this isolates the graph the quantize stage produced.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import ArtifactMeta


def decode_feeds(dims: dict[str, Any], past: int, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    layers, kv = int(dims["num_hidden_layers"]), int(dims["num_key_value_heads"])
    hd = int(dims["hidden_size"]) // int(dims["num_attention_heads"])
    feeds: dict[str, np.ndarray] = {
        "inputs_embeds": rng.standard_normal((batch, 1, int(dims["hidden_size"])), dtype=np.float32),
        "attention_mask": np.ones((batch, past + 1), dtype=np.int64),
        "position_ids": np.full((batch, 1), past, dtype=np.int64),
    }
    for i in range(layers):
        for name in ("key", "value"):
            feeds[f"past_key_values.{i}.{name}"] = rng.standard_normal((batch, kv, past, hd), dtype=np.float32)
    return feeds


def open_gpt(artifact_dir: Path, threads: int) -> tuple[Any, ArtifactMeta, Path]:
    import onnxruntime as ort

    meta = ArtifactMeta.load(artifact_dir)
    path = meta.component_file(artifact_dir, "gpt")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"]), meta, path


def time_gpt_steps(
    artifacts: list[Path], threads: int = 2, past: int = 64, batch: int = 1, runs: int = 30
) -> list[dict[str, Any]]:
    """Median decode-step latency of each artifact's gpt.onnx, runs interleaved round by round so
    that background load hits every artifact alike."""
    opened = [open_gpt(a, threads) for a in artifacts]
    feeds = [decode_feeds(meta.dims, past, batch) for _, meta, _ in opened]
    for (sess, _, _), f in zip(opened, feeds, strict=True):
        for _ in range(3):
            sess.run(None, f)
    times: list[list[float]] = [[] for _ in opened]
    for _ in range(runs):
        for i, ((sess, _, _), f) in enumerate(zip(opened, feeds, strict=True)):
            t0 = time.perf_counter()
            sess.run(None, f)
            times[i].append((time.perf_counter() - t0) * 1e3)
    rows = []
    for art, (_, meta, path), t in zip(artifacts, opened, times, strict=True):
        q = statistics.quantiles(t, n=4)
        rows.append({
            "artifact": str(art),
            "variant": meta.variant,
            "gpt_bytes": path.stat().st_size,
            "step_ms_median": round(statistics.median(t), 2),
            "step_ms_q1": round(q[0], 2),
            "step_ms_q3": round(q[2], 2),
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
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
