"""Weighted rounding error of INT4 block algorithms on the full GPT's weights (no ORT): a proxy.

    python int4_proxy.py FP32 CALIB BLOCK
Per MatMul: diag error sum_k E[x_k^2] (w-q)^2 and full error tr((W-Q)^T H (W-Q)) with calibrate's Hessian.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from chattts_forge.calibration_data.observe import const_weight_matmuls
from chattts_forge.calibration_data.statistics import Statistics
from chattts_forge.quantize.int4_gptq import gptq_blocks
from chattts_forge.quantize.int4_importance import SCALE_GRID, importance_blocks

fp32, calib, bs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
algos = sys.argv[4].split(",") if len(sys.argv) > 4 else ["rtn", "imp", "imp2"]
stats = Statistics.load(calib / "statistics.npz")
t = stats.tensors("gpt")
m = onnx.load(str(fp32 / "gpt.onnx"))
inits = {i.name: i for i in m.graph.initializer}


def unpack(packed, scales, k):
    lo = packed & 0x0F
    hi = packed >> 4
    q = (
        np.stack([lo, hi], -1).reshape(packed.shape[0], packed.shape[1], -1).astype(np.float64)
    )  # [N, b, block]
    return q, scales


def dequant_sym(packed, scales, k):
    q, s = unpack(packed, scales, k)
    w = (q - 8) * s[:, :, None]
    return w.reshape(w.shape[0], -1)[:, :k].T  # [K, N]


def rtn(w, bsz):
    k, n = w.shape
    b = -(-k // bsz)
    wp = np.pad(w, ((0, b * bsz - k), (0, 0))).reshape(b, bsz, n)
    idx = np.abs(wp).argmax(1)
    smax = np.take_along_axis(wp, idx[:, None, :], 1)[:, 0, :]
    s = smax / -8.0
    safe = np.where(s == 0, 1, s)
    q = np.clip(np.rint(wp / safe[:, None, :]) + 8, 0, 15)
    return ((q - 8) * s[:, None, :]).reshape(b * bsz, n)[:k]


def imp2(w, imp, bsz):
    k, n = w.shape
    b = -(-k // bsz)
    wp = np.pad(w, ((0, b * bsz - k), (0, 0))).reshape(b, bsz, n)
    im = np.pad(np.maximum(imp, 0), (0, b * bsz - k)).reshape(b, bsz, 1)
    idx = np.abs(wp).argmax(1)
    smax = np.take_along_axis(wp, idx[:, None, :], 1)[:, 0, :]
    best_err = np.full(smax.shape, np.inf)
    best_s = smax / -8.0
    best_q = None
    for base in (smax / -8.0, smax / 7.0):
        for frac in SCALE_GRID:
            s = base * frac
            safe = np.where(s == 0, 1, s)
            qc = np.clip(np.rint(wp / safe[:, None, :]) + 8, 0, 15) - 8
            num = (im * wp * qc).sum(1)
            den = (im * qc * qc).sum(1)
            s2 = np.where(den > 0, num / np.where(den > 0, den, 1), s)
            err = (im * (wp - qc * s2[:, None, :]) ** 2).sum(1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s2, best_s)
            best_q = qc if best_q is None else np.where(better[:, None, :], qc, best_q)
    return (best_q * best_s[:, None, :]).reshape(b * bsz, n)[:k]


def search_scale(block, imp):
    """block [n, bsz] (rows = output columns), imp [bsz]: best symmetric scale per row (grid, both sides, LS)."""
    smax = block[np.arange(block.shape[0]), np.abs(block).argmax(1)]
    best_err = np.full(smax.shape, np.inf)
    best_s = np.where(smax == 0, 1.0, smax / -8.0)
    for base in (smax / -8.0, smax / 7.0):
        for frac in SCALE_GRID:
            s = base * frac
            safe = np.where(s == 0, 1, s)
            qc = np.clip(np.rint(block / safe[:, None]) + 8, 0, 15) - 8
            num = (imp * block * qc).sum(1)
            den = (imp * qc * qc).sum(1)
            s2 = np.where(den > 0, num / np.where(den > 0, den, 1), s)
            err = (imp * (block - qc * s2[:, None]) ** 2).sum(1)
            better = (err < best_err) & (s2 != 0)
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s2, best_s)
    return best_s


import chattts_forge.quantize.int4_gptq as G  # noqa: E402 (after the helpers it measures against, as the script ran)


def gptq2_columns(wt, h, block_size, offset=0):
    wt = wt.astype(np.float64, copy=True)
    h = h.astype(np.float64, copy=True)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    wt[:, dead] = 0.0
    u = G._inverse_cholesky(h)
    n, b = wt.shape
    codes = np.zeros((n, b), np.uint8)
    scales = np.zeros((n, b))
    scale = np.ones(n)
    dh = np.diag(h)
    for i0 in range(0, b, G.LAZY_BATCH):
        i1 = min(i0 + G.LAZY_BATCH, b)
        err = np.zeros((n, i1 - i0))
        for i in range(i0, i1):
            if (offset + i) % block_size == 0 or i == 0:
                end = min(i + block_size - (offset + i) % block_size, b)
                scale = search_scale(wt[:, i:end], dh[i:end])
            q = np.clip(np.rint(wt[:, i] / scale) + 8, 0, 15)
            codes[:, i], scales[:, i] = q, scale
            e = (wt[:, i] - (q - 8) * scale) / u[i, i]
            wt[:, i + 1 : i1] -= np.outer(e, u[i, i + 1 : i1])
            err[:, i - i0] = e
        wt[:, i1:] -= err @ u[i0:i1, i1:]
    return codes, scales


tot = {}
t0 = time.time()
for node in const_weight_matmuls(m):
    x = node.input[0]
    w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
    ms = t[x].mean_square.astype(np.float64)
    H = t[x].hessian() if t[x].xtx is not None else None
    outs = {}
    for a in algos:
        if a == "rtn":
            q = rtn(w, bs)
        elif a == "imp":
            p, s = importance_blocks(w.astype(np.float32), ms, bs)
            q = dequant_sym(p, s.astype(np.float64), w.shape[0])
        elif a == "imp2":
            q = imp2(w, ms, bs)
        elif a == "gptq2":
            orig = G.gptq_columns
            G.gptq_columns = gptq2_columns
            try:
                p, s = gptq_blocks(w.astype(np.float32), H, bs)
            finally:
                G.gptq_columns = orig
            q = dequant_sym(p, s.astype(np.float64), w.shape[0])
        elif a == "gptq":
            p, s = gptq_blocks(w.astype(np.float32), H, bs)
            q = dequant_sym(p, s.astype(np.float64), w.shape[0])
        d = w - q
        diag = float((ms[:, None] * d * d).sum())
        full = 0.0
        if H is not None:
            hb = H.shape[1]
            for j in range(H.shape[0]):
                dj = d[j * hb : (j + 1) * hb]
                full += float(np.einsum("kn,kl,ln->", dj, H[j], dj))
        tot.setdefault(a, [0.0, 0.0])
        tot[a][0] += diag
        tot[a][1] += full
print(
    json.dumps(
        {a: {"diag": v[0], "full": v[1], "vs_rtn_full": v[1] / tot["rtn"][1]} for a, v in tot.items()}
    ),
    f"{time.time() - t0:.0f}s",
)
