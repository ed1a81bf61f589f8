"""The quantized fused GPT graph (`gpt_fast.onnx`) of a calibrated variant, and its parity with gpt.onnx.

Static INT8, calibrated INT4 and auto quantize the FP32 source's own `gpt_fast.onnx` (built by
quantize.fast_gpt_graph) with the same per-MatMul choices as the plain `gpt.onnx`, from the same recorded
calibration samples (turned into fused-graph feeds by `static_fused.fused_feed`). Packing does not
change the arithmetic: the packed QKV / gate-up MatMuls share their input (one activation scale)
and weights are scaled per output column (INT8) or per column block (INT4), so the fused graph
computes what the plain one does. The one parity check (`fast_gpt_parity.fused_parity`)
checks that on the recorded samples (`sample_cases`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from chattts_forge.artifact import FAST_GPT, FAST_GPT_FILE, GPT, ArtifactMeta
from chattts_forge.graph_storage import write_component
from chattts_forge.log import get_logger
from chattts_forge.quantize.fast_gpt_graph import make_fused_graph
from chattts_forge.quantize.fast_gpt_parity import RecordedSamples
from chattts_forge.quantize.static_fused import fused_feed
from chattts_forge.quantize.variant_files import copy_metadata_props

log = get_logger(__name__)


def sample_cases(samples: Sequence[dict[str, np.ndarray]]) -> RecordedSamples:
    """The recorded samples as parity cases of the runtime's one fused-graph parity check."""
    return RecordedSamples(samples, fused_feed)


def write_fast_graph(src_dir: Path, meta: ArtifactMeta, tmp: Path, precision: str,
                     quantize: Callable[[Path, Path], dict[str, Any]], samples: Sequence[dict[str, np.ndarray]],
                     threads: int = 1) -> dict[str, Any]:
    """Quantize the source's FP32 `gpt_fast.onnx` into `tmp` with `quantize(src, dst)` and return its
    `components.gpt_fast` record (parity against the plain gpt.onnx in `tmp`, quantized with the same choices)."""
    src = meta.component_file(src_dir, FAST_GPT)
    dst = tmp / FAST_GPT_FILE
    options, parity = make_fused_graph(src, dst, quantize, tmp / meta.component_file(src_dir, GPT).name,
                                       sample_cases(samples), threads=threads,
                                       restamp=lambda fp32, out: copy_metadata_props(fp32, out, precision))
    assert options is not None and parity is not None
    log.info("fused %s graph vs its gpt.onnx on %d samples: max abs %.3g (rel %.3g), min cosine %.6f", precision,
             parity["samples"], parity["max_abs"], parity["max_rel"], parity["min_cosine"])
    record = copy.deepcopy(meta.component(FAST_GPT))
    record.update(precision=precision, quantization=options, parity=parity)
    record.get("optimization", {}).pop("weights_from", None)  # quantized from the FP32 gpt_fast.onnx itself
    record["quantized_from"] = f"the FP32 source's {FAST_GPT_FILE}"
    # Stored as the runtime maps it; the source's external_data is not this graph's.
    return write_component(onnx.load(str(dst)), tmp, FAST_GPT, record)
