"""SmoothQuant-style migration for static INT8: activation range moved into the weights, per input channel.

A static per-tensor activation scale is set by the largest channel of the MatMul input, so the
channels that are usually small are quantized with a few of the 8 bits. SmoothQuant (Xiao et al.,
2023) divides input channel j by s_j and multiplies row j of every consuming weight by s_j, which
leaves the product unchanged in exact arithmetic:

    s_j = max|x_j| ** alpha / max_k |W_jk| ** (1 - alpha)

max|x_j| is calibrate's streamed per-channel absmax (`TensorStats.absmax`); a weight row of every
MatMul reading x (q, k and v of gpt.onnx share one input: one s for all three, the same s the packed
QKV of the fused graph gets, so both graphs stay alike). 1/s is folded into the normalization that
produces x where there is one (RMSNormalization, SkipSimplifiedLayerNormalization or the plain
graph's Mul by its weight), else a Mul node is inserted before the QuantizeLinear.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from chattts_forge.errors import BadInput, ForgeError

# s stays within these bounds: a channel that never fired (absmax 0) keeps s = 1.
SCALE_BOUNDS = (1e-4, 1e4)
# The producer ops whose weight input (the index) scales output 0 per channel, so 1/s folds into it.
FOLDABLE = {"RMSNormalization": 1, "SkipSimplifiedLayerNormalization": 2, "SimplifiedLayerNormalization": 1}


def check_alpha(alpha: float | None) -> None:
    if alpha is not None and not 0.0 <= alpha <= 1.0:
        raise BadInput(f"--smooth-alpha must be within 0..1, got {alpha}")


def smoothing_factors(absmax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """s per input channel of an activation read by `weights` ([in, out] each)."""
    wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0).astype(np.float64)
    amax = np.asarray(absmax, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = amax**alpha / wmax ** (1.0 - alpha)
    s = np.where((amax > 0) & (wmax > 0) & np.isfinite(s), s, 1.0)
    return np.clip(s, *SCALE_BOUNDS).astype(np.float32)


@dataclass
class Smoothed:
    """What `smooth_inputs` did: per original activation, the tensor now quantized and its range."""

    inputs: dict[str, str]  # activation -> the (smoothed) tensor the MatMuls read now
    ranges: dict[str, tuple[float, float]]  # keyed by the new tensor names
    folded: int
    mul_nodes: int

    def record(self, alpha: float) -> dict[str, Any]:
        return {"alpha": alpha, "activations": len(self.inputs), "folded_into_normalization": self.folded,
                "mul_nodes": self.mul_nodes,
                "factors_from": "per-channel absmax of each MatMul input (streamed calibration statistics)"}


def _foldable_weight(producer: onnx.NodeProto | None, x: str, readers: int, uses: Mapping[str, int],
                     inits: Mapping[str, onnx.TensorProto]) -> str | None:
    """The per-channel weight initializer of `producer` (the node writing `x`) when 1/s can be folded
    into it: x has no reader but the `readers` smoothed MatMuls, the weight no other user.
    `uses`: how many node inputs read each tensor (graph outputs counted)."""
    if producer is None or uses.get(x, 0) != readers:
        return None
    if producer.op_type in FOLDABLE and producer.output[0] == x:
        name = producer.input[FOLDABLE[producer.op_type]]
    elif producer.op_type == "Mul":
        name = next((i for i in producer.input if i in inits and len(inits[i].dims) == 1), None)
    else:
        return None
    if name is None or name not in inits or uses.get(name, 0) != 1:
        return None  # shared with another node: folding would change it too
    return name


def smooth_inputs(model: onnx.ModelProto, nodes: list[onnx.NodeProto], stats: dict[str, Any],
                  ranges: dict[str, tuple[float, float]], alpha: float) -> Smoothed:
    """Migrate the activation range of every input of `nodes` (constant-weight MatMuls of `model`)
    into their weights, in place; `stats`: TensorStats per input, `ranges`: their minmax ranges (only
    their signs are read: the migrated range is the largest max|x_j| / s_j)."""
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        readers.setdefault(n.input[0], []).append(n)
    producers = {o: n for n in model.graph.node for o in n.output}
    uses: dict[str, int] = {}  # node inputs reading each tensor, and a graph output as one more
    for name in [i for n in model.graph.node for i in n.input] + [o.name for o in model.graph.output]:
        uses[name] = uses.get(name, 0) + 1
    out = Smoothed({}, {}, 0, 0)
    inserted: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []  # (mul, the first reader)
    for x, group in readers.items():
        weights = [numpy_helper.to_array(inits[n.input[1]]).astype(np.float32) for n in group]
        if any(uses[n.input[1]] != 1 for n in group):
            raise ForgeError(f"a weight read by {group[0].name} is shared with another node: cannot smooth it")
        s = smoothing_factors(stats[x].absmax, weights, alpha)
        for n, w in zip(group, weights, strict=True):
            inits[n.input[1]].CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), n.input[1]))
        lo, hi = ranges[x]
        m = float(np.max(np.asarray(stats[x].absmax, np.float64) / s))
        new_range = (-m if lo < 0 else 0.0, m if hi > 0 else 0.0)
        folded = _foldable_weight(producers.get(x), x, len(group), uses, inits)
        if folded is not None:
            gamma = numpy_helper.to_array(inits[folded]).astype(np.float32)
            if gamma.shape != s.shape:
                folded = None
        if folded is not None:
            inits[folded].CopyFrom(numpy_helper.from_array((gamma / s).astype(np.float32), folded))
            out.inputs[x], out.ranges[x] = x, new_range
            out.folded += 1
            continue
        base = x.replace("/", "_").strip("_")
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{base}_smooth_inverse")
        model.graph.initializer.append(inv)
        smoothed = f"{x}_smoothed"
        inserted.append((helper.make_node("Mul", [x, inv.name], [smoothed], name=f"{base}_smooth"), group[0]))
        for n in group:
            n.input[0] = smoothed
        out.inputs[x], out.ranges[smoothed] = smoothed, new_range
        out.mul_nodes += 1
    if inserted:  # each Mul right before the first MatMul reading its output (keeps the order topological)
        before = {reader.name: mul for mul, reader in inserted}
        order: list[onnx.NodeProto] = []
        for n in model.graph.node:
            if n.name in before:
                order.append(before[n.name])
            order.append(n)
        model.graph.ClearField("node")
        model.graph.node.extend(order)
    return out
