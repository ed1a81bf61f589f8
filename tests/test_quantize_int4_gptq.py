"""GPTQ INT4 from streamed Hessians (quantize/int4_gptq.py): RTN's layout, error compensation under H."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from chattts_forge.errors import ForgeError
from chattts_forge.quantize.int4 import quantize_int4_graph
from chattts_forge.quantize.int4_gptq import gptq_blocks, quantize_gptq_int4_graph


def _dequant(packed: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    n, blocks, half = packed.shape
    q = np.stack([packed & 15, packed >> 4], -1).reshape(n, blocks, 2 * half).astype(np.float64)
    return ((q - 8) * scales[:, :, None]).reshape(n, -1)[:, :k].T  # [K, N]


def _matmul_model(path: Path, w: np.ndarray) -> Path:
    k, n = w.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_identity_hessian_carries_no_error(tmp_path: Path):
    """With H = I no error is carried: GPTQ's blocks are the scale search's with even importance, byte
    for byte, and their error is below onnxruntime's symmetric RTN."""
    from chattts_forge.quantize.int4_importance import importance_blocks

    w = np.random.default_rng(0).normal(size=(64, 48)).astype(np.float32)
    packed, scales = gptq_blocks(w, np.eye(64)[None], 32)
    searched = importance_blocks(w, np.ones(64), 32)
    np.testing.assert_array_equal(packed, searched[0])
    np.testing.assert_array_equal(scales, searched[1])
    src = _matmul_model(tmp_path / "mm.onnx", w)
    quantize_int4_graph(src, tmp_path / "rtn.onnx", block_size=32, algorithm="rtn")
    rtn = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "rtn.onnx")).graph.initializer}
    err = ((w - _dequant(packed, scales, 64)) ** 2).sum()
    assert err < ((w - _dequant(rtn["W_Q4"], rtn["W_scales"], 64)) ** 2).sum()


def test_correlated_inputs_lower_the_output_error_and_blocks_stay_apart():
    """Under correlated activations GPTQ's output error E|x (W - Q)|^2 = tr((W-Q)^T H (W-Q)) is below
    RTN's; a block-diagonal H is two independent problems (each block alone gives the same codes)."""
    rng = np.random.default_rng(1)
    k, n = 64, 40
    w = rng.normal(size=(k, n)).astype(np.float32)
    mix = rng.normal(size=(k, k)) * 0.3 + np.eye(k)
    x = rng.normal(size=(4000, k)) @ mix
    h = x.T @ x / len(x)

    def out_err(packed, scales, hess):
        d = w - _dequant(packed, scales, k)
        return float(np.trace(d.T @ hess @ d))

    rtn = gptq_blocks(w, np.eye(k)[None], 16)  # no error carried (the scale search only)
    gptq = gptq_blocks(w, h[None], 16)
    assert out_err(*gptq, h) < 0.8 * out_err(*rtn, h)
    halves = np.stack([h[:32, :32], h[32:, 32:]])
    both = gptq_blocks(w, halves, 16)
    first = gptq_blocks(w[:32], h[None, :32, :32], 16)
    np.testing.assert_array_equal(both[0][:, :2], first[0])
    with pytest.raises(ForgeError, match="Hessian"):
        gptq_blocks(w, np.eye(32)[None], 16)


def test_graph_is_rtns_layout_with_gptq_blocks(tmp_path: Path):
    w = np.random.default_rng(2).normal(size=(64, 24)).astype(np.float32)
    src = _matmul_model(tmp_path / "mm.onnx", w)
    x = np.random.default_rng(3).normal(size=(500, 64)) @ (np.eye(64) + 0.5)
    rec = quantize_gptq_int4_graph(src, tmp_path / "g.onnx", {"x": (x.T @ x / len(x))[None]}, block_size=32, rows=500)
    assert rec["algorithm"] == "gptq" and rec["gptq_matmuls"] == 1 and rec["calibration_rows"] == 500
    assert [n.op_type for n in onnx.load(str(tmp_path / "g.onnx")).graph.node] == ["MatMulNBits"]
    with pytest.raises(ForgeError, match="no Hessian for x"):
        quantize_gptq_int4_graph(src, tmp_path / "h.onnx", {}, block_size=32)


def test_memo_solves_a_column_once_and_fused_weights_match_their_parts():
    """The fused graph's qkv weight is q, k, v side by side under the same Hessian: with the memo its
    columns are looked up, not solved again, and its blocks are the parts' blocks column for column."""
    from chattts_forge.quantize.int4_gptq import GptqMemo

    rng = np.random.default_rng(3)
    x = rng.normal(size=(256, 64))
    h = (x.T @ x / len(x))[None]
    q, k = rng.normal(size=(64, 24)).astype(np.float32), rng.normal(size=(64, 8)).astype(np.float32)
    memo = GptqMemo()
    parts = [gptq_blocks(w, h, 16, memo) for w in (q, k)]
    assert memo.hits == 0
    fused = gptq_blocks(np.concatenate([q, k], axis=1), h, 16, memo)
    assert memo.hits == 32  # every column of the fused weight was known
    np.testing.assert_array_equal(fused[0], np.concatenate([p[0] for p in parts]))
    np.testing.assert_array_equal(fused[1], np.concatenate([p[1] for p in parts]))
    # and the memo gives what solving without it gives
    alone = gptq_blocks(q, h, 16)
    np.testing.assert_array_equal(alone[0], parts[0][0])
    np.testing.assert_allclose(alone[1], parts[0][1], rtol=1e-6)
