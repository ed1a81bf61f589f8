"""INT4 weight-only quantization (onnxruntime MatMulNBits) of one graph's MatMuls.

Block-wise symmetric 4-bit weights (block size 128 by default), `accuracy_level` 4 (int8 compute of
the activations: the fast CPU kernel; level 0 is much slower at batch > 1). Activations stay float.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

from chattts_forge.errors import ForgeError

ACCURACY_LEVELS = (0, 1, 2, 3, 4)


def quantize_int4_graph(
    src: Path,
    dst: Path,
    block_size: int = 128,
    accuracy_level: int = 4,
    symmetric: bool = True,
    exclude_nodes: list[str] | None = None,
) -> dict[str, Any]:
    """Quantize `src` -> `dst`; returns the options record for artifact.json."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ForgeError(f"--block-size must be a power of two >= 16, got {block_size}")
    if accuracy_level not in ACCURACY_LEVELS:
        raise ForgeError(f"--accuracy-level must be one of {ACCURACY_LEVELS}, got {accuracy_level}")
    config = DefaultWeightOnlyQuantConfig(
        block_size=block_size,
        is_symmetric=symmetric,
        accuracy_level=accuracy_level,
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=("MatMul",),
    )
    try:
        quantizer = MatMulNBitsQuantizer(
            onnx.load(str(src)), nodes_to_exclude=list(exclude_nodes or []), algo_config=config
        )
        quantizer.process()
        quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)
    except Exception as e:
        raise ForgeError(f"int4 quantization of {src.name} failed: {str(e).splitlines()[0]}") from None
    return {
        "weight_type": "int4",
        "activation_type": "float32 (weight-only)",
        "block_size": block_size,
        "accuracy_level": accuracy_level,
        "symmetric": symmetric,
        "op_types": ["MatMul"],
    }
