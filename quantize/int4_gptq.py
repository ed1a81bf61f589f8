"""GPTQ INT4 from calibrate's streamed Hessians (numpy), in RTN's MatMulNBits layout.

onnxruntime's GPTQ (`GPTQWeightOnlyQuantConfig`) runs the graph over a calibration reader and
builds its own Hessians; here they are the X^T X that `calibrate` already streamed per MatMul input
(`TensorStats.xtx`, over every recorded step of every sentence), so quantize reads statistics, not
raw tensors. Per MatMul weight W [K, N] (y = x W) and H = E[x x^T] + damping:

- the columns of W^T (input channels k) are quantized in order; each one's rounding error, divided
  by the Cholesky factor U of H^-1 (U[k, k]), is carried onto the channels not yet quantized
  (W^T[:, j] -= err * U[k, j]): Frantar et al.'s GPTQ with lazy batches of `LAZY_BATCH` columns;
- each block of `block_size` input channels gets a symmetric scale (zero point 8) chosen from the
  weights as they are when the block is reached (error already carried in) by the importance
  search of `int4_importance.block_scales`, weighted by H's diagonal; the graph is RTN's (same
  nodes, block size, accuracy level; speed is RTN's);
- H is block-diagonal when calibrate kept it so (`HESSIAN_BLOCK`: the 3072-wide down_proj inputs in
  768-channel blocks): each diagonal block is its own GPTQ problem, errors are carried within it.

The fused graph's MatMul inputs are gpt.onnx's activations (`statistics.match_tensors`): its fused
qkv / gate_up weights are the concatenated q, k, v / gate, up weights, and GPTQ treats every output
column alone given H, so the same Hessian gives the same numbers. `GptqMemo` keeps each output
column's result by (Hessian block, column) while gpt.onnx is quantized, so the fused graph's columns
are looked up instead of solved a second time (half of GPTQ's time; the two graphs' codes are then
equal bit for bit, where solving again could differ in a rounding tie).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import GPT
from chattts_forge.calibration_data.statistics import match_tensors
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.quantize.int4_importance import block_scales, pack_int4, rewrite_rtn_blocks

PERCDAMP = 0.01  # damping, a share of the mean diagonal of H (GPTQ's and onnxruntime's default)
LAZY_BATCH = 128  # columns updated together before the rest of the matrix is touched


def _inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of H^-1 (GPTQ's `Hinv`), damped until H is positive definite."""
    diag_mean = float(np.mean(np.diag(h))) or 1.0
    damp = PERCDAMP * diag_mean
    for _ in range(6):
        try:
            hd = h + damp * np.eye(len(h))
            inv = np.linalg.inv(np.linalg.cholesky(hd))  # L^-1, H^-1 = L^-T L^-1
            return np.linalg.cholesky(inv.T @ inv).T
        except np.linalg.LinAlgError:
            damp *= 10.0
    raise ForgeError("GPTQ: the calibration Hessian is not positive definite even when damped")


def gptq_columns(wt: np.ndarray, h: np.ndarray, block_size: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ of W^T's columns `wt` [N, b] (input channels offset .. offset + b of the whole weight)
    under H [b, b]; the quantization blocks start every `block_size` channels of the whole weight.
    Returns the 4-bit codes [N, b] (0..15) and the scale of each channel's block [N, b]."""
    wt = wt.astype(np.float64, copy=True)
    h = h.astype(np.float64, copy=True)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    wt[:, dead] = 0.0
    u = _inverse_cholesky(h)
    n, b = wt.shape
    codes = np.zeros((n, b), np.uint8)
    scales = np.zeros((n, b), np.float64)
    scale = np.ones(n)
    for i0 in range(0, b, LAZY_BATCH):
        i1 = min(i0 + LAZY_BATCH, b)
        err = np.zeros((n, i1 - i0))
        for i in range(i0, i1):
            if (offset + i) % block_size == 0 or i == 0:  # a new block: its scale from the current weights
                end = min(i + block_size - (offset + i) % block_size, b)
                scale = block_scales(wt[:, i:end], np.diag(h)[i:end])[:, 0]
            q = np.clip(np.rint(wt[:, i] / scale) + 8, 0, 15)
            codes[:, i], scales[:, i] = q, scale
            e = (wt[:, i] - (q - 8) * scale) / u[i, i]
            wt[:, i + 1 : i1] -= np.outer(e, u[i, i + 1 : i1])
            err[:, i - i0] = e
        wt[:, i1:] -= err @ u[i0:i1, i1:]
    return codes, scales


class GptqMemo:
    """GPTQ's result per output column (one row of W^T over one Hessian block), keyed by the block's and
    the column's bytes: an identical column under an identical Hessian has the identical result."""

    def __init__(self) -> None:
        self.columns: dict[tuple[bytes, int, int, bytes], tuple[np.ndarray, np.ndarray]] = {}
        self.hits = 0

    def solve(self, wt: np.ndarray, h: np.ndarray, block_size: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """`gptq_columns(wt, h, block_size, offset)`, solving only the rows not seen before."""
        hkey = hashlib.sha256(np.ascontiguousarray(h).tobytes()).digest()
        keys = [(hkey, offset, block_size, row.tobytes()) for row in np.ascontiguousarray(wt)]
        todo = [i for i, k in enumerate(keys) if k not in self.columns]
        if todo:
            codes, scales = gptq_columns(wt[todo], h, block_size, offset)
            for j, i in enumerate(todo):
                self.columns[keys[i]] = (codes[j], scales[j].astype(np.float32))
        self.hits += len(keys) - len(todo)
        rows = [self.columns[k] for k in keys]
        return np.stack([c for c, _ in rows]), np.stack([s for _, s in rows]).astype(np.float64)


def gptq_blocks(w: np.ndarray, hessian: np.ndarray, block_size: int,
                memo: GptqMemo | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Packed 4-bit blocks [N, blocks, block/2] and scales [N, blocks] of a MatMul weight w [K, N];
    `hessian` [hblocks, hb, hb]: E[x x^T] of its input, block-diagonal (hblocks * hb == K); `memo`:
    columns already solved under the same Hessian are reused (`GptqMemo`)."""
    k, n = w.shape
    hblocks, hb, _ = hessian.shape
    if hblocks * hb != k:
        raise ForgeError(f"GPTQ: a Hessian of {hblocks} x {hb} channels for a weight of {k} input channels")
    if hblocks > 1 and hb % block_size:
        raise BadInput(f"GPTQ: --block-size {block_size} does not divide the Hessian blocks of {hb} channels")
    codes = np.zeros((n, k), np.uint8)
    scales = np.zeros((n, k), np.float64)
    for j in range(hblocks):
        sl = slice(j * hb, (j + 1) * hb)
        solve = memo.solve if memo is not None else gptq_columns
        codes[:, sl], scales[:, sl] = solve(w[sl].T, hessian[j], block_size, j * hb)
    blocks = -(-k // block_size)
    pad = blocks * block_size - k
    q = np.pad(codes, ((0, 0), (0, pad)), constant_values=8).reshape(n, blocks, block_size)
    return pack_int4(q), scales[:, ::block_size].astype(np.float32)


def quantize_gptq_int4_graph(src: Path, dst: Path, hessians: Mapping[str, np.ndarray], block_size: int = 128,
                             accuracy_level: int = 4, exclude_nodes: list[str] | None = None,
                             rows: int = 0, memo: GptqMemo | None = None) -> dict[str, Any]:
    """RTN's MatMulNBits graph of `src` with GPTQ blocks; `hessians`: per MatMul input tensor of `src`,
    E[x x^T] in diagonal blocks (calibrate's statistics). `rows`: how many activation rows they saw;
    `memo`: shared by the graphs of one artifact, so a column is solved once (`GptqMemo`)."""

    def blocks(node: str, x_name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if x_name not in hessians:
            raise ForgeError(f"no Hessian for {x_name} (input of {node}); re-run `calibrate`")
        return gptq_blocks(w, hessians[x_name], block_size, memo)

    record, done = rewrite_rtn_blocks(src, dst, block_size, accuracy_level, exclude_nodes, blocks)
    record.update(algorithm="gptq", symmetric=True, gptq_matmuls=done, percdamp=PERCDAMP, actorder=False,
                  hessian="X^T X of each MatMul input streamed by calibrate (block-diagonal where stored so)",
                  hessian_blocks=sorted({int(h.shape[1]) for h in hessians.values()}), calibration_rows=rows)
    return record


def graph_hessians(stats: Any, graph: str) -> tuple[dict[str, np.ndarray], int]:
    """E[x x^T] per MatMul input of `graph` from calibration `Statistics`, and the rows they saw: the
    graph's own X^T X, or, for a graph calibrate kept none for (the fused GPT), those of the gpt.onnx
    tensor that is the same activation (`match_tensors`)."""
    tensors = stats.tensors(graph)
    own = {name: st for name, st in tensors.items() if st.xtx is not None}
    if len(own) == len(tensors):
        return {name: st.hessian() for name, st in own.items()}, max((st.rows for st in own.values()), default=0)
    if graph == GPT or GPT not in stats.graphs:
        raise ForgeError(f"the calibration statistics of {graph} hold no X^T X (GPTQ's Hessians): re-run `calibrate`")
    plain = {name: st for name, st in stats.tensors(GPT).items() if st.xtx is not None}
    recorded = stats.source_tensors(graph)  # calibrate derived this graph's statistics from gpt's
    matched = recorded[1] if recorded and recorded[0] == GPT else match_tensors(plain, tensors)
    matched = {k: v for k, v in matched.items() if v in plain}
    missing = sorted(set(tensors) - set(matched))
    if missing:
        raise ForgeError(f"GPTQ: {len(missing)} MatMul input(s) of {graph} match no gpt.onnx activation in the "
                         f"calibration statistics (first: {missing[0]}); re-run `calibrate`")
    return ({name: plain[src].hessian() for name, src in matched.items()},
            max((plain[src].rows for src in matched.values()), default=0))
