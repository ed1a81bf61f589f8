"""The Decoder's weight-only INT8 MatMuls as float MatMuls, made when its session is loaded on the CPU.

Quantized variants store the Decoder's pointwise MatMuls as 8-bit MatMulNBits computed in float
(quantize.decoder: a quarter of the bytes on disk, streams exact). onnxruntime's CPU kernel for them
dequantizes the whole weight on every call, a fixed cost that a streamed chunk's short window pays in
full: at full size 30-55 ms of a 40-70 ms Decoder call on a 16-34 frame window, against 11-28 ms for
the same weights as a float MatMul (docs/measurements/2026-12-06-first-audio). Dequantizing once at
load gives the same arithmetic (the weights `(q - zero_point) * scale` in float32, products summed in
float; only the summation order differs, ~5e-7 relative) for ~3x the Decoder's weight bytes in memory
(75 MB more at full size). Nodes with int8 compute (`accuracy_level` 4, `quantize --decoder int8-a8`)
or any input this does not read (g_idx, a zero point that is not a constant) stay as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# MatMulNBits' accuracy levels whose compute is float (0: the kernel's default, 1: fp32); 4 is int8.
FLOAT_COMPUTE_LEVELS = frozenset({0, 1})
_BITS = 8  # the Decoder's weight-only INT8 (quantize.decoder.BITS); other widths are left packed


def _attributes(node: Any) -> dict[str, Any]:
    # onnx: only when a graph is read here; 1.2 s to import
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _float_compute_int8(at: dict[str, Any]) -> bool:
    """Whether a MatMulNBits node's attributes say 8-bit weights computed in float (what this unpacks)."""
    return at.get("bits", 4) == _BITS and at.get("accuracy_level", 0) in FLOAT_COMPUTE_LEVELS


def _float_weight(node: Any, inits: dict[str, Any]) -> np.ndarray | None:
    """The float32 weight [K, N] a float-compute 8-bit MatMulNBits node multiplies by, or None where
    the node is not one this module unpacks."""
    # onnx: only when a graph is read here; 1.2 s to import
    from onnx import numpy_helper

    at = _attributes(node)
    ins = list(node.input) + [""] * (6 - len(node.input))
    if (not _float_compute_int8(at) or ins[1] not in inits or ins[2] not in inits or ins[4] or (ins[3] and ins[3] not in inits)):
        return None
    k, n, block = int(at["K"]), int(at["N"]), int(at["block_size"])
    packed = numpy_helper.to_array(inits[ins[1]])
    blocks = -(-k // block)
    if packed.size != n * blocks * block:
        return None
    q = packed.reshape(n, blocks, block).astype(np.float32)
    scales = numpy_helper.to_array(inits[ins[2]]).astype(np.float32).reshape(n, blocks, 1)
    zero = (numpy_helper.to_array(inits[ins[3]]).astype(np.float32).reshape(n, blocks, 1) if ins[3]
            else np.float32(2 ** (_BITS - 1)))  # symmetric: the kernel's default zero point
    return np.ascontiguousarray(((q - zero) * scales).reshape(n, blocks * block)[:, :k].T)


def float_matmuls(model: Any) -> int:
    """Replace, in place, every float-compute 8-bit MatMulNBits of `model` (an onnx ModelProto) by a
    MatMul with its dequantized float32 weight (and an Add of its bias); the nodes replaced."""
    # onnx: only when a graph is read here; 1.2 s to import
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, weights, replaced = [], [], 0
    for node in graph.node:
        weight = _float_weight(node, inits) if node.op_type == "MatMulNBits" else None
        if weight is None:
            nodes.append(node)
            continue
        name = f"{node.input[1]}__float"
        weights.append(numpy_helper.from_array(weight, name))
        bias = node.input[5] if len(node.input) > 5 else ""
        product = f"{node.output[0]}__nobias" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name}__float"))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}__bias"))
        replaced += 1
    if not replaced:
        return 0
    used = {i for node in nodes for i in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + weights)
    return replaced


def has_float_compute_nbits(path: Path) -> bool:
    """Whether the graph at `path` holds a MatMulNBits that `float_matmuls` would replace (graph only,
    its external weights not read)."""
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return any(node.op_type == "MatMulNBits" and _float_compute_int8(_attributes(node)) for node in model.graph.node)


def float_decoder_bytes(path: Path) -> bytes | None:
    """The serialized graph at `path` with its float-compute INT8 MatMuls unpacked (external weights
    loaded from beside it), or None when it has none. Callers ask `has_float_compute_nbits` first (the
    graph alone), so the weights are read only for a graph that unpacks."""
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx

    model = onnx.load(str(path))
    if not float_matmuls(model):
        return None
    return model.SerializeToString()
