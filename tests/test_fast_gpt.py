"""The fast GPT graph (quantize/fast_gpt_graph.py, quantized: quantize/fast_gpt.py) and its driver (runtime/fast_gpt.py) against the plain graph."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from chattts_forge.artifact import FAST_GPT
from chattts_forge.errors import ForgeError
from chattts_forge.quantize.fast_gpt import optimize_gpt
from chattts_forge.quantize.fast_gpt_graph import optimize_artifact
from chattts_forge.quantize.fast_gpt_parity import LeftPaddedSteps
from chattts_forge.quantize.gpt_weights import extract_llama_weights
from chattts_forge.runtime.fast_gpt import FastGptStep


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def fast_artifact(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny FP32 artifact with gpt_fast.onnx added (the fixture stays untouched)."""
    dst = tmp_path_factory.mktemp("fast") / "fp32"
    shutil.copytree(tiny_artifacts["fp32"], dst)
    optimize_artifact(dst)
    return dst


def _dims(artifact: Path) -> dict:
    return json.loads((artifact / "artifact.json").read_text())["dims"]


def _fast_step(artifact: Path, capacity: int = 512) -> FastGptStep:
    d = _dims(artifact)
    return FastGptStep(
        _session(artifact / "gpt_fast.onnx"),
        d["num_hidden_layers"],
        d["num_key_value_heads"],
        d["hidden_size"] // d["num_attention_heads"],
        d["hidden_size"],
        d["max_position_embeddings"],
        capacity=capacity,
    )


def _run_both(artifact: Path, capacity: int, steps: int = 8, seed: int = 1):
    """Hidden states and code-head logits of plain vs fast graph on a left-padded batch + decode steps
    (the parity check's own cases, `LeftPaddedSteps`, with the fast step at `capacity`)."""
    d = _dims(artifact)
    plain = _session(artifact / "gpt.onnx")
    head = _session(artifact / "head_code.onnx")
    fast = _fast_step(artifact, capacity)
    cases = LeftPaddedSteps(d, batch=3, prompt=10, decode_steps=steps, seed=seed, pads=(0, 3, 6))
    pairs = []
    for step, (ref, got, valid) in enumerate(cases.steps(plain, fast)):
        assert fast.past_length == 10 + step
        ref_logits = head.run(None, {"hidden_states": ref[:, -1]})[0]
        got_logits = head.run(None, {"hidden_states": got[:, -1]})[0]
        pairs.append((ref[valid], got[valid], ref_logits, got_logits))
    return pairs, fast


def test_fast_graph_equals_plain_graph(fast_artifact: Path) -> None:
    pairs, _ = _run_both(fast_artifact, capacity=512)
    for ref_h, got_h, ref_l, got_l in pairs:
        assert got_h.shape == ref_h.shape
        np.testing.assert_allclose(got_h, ref_h, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got_l, ref_l, atol=1e-4, rtol=0)


def test_cache_grows_and_keeps_its_contents(fast_artifact: Path) -> None:
    # capacity 4 < prompt 10: the buffers are reallocated twice and must keep every position
    pairs, fast = _run_both(fast_artifact, capacity=4, steps=300 - 10)
    assert fast.capacity >= 300
    worst = max(float(np.abs(g - r).max()) for r, g, _, _ in pairs)
    assert worst < 1e-4


def test_fast_graph_is_fused_and_recorded(fast_artifact: Path) -> None:
    meta = json.loads((fast_artifact / "artifact.json").read_text())
    rec = meta["components"][FAST_GPT]
    assert rec["file"] == "gpt_fast.onnx"
    assert rec["parity"]["max_abs"] < 1e-4
    assert rec["quantization"] is None
    ops = {n.op_type for n in onnx.load(str(fast_artifact / "gpt_fast.onnx")).graph.node}
    assert {"GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization", "RMSNormalization"} <= ops
    assert "Concat" not in ops  # no cache copy
    # onnxruntime's internal SimplifiedLayerNormalization has no standard schema: the checker rejects it
    assert "SimplifiedLayerNormalization" not in ops
    assert rec["opset"] == 23
    onnx.checker.check_model(str(fast_artifact / "gpt_fast.onnx"), full_check=True)
    # the runtime opens it with its own checks (size + sha256 of artifact.json)
    from chattts_forge.runtime.loaded_artifact import LoadedArtifact

    art = LoadedArtifact(fast_artifact, threads=1)
    step = FastGptStep.from_artifact(art)
    step.reset(2)
    assert step.past_length == 0


@pytest.mark.parametrize(("method", "op"), [("dynamic", {"MatMulInteger", "DynamicQuantizeMatMul"}), ("int4", {"MatMulNBits"})])
def test_quantized_fast_graphs(fast_artifact: Path, tmp_path: Path, method: str, op: set[str]) -> None:
    out = tmp_path / f"gpt_fast_{method}.onnx"
    rec = optimize_gpt(fast_artifact, out, quantize=method)
    assert rec["quantization"]["method"] == method
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert ops & op and "GroupQueryAttention" in ops
    # quantized: recorded error against the plain FP32 graph, finite and not gated
    assert np.isfinite(rec["parity"]["max_abs"]) and rec["parity"]["tolerance_abs"] is None


def test_packed_projections_split_grouped_query_heads(tmp_path: Path) -> None:
    """Under grouped-query attention q is wider than k and v: the packed QKV Split must use their widths."""
    from chattts_forge.quantize.fast_gpt_graph import FusedGraphShape, build_fast_gpt

    hidden, heads, kv_heads, inter = 32, 4, 2, 48
    kv_width = kv_heads * hidden // heads
    rng = np.random.default_rng(0)
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv_width, hidden), "v_proj": (kv_width, hidden),
              "o_proj": (hidden, hidden), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
              "down_proj": (hidden, inter)}
    weights = {"norm.weight": rng.uniform(0.5, 1.5, hidden).astype(np.float32)}
    for i in range(2):
        for n, shape in shapes.items():
            block = "mlp" if n in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            weights[f"layers.{i}.{block}.{n}.weight"] = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        for n in ("input_layernorm", "post_attention_layernorm"):
            weights[f"layers.{i}.{n}.weight"] = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    steps = {}
    for packed in (True, False):
        path = tmp_path / f"packed_{packed}.onnx"
        shape = FusedGraphShape(num_attention_heads=heads, num_key_value_heads=kv_heads, max_positions=64,
                                pack_projections=packed)
        onnx.save(build_fast_gpt(weights, shape), str(path))
        onnx.checker.check_model(str(path), full_check=True)
        steps[packed] = FastGptStep(_session(path), 2, kv_heads, hidden // heads, hidden, 64, capacity=16)
        steps[packed].reset(2)
    mask = np.ones((2, 5), np.int64)
    mask[1, :2] = 0
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    emb = rng.standard_normal((2, 5, hidden), dtype=np.float32)
    got, want = steps[True](emb, mask, pos), steps[False](emb, mask, pos)
    assert got.shape == (2, 5, hidden)
    np.testing.assert_allclose(got[mask.astype(bool)], want[mask.astype(bool)], atol=1e-5, rtol=0)


def test_extracted_weights_equal_the_checkpoint(tiny_artifacts: dict[str, Path], tiny_ckpt: Path) -> None:
    from safetensors.numpy import load_file

    weights, hp = extract_llama_weights(tiny_artifacts["fp32"] / "gpt.onnx")
    ckpt = load_file(str(tiny_ckpt / "gpt" / "model.safetensors"))
    assert hp["num_hidden_layers"] == 2 and hp["num_attention_heads"] == 4
    for name, w in weights.items():
        np.testing.assert_array_equal(w, ckpt[name].astype(np.float32), err_msg=name)


def test_errors(fast_artifact: Path, tmp_path: Path) -> None:
    fast = _fast_step(fast_artifact)
    fast.reset(1)
    hidden = _dims(fast_artifact)["hidden_size"]
    emb = np.zeros((1, 1, hidden), np.float32)
    with pytest.raises(ForgeError, match="expected past 0"):
        fast(emb, np.ones((1, 3), np.int64), np.zeros((1, 1), np.int64))
    with pytest.raises(ForgeError, match="batch 2"):
        fast(np.zeros((2, 1, hidden), np.float32), np.ones((2, 1), np.int64), np.zeros((2, 1), np.int64))
    with pytest.raises(ForgeError, match="not a fast GPT graph"):
        FastGptStep(_session(fast_artifact / "gpt.onnx"), 2, 4, 16, 64)
    with pytest.raises(ForgeError, match="no such GPT graph"):
        optimize_gpt(tmp_path / "missing.onnx", tmp_path / "x.onnx")
    with pytest.raises(ForgeError, match="no Llama layer weights"):
        optimize_gpt(fast_artifact / "head_code.onnx", tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


def test_runtime_logits_identical_with_fast_step(fast_artifact: Path) -> None:
    """The runtime's processed logits (teacher-forced) are the same with the fast step as with the plain one."""
    from chattts_forge.runtime import InferCodeParams, Pipeline

    texts = ["你好，欢迎使用。", "今天天气很好"]
    params = InferCodeParams(max_new_token=24, min_new_token=24, seed=3)
    plain = Pipeline(fast_artifact, threads=1)
    norm = [plain.normalize(t) for t in texts]
    gen = plain.infer_code(norm, params)
    ref = plain.teacher_forced_logits(norm, gen.ids, params)
    fast = Pipeline(fast_artifact, threads=1)
    fast.gpt = FastGptStep.from_artifact(fast.artifact)
    gen_fast = fast.infer_code(norm, params)
    got = fast.teacher_forced_logits(norm, gen.ids, params)
    for a, b in zip(ref, got, strict=True):
        finite = np.isfinite(a)
        assert np.array_equal(finite, np.isfinite(b))
        np.testing.assert_allclose(b[finite], a[finite], atol=1e-4, rtol=0)
    for a, b in zip(gen.ids, gen_fast.ids, strict=True):
        np.testing.assert_array_equal(a, b)


def test_thread_policy_per_component(fast_artifact: Path) -> None:
    """GPT graphs get every thread, the tiny per-step graphs one, the decoders no spinning workers."""
    from chattts_forge.runtime.loaded_artifact import LoadedArtifact

    art = LoadedArtifact(fast_artifact, threads=2)
    opts = {name: art.session(name).get_session_options() for name in ("embed", "head_code", "gpt_fast", "gpt", "vocos")}
    assert opts["gpt_fast"].intra_op_num_threads == 2 and opts["gpt"].intra_op_num_threads == 2
    assert opts["embed"].intra_op_num_threads == 1 and opts["head_code"].intra_op_num_threads == 1
    assert opts["vocos"].intra_op_num_threads == 2
    assert opts["vocos"].get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # left at the default (spinning)
        opts["gpt_fast"].get_session_config_entry("session.intra_op.allow_spinning")
    # the decoders meet a new input length with most texts: no per-shape memory pattern (issue 37's soak)
    assert opts["vocos"].enable_mem_pattern is False
    assert art.session("decoder").get_session_options().enable_mem_pattern is False
    assert opts["gpt_fast"].enable_mem_pattern is True


def test_rows_grow_keeping_the_live_rows_and_free_rows_give_their_pages_back(fast_artifact: Path) -> None:
    fast = _fast_step(fast_artifact)
    fast.open_rows(3, 64)
    for i, buf in enumerate(fast._buffers):
        buf[...] = (i % 100) + 1
    fast.ensure_rows_capacity(100, live=2)  # rows 0 and 1 run; row 2 is free
    assert fast.capacity >= 100
    for i, buf in enumerate(fast._buffers):
        assert (buf[:2, :, :64] == (i % 100) + 1).all() and not buf[:2, :, 64:].any()
        assert not buf[2].any()  # a free row is not copied (that would map its pages again)
        buf[...] = 7
    fast.release_rows(1, 3)
    assert all((buf[0] == 7).all() and not buf[1:].any() for buf in fast._buffers)
