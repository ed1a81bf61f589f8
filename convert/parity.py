"""Export-time parity: run an ONNX graph in onnxruntime against the PyTorch reference, per case.

Figures, per case and overall (the worst case):
- `max_abs`: max |onnx - reference| over every compared element of every output;
- `max_rel`: `max_abs` of an output divided by the largest |reference| of that output (so it reads
  as "error relative to the output's scale", and does not blow up on values near zero).
Padding positions (left padding in the GPT) are excluded with a per-output mask: ChatTTS never
reads them, and transformers/torch and onnxruntime legitimately differ there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError


@dataclass
class ParityCase:
    """One set of graph inputs, the reference outputs, and an optional compare mask per output."""

    name: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    masks: dict[str, np.ndarray] = field(default_factory=dict)


def make_session(path: str | Path, threads: int = 1):
    """A CPU onnxruntime session (CPU provider only, so FP16 graphs are checked to run on CPU)."""
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def compare_outputs(
    got: dict[str, np.ndarray], expected: dict[str, np.ndarray], masks: dict[str, np.ndarray]
) -> tuple[float, float, dict[str, dict[str, float]]]:
    worst_abs = 0.0
    worst_rel = 0.0
    per_output: dict[str, dict[str, float]] = {}
    for name, ref in expected.items():
        out = got[name]
        if out.shape != ref.shape:
            raise ForgeError(f"output '{name}' has shape {list(out.shape)}, expected {list(ref.shape)}")
        ref64 = ref.astype(np.float64)
        diff = np.abs(out.astype(np.float64) - ref64)
        mask = masks.get(name)
        if mask is not None:
            mask = np.broadcast_to(mask, diff.shape)
            diff = diff[mask]
            ref64 = ref64[mask]
        if diff.size == 0:
            per_output[name] = {"max_abs": 0.0, "max_rel": 0.0}
            continue
        if not np.all(np.isfinite(diff)):
            per_output[name] = {"max_abs": float("inf"), "max_rel": float("inf")}
            worst_abs = worst_rel = float("inf")
            continue
        max_abs = float(diff.max())
        scale = float(np.abs(ref64).max())
        max_rel = max_abs / scale if scale > 0 else max_abs
        per_output[name] = {"max_abs": max_abs, "max_rel": max_rel}
        worst_abs = max(worst_abs, max_abs)
        worst_rel = max(worst_rel, max_rel)
    return worst_abs, worst_rel, per_output


def check_parity(
    session: Any,
    cases: Sequence[ParityCase],
    tolerance_abs: float | None,
    what: str,
    *,
    tolerance_rel: float | None = None,
    collect: list[dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Run every case; return the parity record.

    Raises ForgeError when the worst case is outside `tolerance_abs` (or `tolerance_rel`, where
    given), or not finite. `collect`, when given, receives each case's onnxruntime outputs.
    """
    record_cases = []
    worst_abs = 0.0
    worst_rel = 0.0
    for case in cases:
        names = [o.name for o in session.get_outputs()]
        got = dict(zip(names, session.run(names, case.inputs), strict=True))
        if collect is not None:
            collect.append(got)
        max_abs, max_rel, _ = compare_outputs(got, case.expected, case.masks)
        record_cases.append(
            {
                "name": case.name,
                "input_shapes": {k: list(v.shape) for k, v in case.inputs.items()},
                "max_abs": max_abs,
                "max_rel": max_rel,
            }
        )
        worst_abs = max(worst_abs, max_abs)
        worst_rel = max(worst_rel, max_rel)
    record: dict[str, Any] = {}
    if tolerance_abs is not None:
        record["tolerance_abs"] = tolerance_abs
    if tolerance_rel is not None:
        record["tolerance_rel"] = tolerance_rel
    record.update({"max_abs": worst_abs, "max_rel": worst_rel, "cases": record_cases})
    failed_abs = tolerance_abs is not None and not worst_abs <= tolerance_abs
    failed_rel = tolerance_rel is not None and not worst_rel <= tolerance_rel
    if failed_abs or failed_rel or not np.isfinite(worst_abs):
        key = "max_abs" if failed_abs or tolerance_rel is None else "max_rel"
        bad = max(record_cases, key=lambda c: c[key])
        limit = f"abs {tolerance_abs:g}" if key == "max_abs" else f"rel {tolerance_rel:g}"
        raise ForgeError(
            f"{what}: parity check failed, {key} {bad[key]:.3g} outside tolerance {limit} "
            f"(worst case '{bad['name']}'); nothing was written"
        )
    return record
