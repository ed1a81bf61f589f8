"""Importance-weighted INT4 (imatrix-style): each block's scale chosen to minimise the rounding error
weighted by how large its input channels are, from calibrate's streamed statistics.

onnxruntime's symmetric RTN (`int4.py`, `rtn`) sets every block's scale from its largest weight
(scale = w_max / -8, zero point 8). Like llama.cpp's importance matrix (`make_qx_quants`), this
tries, per block and output column, smaller scales with the largest weight at either end of the
code range (-8 or +7), refits each candidate's scale to its codes by weighted least squares, and
keeps the one with the least error sum_k E[x_k^2] (w_kn - s (q_kn - 8))^2, where E[x_k^2] is the
mean square of input channel k of the MatMul (`TensorStats.mean_square`): a weight on a channel
that is usually near zero matters little. GPTQ (`int4_gptq.py`) picks its block scales the same way.
The graph is RTN's (same MatMulNBits nodes, block size and accuracy level); only the packed weights
and scales change, so speed is RTN's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from chattts_forge.calibration_data.observe import const_weight_matmuls
from chattts_forge.errors import ForgeError
from chattts_forge.progress import Progress
from chattts_forge.quantize.int4 import quantize_int4_graph

# Candidate scales, as fractions of RTN's: measured on the tiny checkpoint, the chosen ones lie in 0.8-1.0.
SCALE_GRID = tuple(np.round(np.arange(1.0, 0.69, -0.025), 3))


def block_scales(w: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """The symmetric 4-bit scale of each block of `w` (a block: the values along axis 1) with the
    least importance-weighted rounding error; `importance` broadcasts against `w`. Returns the
    scales with axis 1 kept (size 1); an all-zero block gets 1."""
    w = w.astype(np.float64)
    signed_max = np.take_along_axis(w, np.abs(w).argmax(axis=1)[:, None], axis=1)  # RTN's reference weight
    best_scale = np.where(signed_max == 0, 1.0, signed_max / -8.0)
    best_err = np.full(signed_max.shape, np.inf)
    for base in (signed_max / -8.0, signed_max / 7.0):  # the largest weight at code 0 or at code 15
        for frac in SCALE_GRID:
            s = base * frac
            codes = np.clip(np.rint(w / np.where(s == 0, 1.0, s)) + 8, 0, 15) - 8
            den = (importance * codes * codes).sum(axis=1, keepdims=True)
            fit = np.where(den > 0, (importance * w * codes).sum(axis=1, keepdims=True) / np.where(den > 0, den, 1), 0)
            err = (importance * (w - codes * fit) ** 2).sum(axis=1, keepdims=True)
            better = (err < best_err) & (fit != 0)
            best_err = np.where(better, err, best_err)
            best_scale = np.where(better, fit, best_scale)
    return best_scale


def importance_blocks(w: np.ndarray, importance: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed 4-bit blocks [N, blocks, block/2] and scales [N, blocks] of a MatMul weight w [K, N]."""
    k, n = w.shape
    blocks = -(-k // block_size)
    pad = blocks * block_size - k
    wp = np.pad(w, ((0, pad), (0, 0))).reshape(blocks, block_size, n)  # [b, j, n]
    imp = np.pad(np.maximum(importance, 0), (0, pad)).reshape(blocks, block_size, 1)
    scale = block_scales(wp, imp)  # [b, 1, n]
    q = np.clip(np.rint(wp / scale) + 8, 0, 15).astype(np.uint8)  # [b, j, n]
    return pack_int4(q.transpose(2, 0, 1)), scale[:, 0, :].T.astype(np.float32)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """4-bit codes [N, blocks, block] (0..15) -> MatMulNBits' packed bytes [N, blocks, block/2]
    (the even element in the low nibble)."""
    q = q.astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


BlockQuantizer = Callable[[str, str, np.ndarray], tuple[np.ndarray, np.ndarray]]


def rewrite_rtn_blocks(src: Path, dst: Path, block_size: int, accuracy_level: int, exclude_nodes: list[str] | None,
                       blocks: BlockQuantizer) -> tuple[dict[str, Any], int]:
    """onnxruntime's symmetric RTN graph of `src` at `dst`, each MatMulNBits' packed weights and scales
    replaced by `blocks(node name, input tensor, fp32 weight [K, N])`; returns RTN's record and how many
    MatMuls were rewritten."""
    record = quantize_int4_graph(src, dst, block_size, accuracy_level, symmetric=True, exclude_nodes=exclude_nodes,
                                 algorithm="rtn")
    fp32 = onnx.load(str(src))
    weights = {n.name: (n.input[0], n.input[1]) for n in const_weight_matmuls(fp32)}
    inits = {i.name: i for i in fp32.graph.initializer}
    model = onnx.load(str(dst))
    qinits = {i.name: i for i in model.graph.initializer}
    todo = [(node, weights[node.name[: -len("_Q4")]]) for node in model.graph.node
            if node.op_type == "MatMulNBits" and node.name.endswith("_Q4") and node.name[: -len("_Q4")] in weights]
    # GPTQ solves minutes of columns at full size: done / total, rate and ETA in a build's log
    with Progress(len(todo), f"int4 blocks of {src.name}", "MatMul") as bar:
        for node, (x_name, w_name) in todo:
            packed, scales = blocks(node.name, x_name, numpy_helper.to_array(inits[w_name]).astype(np.float32))
            for name, arr in ((node.input[1], packed), (node.input[2], scales)):
                if tuple(qinits[name].dims) != arr.shape:
                    raise ForgeError(f"{node.name}: onnxruntime's MatMulNBits layout changed ({name} {list(qinits[name].dims)})")
                qinits[name].CopyFrom(numpy_helper.from_array(arr, name))
            bar.update(1)
    onnx.save(model, str(dst))
    return record, len(todo)


def quantize_importance_int4_graph(src: Path, dst: Path, mean_square: dict[str, np.ndarray], block_size: int = 128,
                                   accuracy_level: int = 4, exclude_nodes: list[str] | None = None) -> dict[str, Any]:
    """RTN's MatMulNBits graph of `src` with importance-weighted blocks; `mean_square`: per MatMul input
    tensor, E[x^2] per channel (calibrate's statistics of this very graph)."""

    def blocks(node: str, x_name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if x_name not in mean_square:
            raise ForgeError(f"no importance statistics for {x_name} (input of {node}); re-run `calibrate`")
        return importance_blocks(w, mean_square[x_name].astype(np.float64), block_size)

    record, done = rewrite_rtn_blocks(src, dst, block_size, accuracy_level, exclude_nodes, blocks)
    record.update(algorithm="importance", symmetric=True, importance_matmuls=done,
                  importance="per-channel mean square of each MatMul input (streamed calibration statistics)",
                  scale_grid=[float(f) for f in SCALE_GRID], scale_fit="weighted least squares per candidate")
    return record
