"""INT8 KV cache of the fused GPT graph: calibrated scales, the runtime's int8 buffers, recorded fidelity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.report_assembly import flat_metrics
from chattts_forge.quantize import QuantizeConfig, quantize_artifact
from chattts_forge.quantize.fast_gpt_graph import FusedGraphShape, build_fast_gpt
from chattts_forge.quantize.gpt_weights import extract_llama_weights
from chattts_forge.quantize.kv_cache import kv_cache_scales
from chattts_forge.runtime.fast_gpt import FastGptStep

FID = {"fidelity_sentences": 2, "fidelity_steps": 16, "threads": 1}


@pytest.fixture(scope="module")
def calib(tiny_calib) -> Path:
    return tiny_calib  # recorded with decode steps (decode_positions=3): the cache scales need a past


def _dims(artifact: Path) -> dict:
    return json.loads((artifact / "artifact.json").read_text())["dims"]


def _step(path: Path, d: dict) -> FastGptStep:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return FastGptStep(sess, d["num_hidden_layers"], d["num_key_value_heads"],
                       d["hidden_size"] // d["num_attention_heads"], d["hidden_size"], d["max_position_embeddings"])


def test_int8_cache_holds_quantized_keys_and_tracks_fp32(tiny_artifacts, calib, tmp_path):
    fp32 = tiny_artifacts["fp32"]
    d = _dims(fp32)
    weights, hp = extract_llama_weights(fp32 / "gpt.onnx")
    scales, record = kv_cache_scales(calib, hp["num_hidden_layers"])
    assert record["calibration_samples"] > 0 and record["max_abs"]["key"] > 0
    assert scales["0.key"].shape == (1, d["num_key_value_heads"], 1, d["hidden_size"] // d["num_attention_heads"])
    steps = {}
    for kv in ("fp32", "int8"):
        model = build_fast_gpt(weights, FusedGraphShape(num_attention_heads=d["num_attention_heads"],
                                                        num_key_value_heads=d["num_key_value_heads"],
                                                        max_positions=d["max_position_embeddings"], kv_cache=kv,
                                                        kv_scales=scales))
        onnx.save(model, str(tmp_path / f"{kv}.onnx"))
        steps[kv] = _step(tmp_path / f"{kv}.onnx", d)
    assert steps["int8"].cache_dtype == np.int8 and steps["fp32"].cache_dtype == np.float32
    rng = np.random.default_rng(0)
    mask = np.ones((2, 9), np.int64)
    mask[1, :3] = 0  # a left-padded row, as ChatTTS batches
    pos = np.cumsum(mask, 1) - 1
    pos[mask == 0] = 1
    feeds = [(rng.standard_normal((2, 9, d["hidden_size"]), dtype=np.float32), mask, pos)]
    for _ in range(4):
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
        feeds.append((rng.standard_normal((2, 1, d["hidden_size"]), dtype=np.float32), mask,
                      mask.sum(1, keepdims=True) - 1))
    outs = {}
    for kv, step in steps.items():
        step.reset(2)
        outs[kv] = [step(*f) for f in feeds]
    for a, b in zip(outs["fp32"], outs["int8"], strict=True):
        cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cos[mask[:, -a.shape[1]:].astype(bool)].min() > 0.99
        assert not np.array_equal(a, b)  # the cache really is quantized
    # The int8 buffer holds round(key / scale) of the FP32 cache at every valid position.
    total = mask.shape[1]
    k32 = steps["fp32"]._buffers[0][:, :, :total]
    k8 = steps["int8"]._buffers[0][:, :, :total]
    expect = np.clip(np.rint(k32 / scales["0.key"]), -128, 127)
    valid = mask.astype(bool)
    diff = np.abs(expect - k8.astype(np.float32)).transpose(0, 2, 1, 3)[valid]
    assert diff.max() <= 1  # rounding of values computed by slightly different kernels


def test_quantize_records_int8_cache_and_its_fidelity(tiny_kv8):
    # tiny_kv8 (conftest): quantize_artifact(fp32, method="dynamic", calibration=tiny_calib, kv_cache="int8")
    out = tiny_kv8
    meta = json.loads((out / "artifact.json").read_text())
    # Its own variant, so it is published beside int8-dynamic rather than over it.
    assert meta["variant"] == meta["quantization"]["variant"] == "int8-dynamic-kv8"
    assert meta["quantization"]["method"] == "dynamic"
    kv = meta["components"]["gpt_fast"]["kv_cache"]
    assert kv["dtype"] == "int8" and kv["calibration_samples"] > 0
    assert kv["calibration"]["corpus"] == "v1:calibration"
    assert meta["quantization"]["kv_cache"] == kv
    graph = onnx.load(str(out / "gpt_fast.onnx"), load_external_data=False)
    assert graph.graph.input[5].type.tensor_type.elem_type == onnx.TensorProto.INT8
    gqa = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    assert all({a.name: a.i for a in n.attribute}["kv_cache_bit_width"] == 8 for n in gqa)
    # Fidelity of the graph the runtime runs (int8 cache) is recorded next to the plain graph's.
    fast = meta["fidelity"]["gpt_fast"]["teacher_forced"]
    assert 0 < fast["top1_agreement"]["mean"] <= 1 and fast["steps"] > 0
    # The gate judges the worse of the two graphs.
    timing = {"rtf": {"p50": 1.0, "p95": 1.0, "p99": 1.0}, "first_audio_seconds": {"p50": 1.0}}
    report = {"intelligibility": {"measured": False, "reason": "synthetic"}, "fidelity": meta["fidelity"],
              "latency": {"artifact": timing, "ratios": {"vs_reference": {"rtf_p50": 1.0}}},
              "size": {"ratio_vs_reference": 0.5, "artifact_bytes": 1}}
    metrics, _ = flat_metrics(report)
    plain = meta["fidelity"]["teacher_forced"]
    assert metrics["code_agreement"] == min(fast["top1_agreement"]["mean"], plain["top1_agreement"]["mean"])
    assert metrics["code_kl"] == max(fast["kl"]["mean"], plain["kl"]["mean"])


def test_fp32_cache_records_nothing_new(tiny_artifacts, tmp_path):
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "dyn", QuantizeConfig("dynamic", fidelity=False, threads=1))
    meta = json.loads((out / "artifact.json").read_text())
    assert "kv_cache" not in meta["components"]["gpt_fast"] and "kv_cache" not in meta["quantization"]


def test_int8_cache_refusals(tiny_artifacts, calib, tmp_path):
    fp32 = tiny_artifacts["fp32"]
    with pytest.raises(ForgeError, match="needs --calibration"):
        quantize_artifact(fp32, tmp_path / "a", QuantizeConfig("dynamic", kv_cache="int8", fidelity=False))
    with pytest.raises(ForgeError, match="applies to the fused graph dynamic and rtn int4 rebuild"):
        quantize_artifact(fp32, tmp_path / "b", QuantizeConfig("static", calibration=calib, kv_cache="int8", fidelity=False))
    with pytest.raises(ForgeError, match="unknown KV cache"):
        quantize_artifact(fp32, tmp_path / "c", QuantizeConfig("dynamic", kv_cache="fp16", fidelity=False))
    assert not any(tmp_path.iterdir())  # nothing half-written
