"""The quantized fused GPT graph (`gpt_fast.onnx`) of a calibrated variant, and its parity with gpt.onnx.

Static INT8, calibrated INT4 and auto quantize the FP32 source's own `gpt_fast.onnx` (built by
runtime.fast_gpt_graph) with the same per-MatMul choices as the plain `gpt.onnx`, from the same recorded
calibration samples (turned into fused-graph feeds by `static_fused.fused_feed`). Packing does not
change the arithmetic: the packed QKV / gate-up MatMuls share their input (one activation scale)
and weights are scaled per output column (INT8) or per column block (INT4), so the fused graph
computes what the plain one does. `parity_on_samples` checks that on the recorded samples.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, FAST_GPT_FILE, ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.graph_storage import storage_record
from chattts_forge.log import get_logger
from chattts_forge.quantize.static_fused import fused_feed

log = get_logger(__name__)


def parity_on_samples(plain: Path, fast: Path, samples: Sequence[dict[str, np.ndarray]],
                      threads: int = 1) -> dict[str, Any]:
    """Hidden states of the plain and fused graphs on the same recorded samples (valid positions)."""
    from chattts_forge.quantize.fidelity import cosine_rows, make_session

    p_sess, f_sess = make_session(plain, threads), make_session(fast, threads)
    worst, scale, cos_min = 0.0, 0.0, 1.0
    for s in samples:
        ref = p_sess.run(["last_hidden_state"], s)[0]
        got = f_sess.run(["last_hidden_state"], fused_feed(s))[0]
        valid = s["attention_mask"][:, -ref.shape[1]:].astype(bool)
        worst = max(worst, float(np.abs(got - ref)[valid].max()))
        scale = max(scale, float(np.abs(ref[valid]).max()))
        cos_min = min(cos_min, float(cosine_rows(ref[valid], got[valid]).min()))
    if not samples:
        raise ForgeError("no samples to compare the plain and fused graphs on")
    return {
        "reference": "the artifact's quantized gpt.onnx on the recorded calibration samples",
        "samples": len(samples),
        "max_abs": worst,
        "max_rel": worst / scale if scale else 0.0,
        "min_cosine": cos_min,
    }


def write_fast_graph(src_dir: Path, meta: ArtifactMeta, tmp: Path, precision: str,
                     quantize: Callable[[Path, Path], dict[str, Any]], samples: Sequence[dict[str, np.ndarray]],
                     threads: int = 1) -> dict[str, Any]:
    """Quantize the source's FP32 `gpt_fast.onnx` into `tmp` with `quantize(src, dst)` and return its
    `components.gpt_fast` record (parity against the plain gpt.onnx in `tmp`, quantized with the same choices)."""
    from chattts_forge.quantize.artifact import copy_metadata_props

    src = meta.component_file(src_dir, FAST_GPT)
    dst = tmp / FAST_GPT_FILE
    options = quantize(src, dst)
    copy_metadata_props(src, dst, precision)
    parity = parity_on_samples(tmp / meta.component_file(src_dir, "gpt").name, dst, samples, threads)
    log.info("fused %s graph vs its gpt.onnx on %d samples: max abs %.3g (rel %.3g), min cosine %.6f", precision,
             parity["samples"], parity["max_abs"], parity["max_rel"], parity["min_cosine"])
    record = copy.deepcopy(meta.component(FAST_GPT))
    record.update(precision=precision, quantization=options, parity=parity)
    record.get("optimization", {}).pop("weights_from", None)  # quantized from the FP32 gpt_fast.onnx itself
    record["quantized_from"] = f"the FP32 source's {FAST_GPT_FILE}"
    return storage_record(tmp, record)  # the source's external_data is not this graph's
