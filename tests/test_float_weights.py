"""The Decoder's weight-only INT8 MatMuls unpacked to float MatMuls at load (runtime.float_weights):
the same products as onnxruntime's MatMulNBits, int8-compute nodes left alone, and what a quantized
artifact's Decoder session is made from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from chattts_forge.artifact import DECODER
from chattts_forge.quantize.decoder import quantize_decoder
from chattts_forge.runtime.float_weights import float_decoder_bytes, float_matmuls, has_float_compute_nbits
from chattts_forge.runtime.loaded_artifact import LoadedArtifact


def _session(graph: str | bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])


def _decode(session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    return session.run(None, {"hidden_states": x})[0]


@pytest.fixture(scope="module")
def packed(tiny_artifacts, tmp_path_factory) -> Path:
    """The tiny FP32 Decoder with weight-only INT8 MatMuls computed in float (quantize's default)."""
    out = tmp_path_factory.mktemp("float-weights") / "decoder.onnx"
    record = quantize_decoder(tiny_artifacts["fp32"] / "decoder.onnx", out)
    assert record["compute"] == "fp32"
    return out


def test_unpacked_matmuls_multiply_by_the_same_weights(packed):
    model = onnx.load(str(packed))
    nbits = sum(n.op_type == "MatMulNBits" for n in model.graph.node)
    assert nbits > 0 and has_float_compute_nbits(packed)
    assert float_matmuls(model) == nbits
    assert not any(n.op_type == "MatMulNBits" for n in model.graph.node)
    unpacked, original = _session(model.SerializeToString()), _session(str(packed))
    rng = np.random.default_rng(0)
    hidden = original.get_inputs()[0].shape[1]
    for frames in (3, 17, 64):  # a stream's short windows and a longer one
        x = rng.standard_normal((1, hidden, frames)).astype(np.float32)
        want, got = _decode(original, x), _decode(unpacked, x)
        assert got.shape == want.shape
        # the same float products; only the summation order differs
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_int8_compute_nodes_stay_packed(packed):
    model = onnx.load(str(packed))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = 4  # int8 activations (quantize --decoder int8-a8): not float arithmetic
    assert float_matmuls(model) == 0
    assert any(n.op_type == "MatMulNBits" for n in model.graph.node)


def test_a_quantized_artifacts_decoder_session_is_the_unpacked_graph(tiny_kv8, tiny_artifacts):
    art = LoadedArtifact(tiny_kv8, threads=1, saved_sessions=False)
    assert art._unpacks(DECODER)
    graph = float_decoder_bytes(tiny_kv8 / "decoder.onnx")
    assert graph is not None
    x = np.random.default_rng(1).standard_normal((1, art.dims.hidden_size, 9)).astype(np.float32)
    np.testing.assert_array_equal(art.session(DECODER).run(None, {"hidden_states": x})[0], _decode(_session(graph), x))
    fp32 = LoadedArtifact(tiny_artifacts["fp32"], threads=1, saved_sessions=False)
    assert not fp32._unpacks(DECODER) and float_decoder_bytes(tiny_artifacts["fp32"] / "decoder.onnx") is None
