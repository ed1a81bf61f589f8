"""Quantized fused GPT graphs: the runtime's fast-graph builder with this stage's quantizers.

The graph itself is built and checked by `chattts_forge.quantize.fast_gpt_graph` (torch-free, in the
runtime layer so that convert and quantize both use it); this module gives it the quantize stage's
onnxruntime quantizers (`dynamic.py`, `int4.py`), the same ones the plain graphs get.

Library use::

    from chattts_forge.quantize.fast_gpt import optimize_artifact, optimize_gpt
    optimize_gpt("artifacts/fp32", "x/gpt_fast.onnx", quantize="int4", block_size=128)
    optimize_artifact("artifacts/int4", weights_from="artifacts/fp32")   # follows the variant
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chattts_forge.artifact import FLOAT_VARIANTS, METHOD_VARIANT, ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.quantize import fast_gpt_graph
from chattts_forge.quantize.fast_gpt_graph import FusedGraphOptions, GraphQuantizer
from chattts_forge.quantize.methods import METHODS

# The methods whose fused graph is rebuilt from the FP32 weights (the registry says which).
QUANTIZE_METHODS = tuple(name for name, cls in METHODS.items() if cls.can_rebuild_fast_graph)
# `optimize_artifact(quantize=...)`'s default: the method the artifact's variant was quantized with.
FOLLOW_VARIANT = "variant"
# artifact variant -> quantization of its fast graph (None: FP32 graph)
VARIANT_METHODS: dict[str, str | None] = {
    **dict.fromkeys(FLOAT_VARIANTS), **{METHOD_VARIANT[m]: m for m in QUANTIZE_METHODS}
}


def fast_gpt_quantizer(
    method: str, *, block_size: int = 128, accuracy_level: int = 4, per_channel: bool = False
) -> GraphQuantizer:
    """The fused graph's quantizer of a rebuilding method (`QUANTIZE_METHODS`: dynamic INT8
    MatMulInteger, per tensor unless `per_channel`; int4 MatMulNBits at `block_size`, `accuracy_level`)."""
    if method not in QUANTIZE_METHODS:
        raise BadInput(f"unknown quantization method '{method}' (choose from: {', '.join(QUANTIZE_METHODS)})")
    return METHODS[method].fast_graph_quantizer(block_size=block_size, accuracy_level=accuracy_level,
                                                per_channel=per_channel)


def optimize_gpt(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    quantize: str | None = None,
    block_size: int = 128,
    accuracy_level: int = 4,
    per_channel: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """`quantize.fast_gpt_graph.optimize_gpt` with `quantize`: None (FP32) or a method of
    `QUANTIZE_METHODS` (those that rebuild the fused graph); `kwargs`: the other `FusedGraphOptions`."""
    quantizer = None
    if quantize is not None:
        quantizer = fast_gpt_quantizer(quantize, block_size=block_size, accuracy_level=accuracy_level,
                                       per_channel=per_channel)
    return fast_gpt_graph.optimize_gpt(source, out, FusedGraphOptions(quantizer=quantizer, **kwargs))


def optimize_artifact(
    artifact_dir: str | os.PathLike[str],
    *,
    weights_from: str | os.PathLike[str] | None = None,
    quantize: str | None = FOLLOW_VARIANT,
    **kwargs: Any,
) -> dict[str, Any]:
    """Add `gpt_fast.onnx` to an artifact folder and record it in its artifact.json.

    `quantize=FOLLOW_VARIANT` (default) follows the artifact's variant: fp32/fp16 -> FP32 fast graph, int8-dynamic ->
    "dynamic", int4 -> "int4" (quantized artifacts need `weights_from`, their FP32 source). Options
    recorded under the artifact's `quantization` block (block_size, accuracy_level, per_channel) are
    reused unless given. Returns the component record.
    """
    folder = Path(artifact_dir).expanduser()
    meta = ArtifactMeta.load(folder)
    variant = meta.variant
    if quantize == FOLLOW_VARIANT:
        if variant not in VARIANT_METHODS:
            raise ForgeError(f"artifact variant '{variant}' has no fast GPT variant (fp32, int8-dynamic, int4)")
        quantize = VARIANT_METHODS[variant]
    q = meta.quantization or {}
    options = {key: q[key] for key in ("block_size", "accuracy_level", "per_channel") if key in q}
    options.update({key: kwargs.pop(key) for key in ("block_size", "accuracy_level", "per_channel") if key in kwargs})
    if quantize is not None and weights_from is None and variant != "fp32":
        raise BadInput(f"artifact {folder} is {variant}: pass weights_from=<its FP32 artifact folder>")
    quantizer = None if quantize is None else fast_gpt_quantizer(quantize, **options)
    return fast_gpt_graph.optimize_artifact(folder, FusedGraphOptions(quantizer=quantizer, weights_from=weights_from,
                                                                      **kwargs))
