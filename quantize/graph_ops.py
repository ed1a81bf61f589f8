"""What a graph's ops say about its quantization: the quantized op types, the float ops a quantizer
could have turned into integer ones, a graph's op summary (artifact.json `quantization`) and the
MatMuls whose weight is a constant (what weight quantizers touch). Nothing here imports torch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import onnx

# Op types that carry integer / low-bit math once a graph is quantized.
INT8_OPS = {
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "QLinearMatMul",
    "MatMulIntegerToFloat",
    "ConvInteger",
    "QLinearConv",
    "QuantizeLinear",
    "DequantizeLinear",
    "QGemm",
    "QAttention",
}
INT4_OPS = {"MatMulNBits", "GatherBlockQuantized"}
QUANTIZED_OPS = INT8_OPS | INT4_OPS
# Float ops a quantizer could have turned into integer ones (for "what stayed FP32").
QUANTIZABLE_FLOAT_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather"}


def graph_summary(path: Path) -> dict[str, Any]:
    """Op-type counts of a graph, the quantized ops among them and the float ops left in FP32."""
    model = onnx.load(str(path), load_external_data=False)
    counts = Counter(n.op_type for n in model.graph.node)
    # In QDQ graphs a quantized MatMul stays a MatMul node whose weight comes from DequantizeLinear.
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    qdq_matmuls = sum(
        1
        for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm")
        and len(n.input) > 1
        and producer.get(n.input[1]) == "DequantizeLinear"
    )
    float_left = {k: v for k, v in sorted(counts.items()) if k in QUANTIZABLE_FLOAT_OPS}
    if qdq_matmuls:
        float_left["MatMul"] = float_left.get("MatMul", 0) - qdq_matmuls
        float_left = {k: v for k, v in float_left.items() if v}
    quantized = {k: v for k, v in sorted(counts.items()) if k in QUANTIZED_OPS}
    if qdq_matmuls:
        quantized["MatMul (QDQ)"] = qdq_matmuls
    return {
        "op_types": dict(sorted(counts.items())),
        "quantized_ops": quantized,
        "float_ops_left": float_left,
    }


def matmul_nodes_with_const_weight(model: onnx.ModelProto) -> list[str]:
    """Names of MatMul/Gemm nodes whose second input is an initializer (what weight quantizers touch)."""
    inits = {i.name for i in model.graph.initializer}
    # A weight may reach the MatMul through a Transpose/Identity of an initializer (TorchScript export).
    produced_from_init = {}
    for node in model.graph.node:
        if node.op_type in ("Transpose", "Identity", "Cast") and node.input and node.input[0] in inits:
            produced_from_init[node.output[0]] = node.input[0]
    consts = inits | set(produced_from_init)
    names = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in consts:
            names.append(node.name)
    return names
