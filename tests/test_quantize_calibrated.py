"""Calibrated quantization: static INT8 on both GPT graphs, INT4 algorithms, auto's search, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import numpy as np
import onnx
import pytest

from chattts_forge.calibration_data.statistics import STATS_FILE, Statistics
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.report_sections import AutoSearchSummary
from chattts_forge.integrity import sha256_file
from chattts_forge.quantize import QuantizeConfig, quantize_artifact

FID = {"fidelity_sentences": 2, "fidelity_steps": 16, "threads": 1}


@pytest.fixture(scope="module")
def calib(tiny_calib: Path) -> Path:
    # The session's set: 3 prefills + 9 decode steps, enough for GPTQ's minimum of 8 samples.
    return tiny_calib


@pytest.fixture(scope="module")
def static(tiny_quantized: dict[str, Path]) -> Path:
    # The session's static artifact (same fidelity settings as FID).
    return tiny_quantized["static"]


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


def _meta(folder: Path) -> dict:
    return json.loads((folder / "artifact.json").read_text())


def test_static_quantizes_the_fused_graph_into_integer_kernels(static, tmp_path: Path):
    import onnxruntime as ort

    meta = _meta(static)
    assert meta["components"]["gpt_fast"]["precision"] == "int8-static"
    assert meta["components"]["gpt_fast"]["sha256"] == sha256_file(static / "gpt_fast.onnx")
    rec = meta["components"]["gpt_fast"]["quantization"]
    assert rec["calibration_samples"] > 0 and rec["activation_type"] == "uint8"
    assert len(rec["activation_ranges"]) == rec["matmuls_quantized"] // 2 * 2  # qkv+o, gate_up+down per layer
    # Only MatMul inputs are quantized (no output requantization): onnxruntime fuses each into one kernel.
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    opts.log_severity_level = 3
    ort.InferenceSession(str(static / "gpt_fast.onnx"), opts, providers=["CPUExecutionProvider"])
    optimized = _ops(tmp_path / "opt.onnx")
    assert "MatMulIntegerToFloat" in optimized and "QLinearMatMul" not in optimized
    assert "MatMul" not in optimized  # every projection runs as an integer kernel


def test_static_fused_and_plain_graphs_agree(static, calib):
    """Same recorded inputs through the quantized gpt.onnx and gpt_fast.onnx: the same numbers."""
    from chattts_forge.quantize.fast_gpt_parity import fused_parity
    from chattts_forge.quantize.fused import sample_cases

    samples = list(CalibrationStore(calib).iter_samples("gpt"))
    parity = fused_parity(static / "gpt.onnx", static / "gpt_fast.onnx", sample_cases(samples))
    assert parity["samples"] == len(samples) > 0
    # Both graphs quantize their activations with the same calibrated scales, but they order attention's
    # float sums differently, and the CPU's kernels decide by how much: an activation on a rounding
    # boundary can then land one quantization step away in one graph, moving an output by about one
    # step (1/127 of the scale) on some CPUs (1.8e-7 here, AVX-512 VNNI). The bound is that step, the
    # same as the auto variant's below; a different computation would be far beyond it.
    assert parity["max_rel"] < 2 / 127 and parity["min_cosine"] > 0.9999
    recorded = _meta(static)["components"]["gpt_fast"]["parity"]
    assert recorded["max_rel"] < 2 / 127
    fid = _meta(static)["fidelity"]
    plain, fast = fid["teacher_forced"]["top1_agreement"]["mean"], fid["gpt_fast"]["teacher_forced"]["top1_agreement"]["mean"]
    assert abs(plain - fast) < 0.02


def test_packed_dynamic_int8_equals_onnxruntime_dynamic_on_the_unpacked_graph(tiny_artifacts, tiny_quantized, calib,
                                                                               tmp_path: Path):
    """auto's INT8 (quantize/dynamic_fused.py) on the packed fused graph computes what onnxruntime's
    quantize_dynamic computes on the unpacked projections: one weight scale per projection."""
    import numpy as np
    import onnxruntime as ort

    from chattts_forge.quantize.dynamic_fused import insert_dynamic_int8
    from chattts_forge.quantize.static_fused import const_weight_matmuls, fused_feed

    model = onnx.load(str(tiny_artifacts["fp32"] / "gpt_fast.onnx"))
    names = [n.name for n in const_weight_matmuls(model)]
    assert insert_dynamic_int8(model, names) == len(names)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    qkv = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeMatMul" and "qkv" in n.name)
    assert len(np.unique(inits[qkv.input[2]])) == 3  # q, k and v columns: a scale each
    assert not any(n.op_type == "MatMul" and n.name in names for n in model.graph.node)
    with pytest.raises(ForgeError, match="not a MatMul with a constant weight"):
        insert_dynamic_int8(model, names[:1])  # already quantized: refused by name, nothing half-done
    with pytest.raises(ForgeError, match="not in the graph"):
        insert_dynamic_int8(model, ["no/such/MatMul"])
    onnx.save(model, str(tmp_path / "packed.onnx"))

    def session(path: Path):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    ours, theirs = session(tmp_path / "packed.onnx"), session(tiny_quantized["dynamic"] / "gpt_fast.onnx")
    for sample in list(CalibrationStore(calib).iter_samples("gpt"))[:4]:
        feed = fused_feed(sample)
        a = ours.run(["last_hidden_state"], feed)[0]
        b = theirs.run(["last_hidden_state"], feed)[0]
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


@pytest.mark.parametrize("algorithm", ["rtn", "k_quant", "gptq", "importance"])
def test_int4_algorithms_quantize_both_gpt_graphs(tiny_artifacts, calib, tmp_path: Path, algorithm: str):
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / algorithm, QuantizeConfig("int4", calibration=calib,
                            algorithm=algorithm, block_size=32, **FID))
    meta = _meta(out)
    assert meta["quantization"]["algorithm"] == algorithm
    assert meta["quantization"]["options"]["algorithm"] == algorithm
    assert meta["quantization"]["components"]["gpt"]["algorithm"] == algorithm
    assert meta["quantization"]["components"]["gpt"]["block_size"] == 32
    for graph in ("gpt.onnx", "gpt_fast.onnx", "head_code.onnx"):
        assert "MatMulNBits" in _ops(out / graph), graph
    assert meta["components"]["gpt_fast"]["precision"] == "int4"
    assert meta["fidelity"]["gpt_fast"]["teacher_forced"]["top1_agreement"]["mean"] > 0
    if algorithm == "gptq":  # from calibrate's streamed Hessians, every projection of each graph
        recs = {c: meta["quantization"]["components"][c] for c in ("gpt", "head_code")}
        recs["gpt_fast"] = meta["components"]["gpt_fast"]["quantization"]
        for c, rec in recs.items():
            assert rec["gptq_matmuls"] > 0 and rec["calibration_rows"] > 0, c
    if algorithm == "importance":  # every projection got its importance-weighted blocks
        assert meta["quantization"]["components"]["gpt"]["importance_matmuls"] > 0


def test_int4_algorithms_give_different_weights(tiny_artifacts, calib, tmp_path: Path):
    from chattts_forge.quantize.int4 import quantize_int4_graph
    from chattts_forge.quantize.int4_gptq import graph_hessians, quantize_gptq_int4_graph

    src = tiny_artifacts["fp32"] / "gpt.onnx"
    hashes = set()
    for algorithm in ("rtn", "k_quant"):
        dst = tmp_path / f"{algorithm}.onnx"
        quantize_int4_graph(src, dst, block_size=32, algorithm=algorithm)
        hashes.add(sha256_file(dst))
    hessians, rows = graph_hessians(CalibrationStore(calib).statistics, "gpt")
    quantize_gptq_int4_graph(src, tmp_path / "gptq.onnx", hessians, block_size=32, rows=rows)
    hashes.add(sha256_file(tmp_path / "gptq.onnx"))
    assert len(hashes) == 3
    with pytest.raises(ForgeError, match="needs calibration statistics"):
        quantize_int4_graph(src, tmp_path / "x.onnx", block_size=32, algorithm="gptq")


def test_importance_blocks_are_what_matmulnbits_computes_and_weigh_channels(tmp_path: Path):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import chattts_forge.quantize.int4_importance as imp
    from chattts_forge.quantize.int4 import quantize_int4_graph

    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 48)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48])],
                              [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mm.onnx")
    quantize_int4_graph(tmp_path / "mm.onnx", tmp_path / "rtn.onnx", block_size=32, algorithm="rtn")
    ort_rtn = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "rtn.onnx")).graph.initializer}

    def dequant(packed, scales):
        q = np.stack([packed & 15, packed >> 4], -1).reshape(48, 2, 32).astype(np.float32)
        return ((q - 8) * scales[:, :, None]).reshape(48, 64).T

    def weighted_error(packed, scales, importance):
        return float((importance[:, None] * (w - dequant(packed, scales)) ** 2).sum())

    importance = rng.uniform(0, 1, 64) ** 4  # a few input channels dominate
    # The rewritten MatMulNBits computes x @ dequant(blocks): its layout is onnxruntime's.
    imp.quantize_importance_int4_graph(tmp_path / "mm.onnx", tmp_path / "imp.onnx", {"x": importance}, block_size=32)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    rows = ort.InferenceSession(str(tmp_path / "imp.onnx"), opts, providers=["CPUExecutionProvider"])
    got = np.concatenate([rows.run(["y"], {"x": np.eye(64, dtype=np.float32)[i:i + 1]})[0] for i in range(64)])
    np.testing.assert_allclose(got, dequant(*imp.importance_blocks(w, importance, 32)), rtol=1e-5, atol=1e-6)
    searched = imp.importance_blocks(w, importance, 32)
    assert weighted_error(*searched, importance) < weighted_error(ort_rtn["W_Q4"], ort_rtn["W_scales"], importance)


def _gate(path: Path, agreement: float, cosine: float) -> Path:
    path.write_text(f'schema = "chattts-forge/gate/1"\n[fidelity]\nmin_code_agreement = {agreement}\n'
                    f"min_hidden_cosine = {cosine}\n")
    return path


def test_auto_follows_the_gate(tiny_artifacts, calib, tmp_path: Path):
    strict_gate = _gate(tmp_path / "strict.toml", 0.97, 0.9995)
    loose_gate = _gate(tmp_path / "loose.toml", 0.3, 0.8)
    fp32 = tiny_artifacts["fp32"]
    strict = quantize_artifact(fp32, tmp_path / "strict", QuantizeConfig("auto", calibration=calib, gate=strict_gate, **FID))
    loose = quantize_artifact(fp32, tmp_path / "loose", QuantizeConfig("auto", calibration=calib, gate=loose_gate, **FID))
    s, lo = _meta(strict)["quantization"]["auto"], _meta(loose)["quantization"]["auto"]
    assert s["assignment"] != lo["assignment"]
    count = {k: {c: sum(v == c for v in a["assignment"].values()) for c in ("fp32", "int8", "int4")}
             for k, a in (("strict", s), ("loose", lo))}
    assert count["loose"]["int4"] > count["strict"]["int4"]
    assert count["strict"]["fp32"] + count["strict"]["int8"] > count["loose"]["fp32"] + count["loose"]["int8"]
    for a in (s, lo):
        chosen = next(r for r in a["candidates"] if (r["candidate"], r["head_code"]) == (a["chosen"], a["head_code"]))
        assert chosen["passed"] and isinstance(chosen["pareto"], bool)
        assert all({"bytes", "step_ms", "code_agreement", "hidden_cosine", "passed"} <= set(r) for r in a["candidates"])
        assert len(a["sensitivity"]) == len(a["assignment"])
        assert all(r["int4_cosine_loss"] >= 0 for r in a["sensitivity"])
    assert any(not r["passed"] for r in s["candidates"])  # the strict gate rejected something
    # All-FP32 is tried only where all-INT8 fails (with it passing, the boundary lies above 0).
    for a in (s, lo):
        for head in {r["head_code"] for r in a["candidates"]}:
            tried = {r["candidate"]: r["passed"] for r in a["candidates"] if r["head_code"] == head}
            assert tried[0] or -len(a["assignment"]) in tried
            assert not tried[0] or min(tried) >= 0
    assert any(min(r["candidate"] for r in a["candidates"]) == 0 for a in (s, lo))  # a search that skipped it
    # The artifact as the gate will judge it (plain gpt.onnx, quantized head) meets the strict gate.
    fid = _meta(strict)["fidelity"]
    assert fid["teacher_forced"]["top1_agreement"]["mean"] >= 0.97 and fid["hidden_cosine"]["mean"] >= 0.9995
    for folder in (strict, loose):
        meta = _meta(folder)
        assert meta["variant"] == "auto" and meta["components"]["gpt_fast"]["precision"] == "mixed"
        # INT8 MatMuls quantize their activations at run time; the two graphs order attention's float
        # sums differently, so an activation can round to the neighbouring step in one of them: an
        # output then moves by about one activation step, 1/127 of the scale (seen: 8.1e-3 on AVX-512
        # VNNI, < 1e-4 on an AVX2 machine). Beyond that would be a different computation.
        parity = meta["components"]["gpt_fast"]["parity"]
        assert parity["max_rel"] < 2 / 127 and parity["min_cosine"] > 0.9999
    assert "MatMulNBits" in _ops(loose / "gpt.onnx") and "MatMulNBits" in _ops(loose / "gpt_fast.onnx")
    # INT8 MatMuls run dynamic INT8 (run-time activation ranges), in both graphs.
    assert "DynamicQuantizeMatMul" in _ops(strict / "gpt.onnx") and "DynamicQuantizeMatMul" in _ops(strict / "gpt_fast.onnx")
    # The evaluate report shows the search as a table: one row per candidate tried, the choice marked.
    from chattts_forge.evaluate.search_report import auto_search_summary, render_auto_search_markdown

    summary = msgspec.convert(auto_search_summary(_meta(strict)["quantization"]), AutoSearchSummary)
    lines = render_auto_search_markdown(summary)
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith(("| candidate", "| ---"))]
    assert len(rows) == len(s["candidates"]) and sum("(chosen)" in ln for ln in rows) == 1
    assert render_auto_search_markdown(
        msgspec.convert(auto_search_summary(_meta(loose)["quantization"]), AutoSearchSummary))
    assert auto_search_summary({"method": "dynamic"}) is None and auto_search_summary(None) is None


def _fake_steps(costs: dict[int, list[float]]):
    """A fake clock and a step factory whose graph `N.onnx` takes costs[N][k % len] seconds at call k."""

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()

    def step_call(path: Path):
        seq, calls = costs[int(path.stem)], [0]

        def call() -> None:
            clock.now += seq[calls[0] % len(seq)]
            calls[0] += 1

        return call

    return clock, step_call


def test_auto_times_its_finalists_against_all_int8_interleaved(tiny_artifacts, tmp_path: Path):
    from chattts_forge.artifact import ArtifactMeta
    from chattts_forge.evaluate.search_report import auto_search_summary, render_auto_search_markdown
    from chattts_forge.quantize import auto
    from chattts_forge.runtime.interleave import RatioSettings

    fp32 = tiny_artifacts["fp32"]
    meta = ArtifactMeta.load(fp32)
    fast = meta.component_file(fp32, "gpt_fast")
    # The real step: repeatable at a fixed context (the cache is rewound before every call).
    call = auto.repeatable_step(fast, meta.dims, threads=1, past=32)
    assert call() is not None and call().shape == (1, 1, meta.dims["hidden_size"])

    def rows() -> list[dict]:
        return [
            {"candidate": 0, "head_code": "int8", "bytes": 900, "step_ms": 5.0, "passed": True},
            {"candidate": 10, "head_code": "int8", "bytes": 700, "step_ms": 4.0, "passed": True},
            {"candidate": 15, "head_code": "int8", "bytes": 600, "step_ms": 4.9, "passed": True},
            {"candidate": 20, "head_code": "int8", "bytes": 500, "step_ms": 6.0, "passed": True},  # > 1.25 x 4.0: not a finalist
            {"candidate": 40, "head_code": "int8", "bytes": 400, "step_ms": 3.0, "passed": False},
        ]

    graphs = {("int8", c): tmp_path / f"{c}.onnx" for c in (0, 10, 15, 20)}
    settings = RatioSettings(bound=0.02, time_cap_s=2.0, min_sample_s=0.0)
    # Clearly faster: candidate 15 steps 0.8x of all-INT8 every round.
    clock, steps = _fake_steps({0: [0.0050], 10: [0.0046], 15: [0.0040]})
    table = rows()
    passing = [r for r in table if r["passed"]]
    timing = auto.retime(passing, table, graphs, meta.dims, 1, step_call=steps, settings=settings, clock=clock)
    assert sorted(c["candidate"] for c in timing["candidates"]) == [10, 15]
    assert timing["chosen"] == {"candidate": 15, "head_code": "int8"} and "beyond the noise" in timing["decision"]
    assert timing["chosen_vs_reference"] == pytest.approx(0.8) and timing["comparison"]["converged"]
    assert table[2]["step_ms"] == pytest.approx(4.0) and table[2]["step_ms_search"] == 4.9
    assert table[3]["step_ms"] == 6.0 and "step_ms_search" not in table[3]
    assert timing["reference"]["candidate"] == 0 and timing["reference"]["step_ms"] == pytest.approx(5.0)
    # Inside the noise (a background job makes all-INT8's steps scatter by ~40%, seeded), the mixes 2%
    # faster: the interval straddles 1 when the time cap ends the rounds, and all-INT8 is shipped.
    noisy = list(0.005 * np.exp(np.random.default_rng(0).normal(0.0, 0.4, 2000)))
    clock, steps = _fake_steps({0: noisy, 10: [0.0049], 15: [0.0049]})
    table = rows()
    timing = auto.retime([r for r in table if r["passed"]], table, graphs, meta.dims, 1, step_call=steps,
                         settings=settings, clock=clock)
    assert timing["chosen"] == {"candidate": 0, "head_code": "int8"} and timing["chosen_vs_reference"] == 1.0
    assert "the simpler int8:+0 is kept" in timing["decision"] and timing["comparison"]["stopped"] == "time cap"
    # Two mixes clearly faster than all-INT8 but not separable from each other: the fewer bytes wins.
    scattered = list(0.0040 * np.exp(np.random.default_rng(1).normal(0.0, 0.15, 2000)))
    clock, steps = _fake_steps({0: [0.0050], 10: scattered, 15: [0.0041]})
    table = rows()
    got = auto.retime([r for r in table if r["passed"]], table, graphs, meta.dims, 1, step_call=steps,
                      settings=RatioSettings(bound=0.01, time_cap_s=1.0, min_sample_s=0.0), clock=clock)
    assert got["chosen"]["candidate"] == 15 and "the cost model picks int8:+15" in got["decision"]
    # The report marks the re-timed cells and states the ratio to all-INT8.
    quant = {"auto": {"gate": {}, "candidates": table, "final_timing": {**timing, "chosen_vs_reference": 0.808},
                      "chosen": 15, "head_code": "int8"}}
    lines = render_auto_search_markdown(msgspec.convert(auto_search_summary(quant), AutoSearchSummary))
    assert any("0.808x all-INT8" in ln for ln in lines)
    assert any(ln.startswith("| 15 **(chosen)**") and "* (4.9)" in ln for ln in lines)


@pytest.mark.parametrize("method", [["static"], ["int4", "--algorithm", "gptq", "--block-size", "32"]])
def test_calibrated_quantization_gives_the_same_bytes_whatever_the_hash_seed(tiny_artifacts, calib, tmp_path: Path,
                                                                             method: list[str]):
    """docs/manifest.md: two builds from the same calibration write the same files. onnxruntime's
    quantizers order what they add by Python sets, so each run is a fresh interpreter with its own
    hash seed (in one process the seed, and so the order, would never change)."""
    import os
    import subprocess
    import sys

    digests = []
    for seed in ("1", "2"):
        out = tmp_path / f"seed{seed}"
        subprocess.run([sys.executable, "-m", "chattts_forge.cli", "quantize", "--artifact", str(tiny_artifacts["fp32"]),
                        "--method", *method, "--calibration", str(calib), "--no-fidelity", "--out", str(out)],
                       check=True, capture_output=True, timeout=600,
                       env={**os.environ, "PYTHONHASHSEED": seed, "SOURCE_DATE_EPOCH": "1700000000"})
        digests.append({p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file()})
    assert digests[0] == digests[1]


# ---- bad input: one line, before any work, nothing written ---------------------------------------------


def _copy_calib(calib: Path, dst: Path) -> Path:
    shutil.copytree(calib, dst)
    return dst


def _edit_manifest(calib: Path, edit) -> None:
    path = calib / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def test_bad_calibration_is_refused_up_front(tiny_artifacts, calib, tmp_path: Path):
    fp32 = tiny_artifacts["fp32"]
    other = _copy_calib(calib, tmp_path / "other")
    _edit_manifest(other, lambda m: m["artifact"].update(gpt_sha256="0" * 64))
    empty = _copy_calib(calib, tmp_path / "empty")
    _edit_manifest(empty, lambda m: m["components"]["gpt"].update(samples=0, shards=[]))
    truncated = _copy_calib(calib, tmp_path / "truncated")
    shard = truncated / json.loads((truncated / "manifest.json").read_text())["components"]["gpt"]["shards"][0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    foreign = _copy_calib(calib, tmp_path / "foreign")  # statistics of another graph under the right manifest
    stats = Statistics.load(foreign / STATS_FILE)
    stats.graph_sha256["gpt"] = "0" * 64
    stats.save(foreign / STATS_FILE)
    no_hessian = _copy_calib(calib, tmp_path / "no-hessian")  # statistics of a calibrate without X^T X
    stats = Statistics.load(no_hessian / STATS_FILE)
    for st in stats.graphs["gpt"].values():
        st.xtx = None
    stats.save(no_hessian / STATS_FILE)
    cases = [
        (other, "static", {}, "different artifact"),
        (empty, "auto", {}, "no gpt samples"),
        (truncated, "static", {}, "unreadable|corrupt"),
        (foreign, "static", {}, "gpt statistics were observed on another graph"),
        (no_hessian, "int4", {"algorithm": "gptq"}, "hold no X.T X"),
    ]
    for folder, method, extra, message in cases:
        with pytest.raises(ForgeError, match=message) as err:
            quantize_artifact(fp32, tmp_path / "out", QuantizeConfig(method, calibration=folder, **extra, **FID))
        assert "\n" not in str(err.value)
        assert not (tmp_path / "out").exists()
    with pytest.raises(ForgeError, match="needs --calibration"):
        quantize_artifact(fp32, tmp_path / "out", QuantizeConfig("int4", algorithm="gptq", **FID))
    with pytest.raises(ForgeError, match="needs --calibration"):
        quantize_artifact(fp32, tmp_path / "out", QuantizeConfig("auto", **FID))
    with pytest.raises(ForgeError, match="block-size"):
        quantize_artifact(fp32, tmp_path / "out", QuantizeConfig("int4", block_size=48, **FID))
    with pytest.raises(ForgeError, match="gate file"):
        quantize_artifact(fp32, tmp_path / "out", QuantizeConfig("auto", calibration=calib, gate=tmp_path / "none.toml", **FID))
    assert not (tmp_path / "out").exists()


def test_damaged_input_artifact_is_named_up_front(tiny_artifacts, tmp_path: Path):
    src = tmp_path / "fp32"
    shutil.copytree(tiny_artifacts["fp32"], src)
    original = (src / "head_code.onnx").read_bytes()
    data = bytearray(original)
    data[-1] ^= 0xFF  # same size, different bytes
    (src / "head_code.onnx").write_bytes(bytes(data))
    with pytest.raises(ForgeError, match="head_code.onnx does not match its sha256"):
        quantize_artifact(src, tmp_path / "out", QuantizeConfig("dynamic", **FID))
    (src / "head_code.onnx").write_bytes(original)
    (src / "decoder.onnx").write_bytes(b"short")
    with pytest.raises(ForgeError, match="decoder.onnx has 5 bytes"):
        quantize_artifact(src, tmp_path / "out", QuantizeConfig("dynamic", **FID))
    assert not (tmp_path / "out").exists()


def test_smoothing_moves_the_range_into_the_weights_and_keeps_the_function(tiny_artifacts, calib):
    """SmoothQuant's migration alone (no rounding) computes what the FP32 graph computes; 1/s folds
    into the normalizations before qkv and gate_up, a Mul stays before o_proj and down_proj."""
    import onnxruntime as ort

    from chattts_forge.quantize.smooth import smooth_inputs
    from chattts_forge.quantize.static_fused import const_weight_matmuls, fused_feed

    src = tiny_artifacts["fp32"] / "gpt_fast.onnx"
    model = onnx.load(str(src))
    targets = const_weight_matmuls(model)
    stats = Statistics.load(calib / STATS_FILE).tensors("gpt_fast")
    inputs = sorted({n.input[0] for n in targets})
    ranges = {x: (stats[x].min, stats[x].max) for x in inputs}
    done = smooth_inputs(model, targets, stats, ranges, alpha=0.5)
    layers = len(targets) // 4
    assert (done.folded, done.mul_nodes) == (2 * layers, 2 * layers)
    assert set(done.inputs) == set(inputs) and len(done.ranges) == len(inputs)

    def run(m: onnx.ModelProto, feed: dict) -> np.ndarray:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(["last_hidden_state"], feed)[0]

    original = onnx.load(str(src))
    for sample in list(CalibrationStore(calib).iter_samples("gpt"))[:3]:
        feed = fused_feed(sample)
        a, b = run(model, feed), run(original, feed)
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


def test_static_with_smoothing_records_it_and_keeps_integer_kernels(tiny_artifacts, calib, static, tmp_path: Path):
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "smooth",
                            QuantizeConfig("static", calibration=calib, smooth_alpha=0.5, **FID))
    meta = _meta(out)
    assert meta["quantization"]["options"]["smooth_alpha"] == 0.5
    for rec in (meta["quantization"]["components"]["gpt"], meta["components"]["gpt_fast"]["quantization"]):
        assert rec["smoothing"]["alpha"] == 0.5 and rec["smoothing"]["folded_into_normalization"] > 0
    ops = _ops(out / "gpt_fast.onnx")
    assert {"QuantizeLinear", "DequantizeLinear", "Mul"} <= ops
    assert meta["components"]["gpt_fast"]["parity"]["max_rel"] < 2 / 127  # both graphs smoothed alike
    # The default (the session's static artifact) smooths at 0.75; --no-smooth records none.
    assert _meta(static)["quantization"]["components"]["gpt"]["smoothing"]["alpha"] == 0.75
    off = _meta(quantize_artifact(tiny_artifacts["fp32"], tmp_path / "off", QuantizeConfig(
        "static", calibration=calib, smooth=False, fidelity=False)))["quantization"]
    assert "smooth_alpha" not in off["options"] and "smoothing" not in off["components"]["gpt"]


def test_percentile_ranges_come_from_the_streamed_histograms(tiny_artifacts, calib, static, tmp_path: Path):
    """--calibrate-method percentile clips each range at a percentile of the streamed |x| histogram,
    on both GPT graphs (the fused one is kept), never wider than minmax; the default smoothing is off
    with it."""
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "p", QuantizeConfig(
        "static", calibration=calib, calibrate_method="percentile", percentile=99.0, **FID))
    meta = _meta(out)
    assert meta["quantization"]["options"]["percentile"] == 99.0
    assert "smooth_alpha" not in meta["quantization"]["options"]
    rec = meta["components"]["gpt_fast"]["quantization"]
    assert rec["calibrate_method"] == "percentile" and rec["percentile"] == 99.0 and "smoothing" not in rec
    recorded = {t: tuple(r) for t, r in rec["activation_ranges"].items()}
    minmax = Statistics.load(calib / STATS_FILE).ranges("gpt_fast", recorded)
    assert any(recorded[t][1] < hi - 1e-6 for t, (_, hi) in minmax.items())
    assert all(recorded[t][1] <= hi + 1e-6 and recorded[t][0] >= lo - 1e-6 for t, (lo, hi) in minmax.items())
    assert "percentile" not in _meta(static)["quantization"]["options"]


def test_eight_bit_static_weights_are_recorded_and_warned_about_where_kernels_saturate(
        tiny_artifacts, calib, static, tmp_path: Path, monkeypatch, caplog):
    import logging

    import chattts_forge.runtime.machine as machine
    from chattts_forge.runtime import LoadedArtifact

    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "w8",
                            QuantizeConfig("static", calibration=calib, weight_bits=8, **FID))
    meta = _meta(out)
    assert meta["quantization"]["options"]["weight_bits"] == 8
    assert meta["components"]["gpt_fast"]["quantization"]["weight_range"] == "8-bit (+-127)"
    w = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(out / "gpt_fast.onnx")).graph.initializer}
    assert max(int(np.abs(v).max()) for k, v in w.items() if k.endswith("_quantized")) == 127
    assert "weight_bits" not in _meta(static)["quantization"]["options"]  # 7 stays the unrecorded default
    # The runtime warns only on a CPU whose u8s8 kernels saturate (AVX2 without VNNI or AMX).
    for flags, warned in ((["avx2", "avx512_vnni"], False), (["avx2", "amx_int8"], False), (["avx2"], True)):
        monkeypatch.setattr(machine, "cpu_flags", lambda flags=flags: flags)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            LoadedArtifact(out, verify="size")
            LoadedArtifact(static, verify="size")
        assert ("saturate" in caplog.text) == warned, flags
        assert caplog.text.count("saturate") == int(warned)  # the 7-bit build never


@pytest.mark.parametrize("options, message", [
    ({"method": "static", "weight_bits": 9}, "7 or 8"),
    ({"method": "dynamic", "weight_bits": 8}, r"--weight-bits does not apply to --method dynamic \(it applies to: static\)"),
    ({"method": "static", "smooth_alpha": 1.5}, "within 0..1"),
    ({"method": "dynamic", "smooth_alpha": 0.5}, "--smooth-alpha does not apply to --method dynamic"),
    ({"method": "static", "smooth_alpha": 0.5, "calibrate_method": "entropy"}, "--calibrate-method entropy"),
    ({"method": "static", "percentile": 99.9}, "applies to --calibrate-method percentile"),
    ({"method": "static", "calibrate_method": "percentile", "percentile": 10.0}, "within 50..100"),
    ({"method": "static", "calibrate_method": "percentile", "smooth_alpha": 0.5}, "not with --calibrate-method"),
    ({"method": "static", "smooth": False, "smooth_alpha": 0.5}, "contradict"),
    ({"method": "dynamic", "smooth": False}, "--no-smooth does not apply to --method dynamic"),
])
def test_smoothing_options_are_refused_before_any_work(tiny_artifacts, calib, tmp_path: Path, options, message):
    with pytest.raises(ForgeError, match=message):
        quantize_artifact(tiny_artifacts["fp32"], tmp_path / "out", QuantizeConfig(calibration=calib, **options, **FID))
    assert not (tmp_path / "out").exists()
