"""Accuracy-driven fallback: keep the most harmful quantized nodes in FP32 until fidelity targets hold.

onnxruntime's quantizers take a fixed exclusion list; they cannot search for one. The loop here:

1. quantize with the user's exclusions, measure fidelity on the held-out trajectories;
2. if a target (`min_agreement`: teacher-forced top-1 agreement, mean over streams; `min_cosine`:
   mean hidden-state cosine; `max_kl`: mean KL) is missed, rank the still-quantized nodes by the
   error each one adds (per-tensor table, `local_error`; the code head counts as one node scored by
   its own relative error) and exclude the next `step_nodes` worst;
3. re-quantize (static: the calibration ranges are cached, so no re-calibration) and measure again;
4. stop when every target holds, or report that it cannot be met once nothing is left to exclude.

The ranking is a heuristic: "error a node adds" is measured with its already-perturbed input, so
early layers (clean inputs) rank high; re-ranking after every step spreads exclusions over the
depth. Every step records what it excluded, the fidelity reached, the GPT's bytes and its decode-step latency
(2 threads, median), so the price of each bit of accuracy is visible in artifact.json.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from chattts_forge.artifact import HEAD_CODE
from chattts_forge.log import get_logger
from chattts_forge.quantize.config import Targets
from chattts_forge.quantize.fidelity import make_session
from chattts_forge.runtime.timing import time_calls

log = get_logger(__name__)

HEAD_NODE = HEAD_CODE  # pseudo node name: the whole code head kept in FP32
MAX_STEPS = 50  # exclusion steps at most (each re-quantizes and measures fidelity once)
BENCH_THREADS = 2  # the threads each step's decode-step latency is timed with


def gpt_step_ms(gpt_path: Path, feeds: dict[str, np.ndarray], threads: int = 2, runs: int = 15) -> float:
    """Median latency (ms) of one GPT run on `feeds` (a recorded decode step), after 3 warm-ups."""
    sess = make_session(gpt_path, threads)
    names = [o.name for o in sess.get_outputs()]
    seconds = time_calls(lambda: sess.run(names, feeds), runs, warmup=3)
    return round(float(np.median(seconds)) * 1e3, 3)


def producers_of(model_path: Path, tensors: list[str]) -> list[str]:
    """Names of the nodes of `model_path` that produce `tensors` (graphs keep tensor names)."""
    model = onnx.load(str(model_path), load_external_data=False)
    prod = {o: n.name for n in model.graph.node for o in n.output}
    return [prod[t] for t in tensors if t in prod]


def _fid_brief(fid: dict[str, Any]) -> dict[str, Any]:
    return {
        "top1_agreement": fid["teacher_forced"]["top1_agreement"]["mean"],
        "kl": fid["teacher_forced"]["kl"]["mean"],
        "hidden_cosine": fid["hidden_cosine"]["mean"],
        "mel_snr_db": fid["mel"]["snr_db"],
    }


def run_fallback(
    quantize_with: Callable[[list[str], bool], None],
    measure: Callable[[], dict[str, Any]],
    gpt_path: Path,
    bench_feeds: dict[str, np.ndarray] | None,
    targets: Targets,
    head_quantized: bool,
    step_nodes: int | None = None,
) -> dict[str, Any]:
    """Run the loop. `quantize_with(excluded_tensors, keep_head_fp32)` rewrites the quantized graphs
    (tensors: FP32 MatMul output names, mapped to node names by the caller); `measure()` returns a
    `measure_fidelity` dict (with the full per-tensor table). Returns the record for artifact.json,
    with "final_fidelity" holding the last measurement."""
    excluded: list[str] = []  # tensor names (MatMul outputs) kept FP32
    keep_head = False
    steps: list[dict[str, Any]] = []
    fid: dict[str, Any] = {}
    met = False
    for step in range(MAX_STEPS + 1):
        t0 = time.perf_counter()
        quantize_with(list(excluded), keep_head)
        fid = measure()
        missed = targets.check(fid)
        record = {
            "step": step,
            "excluded_nodes_total": len(excluded) + (1 if keep_head else 0),
            "fidelity": _fid_brief(fid),
            "gpt_bytes": gpt_path.stat().st_size,
            "gpt_step_ms_2threads": gpt_step_ms(gpt_path, bench_feeds, BENCH_THREADS) if bench_feeds else None,
            "missed": missed,
            "seconds": round(time.perf_counter() - t0, 2),
        }
        if steps:
            record["newly_excluded"] = steps[-1].pop("_next", [])
        steps.append(record)
        log.info("fallback step %d: %s%s", step, ", ".join(f"{k} {v:.5g}" for k, v in record["fidelity"].items()),
                 f"; missed: {'; '.join(missed)}" if missed else "; targets met")
        if not missed:
            met = True
            break
        rows = fid.get("per_tensor", {}).get("all_local") or []
        candidates = [(r["local_error"], r["tensor"], r["node"]) for r in rows if r["tensor"] not in excluded]
        if head_quantized and not keep_head:
            candidates.append((fid["per_tensor"]["head_code_rel_error"], HEAD_NODE, HEAD_NODE))
        candidates.sort(reverse=True)
        if not candidates:
            break
        total = len(rows) + (1 if head_quantized else 0)
        k = step_nodes or max(1, math.ceil(total / 10))
        chosen = candidates[:k]
        names = []
        for _, tensor, node in chosen:
            if tensor == HEAD_NODE:
                keep_head = True
            else:
                excluded.append(tensor)
            names.append(node)
        steps[-1]["_next"] = names
    if steps and "_next" in steps[-1]:
        steps[-1].pop("_next")
    if not met:
        log.warning("fallback: the targets cannot be met (%s) even with %d nodes in FP32",
                    "; ".join(targets.check(fid)), len(excluded) + int(keep_head))
    return {
        "targets": targets.to_dict(),
        "met": met,
        "message": (
            f"targets met after {len(steps) - 1} step(s), {len(excluded) + int(keep_head)} node(s) kept in FP32"
            if met
            else f"targets cannot be met: {'; '.join(targets.check(fid))} with {len(excluded) + int(keep_head)} "
            "node(s) kept in FP32"
        ),
        "excluded_tensors": excluded,
        "head_code_kept_fp32": keep_head,
        "steps": steps,
        "final_fidelity": fid,
    }

