"""Weight-only INT8 for the Decoder: its pointwise MatMuls as 8-bit MatMulNBits, convolutions FP32.

The Decoder (ChatTTS's DVAE decoder on GPT hidden states) is 12 ConvNeXt blocks whose two
pointwise projections (512 -> 2048 -> 512, `nn.Linear`) hold 97% of its 104 MB; the depthwise and
in/out convolutions are small. Dynamic INT8 would turn the convolutions into ConvInteger (a slow
onnxruntime CPU path), so only the MatMuls are quantized, weight-only: 8-bit symmetric blocks of
`BLOCK_SIZE` along the input dimension (round to nearest), computed by onnxruntime's MatMulNBits
with `ACCURACY_LEVEL` 4 (int8 compute of the activations; level 0 dequantizes to float).

Measured on the full synthetic checkpoint (batch 1, 844 frames, 2 threads, AVX-512 VNNI), against
the FP32 graph on the same input: file 104 -> 29 MB, session RSS 115 -> 43 MB, 111 -> 87 ms a call,
output cosine 0.99997 (block 32: 31 MB, 105 ms, 0.99998; 4-bit block 32: cosine 0.998). The
runtime keeps every graph it runs in memory, so this is most of what separates a batch-1 run from
the 0.5 GB it is meant to fit in. Its effect on the mel is measured by fidelity like any other
quantization (`fidelity.mel`: each artifact's own Decoder on the hidden states).
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

from chattts_forge.errors import ForgeError
from chattts_forge.quantize.int4 import initializers_in_use_order

BITS = 8
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4


def quantize_decoder(src: Path, dst: Path) -> dict[str, Any]:
    """Write the Decoder at `src` with weight-only INT8 MatMuls to `dst` (inline; the stage moves
    its weights to external data at the end). Returns the options record for artifact.json."""
    model = onnx.load(str(src))
    counts = {"MatMul": 0, "Conv": 0}
    inits = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in counts and len(node.input) > 1 and node.input[1] in inits:
            counts[node.op_type] += 1
    if counts["MatMul"] == 0:
        raise ForgeError(f"{src.name}: no MatMul with a constant weight to quantize (is it ChatTTS's Decoder?)")
    config = DefaultWeightOnlyQuantConfig(
        block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL, bits=BITS,
        quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",),
    )
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # onnxruntime's quantizer logs per node through the root logger
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantizer = MatMulNBitsQuantizer(model, bits=BITS, block_size=BLOCK_SIZE, is_symmetric=True,
                                             accuracy_level=ACCURACY_LEVEL, algo_config=config)
            quantizer.process()
        out = getattr(quantizer.model, "model", quantizer.model)
        initializers_in_use_order(out)  # the same bytes on every run
        dst.write_bytes(out.SerializeToString())
    except Exception as e:  # onnxruntime raises its own exception types
        raise ForgeError(f"weight-only INT8 quantization of {src.name} failed: {str(e).splitlines()[0]}") from None
    finally:
        root.setLevel(level)
    quantized = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    return {
        "weights": "int8",
        "method": "weight-only, round to nearest (onnxruntime MatMulNBits)",
        "bits": BITS,
        "block_size": BLOCK_SIZE,
        "accuracy_level": ACCURACY_LEVEL,
        "symmetric": True,
        "matmuls_quantized": quantized,
        "kept_fp32": f"{counts['Conv']} Conv (depthwise, input and output convolutions), norms, activations",
    }
