"""Weight-only INT8 for the Decoder: its pointwise MatMuls as 8-bit MatMulNBits, convolutions FP32.

The Decoder (ChatTTS's DVAE decoder on GPT hidden states) is 12 ConvNeXt blocks whose two
pointwise projections (512 -> 2048 -> 512, `nn.Linear`) hold 97% of its 104 MB; the depthwise and
in/out convolutions are small. Dynamic INT8 would turn the convolutions into ConvInteger (a slow
onnxruntime CPU path), so only the MatMuls are quantized, weight-only: 8-bit symmetric blocks of
`BLOCK_SIZE` along the input dimension (round to nearest), run by onnxruntime's MatMulNBits.

The compute precision decides whether streaming stays exact. A stream decodes each chunk in a window
(runtime.StreamDecoder); the convolutions over a shorter window round differently in the last bits
(~1e-6), and with int8 activations (`accuracy_level` 4) such a difference can move an activation
across a rounding boundary, a whole int8 step, which twelve blocks amplify: the streamed mel is then
no longer the whole-text mel (45 dB instead of 124 dB at full size, under the gate's 60 dB seam rule).
With float compute (`ACCURACY_LEVEL` 1, the default `--decoder int8`) the weights are dequantized and
the activations never rounded, so the stream is as exact as FP32's; `--decoder int8-a8` keeps int8
compute for its speed. Figures (time, size, stream SNR per option):
docs/measurements/2026-12-02-epyc/README.md#the-decoder.
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
ACCURACY_LEVEL = 1  # fp32 compute: window-independent, so streams stay exact
INT8_ACCURACY_LEVEL = 4  # int8 activations (--decoder int8-a8)


def quantize_decoder(src: Path, dst: Path, int8_activations: bool = False) -> dict[str, Any]:
    """Write the Decoder at `src` with weight-only INT8 MatMuls to `dst` (inline; the stage moves
    its weights to external data at the end), computed in float unless `int8_activations`.
    Returns the options record for artifact.json."""
    level = INT8_ACCURACY_LEVEL if int8_activations else ACCURACY_LEVEL
    model = onnx.load(str(src))
    counts = {"MatMul": 0, "Conv": 0}
    inits = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in counts and len(node.input) > 1 and node.input[1] in inits:
            counts[node.op_type] += 1
    if counts["MatMul"] == 0:
        raise ForgeError(f"{src.name}: no MatMul with a constant weight to quantize (is it ChatTTS's Decoder?)")
    config = DefaultWeightOnlyQuantConfig(
        block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=level, bits=BITS,
        quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",),
    )
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # onnxruntime's quantizer logs per node through the root logger
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantizer = MatMulNBitsQuantizer(model, bits=BITS, block_size=BLOCK_SIZE, is_symmetric=True,
                                             accuracy_level=level, algo_config=config)
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
        "accuracy_level": level,
        "compute": "int8" if int8_activations else "fp32",  # int8 activations: streams are inexact
        "symmetric": True,
        "matmuls_quantized": quantized,
        "kept_fp32": f"{counts['Conv']} Conv (depthwise, input and output convolutions), norms, activations",
    }
