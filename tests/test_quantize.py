"""quantize: each method makes a quantized, runnable, self-describing artifact; fidelity; fallback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.integrity import sha256_file
from chattts_forge.quantize import QuantizeConfig, measure_fidelity, quantize_artifact

FID = {"fidelity_sentences": 2, "fidelity_steps": 16, "threads": 1}
EXPECTED_OPS = {"dynamic": {"MatMulInteger"}, "static": {"QuantizeLinear", "DequantizeLinear"},
                "int4": {"MatMulNBits"}}


# The calibration set and the quantized artifacts are session fixtures (tests/conftest.py), shared
# with the ONNX validity test.
@pytest.fixture(scope="module")
def calib(tiny_calib: Path) -> Path:
    return tiny_calib


@pytest.fixture(scope="module")
def quantized(tiny_quantized: dict[str, Path]) -> dict[str, Path]:
    return tiny_quantized


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


@pytest.mark.parametrize("method", ["dynamic", "static", "int4"])
def test_graphs_are_quantized_and_vocos_is_untouched(quantized, tiny_artifacts, method: str):
    out, fp32 = quantized[method], tiny_artifacts["fp32"]
    assert EXPECTED_OPS[method] <= _ops(out / "gpt.onnx")
    assert EXPECTED_OPS[method] <= _ops(out / "head_code.onnx")
    for name in ("vocos.onnx", "vocos.onnx.data", "dvae.onnx", "dvae.onnx.data", "dvae_encoder.onnx", "embed.onnx",
                 "embed.onnx.data", "tokenizer.json", "speaker_stats.npy"):
        assert sha256_file(out / name) == sha256_file(fp32 / name), name
    # The Decoder: its MatMuls weight-only INT8 (8-bit MatMulNBits), its convolutions FP32.
    decoder = onnx.load(str(out / "decoder.onnx"), load_external_data=False)
    nbits = [n for n in decoder.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and all(a.i == 8 for n in nbits for a in n.attribute if a.name == "bits")
    assert "MatMul" not in _ops(out / "decoder.onnx") and "Conv" in _ops(out / "decoder.onnx")
    assert {p.key: p.value for p in decoder.metadata_props}["precision"] == "int8"
    assert (out / "decoder.onnx.data").stat().st_size < (fp32 / "decoder.onnx.data").stat().st_size
    props = {p.key: p.value for p in onnx.load(str(out / "gpt.onnx"), load_external_data=False).metadata_props}
    assert props["component"] == "gpt" and props["precision"] == ("int4" if method == "int4" else "int8")
    assert (out / "gpt.onnx").stat().st_size < (fp32 / "gpt.onnx").stat().st_size


@pytest.mark.parametrize("method", ["dynamic", "static", "int4"])
def test_artifact_json_records_choices_and_fidelity(quantized, tiny_artifacts, method: str):
    out = quantized[method]
    meta = json.loads((out / "artifact.json").read_text())
    q = meta["quantization"]
    assert meta["variant"] == {"dynamic": "int8-dynamic", "static": "int8-static", "int4": "int4"}[method]
    assert q["method"] == method and q["vocos_sha256_equal"] is True
    assert meta["components"]["gpt"]["sha256"] == sha256_file(out / "gpt.onnx")
    dec = meta["components"]["decoder"]
    assert dec["precision"] == "int8" and dec["sha256"] == sha256_file(out / "decoder.onnx")
    assert dec["external_data"] == {"file": "decoder.onnx.data", "bytes": (out / "decoder.onnx.data").stat().st_size,
                                    "sha256": sha256_file(out / "decoder.onnx.data")}
    assert q["components"]["decoder"]["weights"] == "int8" and q["components"]["decoder"]["bits"] == 8
    assert q["components"]["decoder"]["matmuls_quantized"] == q["components"]["decoder"]["ops"]["quantized_ops"]["MatMulNBits"]
    assert "decoder" not in q["not_quantized"]
    assert meta["components"]["gpt"]["precision"] == ("int4" if method == "int4" else "int8")
    assert q["components"]["gpt"]["ops"]["quantized_ops"]
    assert q["components"]["gpt"]["per_op_precision"]
    assert q["versions"] if "versions" in q else meta["versions"]["onnxruntime"]
    assert 0 < q["sizes"]["gpt_ratio"] < 1
    if method == "static":
        assert q["calibration"]["corpus"]["sha256"] and q["calibration"]["samples"]["gpt"] > 0
        assert q["options"]["activation_type"] == "uint8" and q["options"]["per_channel"] is True
        assert q["components"]["gpt"]["calibrate_method"] == "minmax"
    if method == "dynamic":
        assert q["options"]["per_channel"] is False
    if method == "int4":
        assert q["components"]["gpt"]["block_size"] == 32 and q["components"]["gpt"]["accuracy_level"] == 4
    fid = meta["fidelity"]
    agree = fid["teacher_forced"]["top1_agreement"]
    assert 0.0 <= agree["mean"] <= 1.0 and len(agree["per_stream"]) == meta["dims"]["num_vq"]
    assert fid["teacher_forced"]["kl"]["mean"] >= 0
    assert 0.5 < fid["hidden_cosine"]["mean"] <= 1.0 + 1e-9
    assert np.isfinite(fid["mel"]["snr_db"]) and fid["mel"]["lsd_db"] >= 0
    worst = fid["per_tensor"]["worst_local"]
    assert worst and worst[0]["node"] and "all_local" not in fid["per_tensor"]
    assert fid["corpus"]["name"].endswith(":evaluation")


@pytest.mark.parametrize("method", ["dynamic", "static", "int4"])
def test_quantized_artifact_synthesizes(quantized, method: str):
    from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, SynthParams

    pipe = Pipeline(quantized[method], threads=1)
    res = pipe.synthesize("你好，欢迎光临。", SynthParams(code=InferCodeParams(seed=1, max_new_token=10)))
    assert res[0].wav.size > 0 and np.isfinite(res[0].wav).all()


def test_synth_cli_runs_on_quantized(quantized, tmp_path: Path):
    wav = tmp_path / "a.wav"
    res = CliRunner().invoke(main, ["synth", "--artifact", str(quantized["int4"]), "--text", "Hello there.",
                                    "--max-new-token", "8", "--seed", "0", "--out", str(wav)])
    assert res.exit_code == 0, res.output
    assert wav.stat().st_size > 44


def test_fidelity_of_fp32_against_itself_is_perfect(tiny_artifacts, tmp_path: Path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_artifacts["fp32"], copy)
    fid = measure_fidelity(tiny_artifacts["fp32"], copy, "builtin:evaluation", max_sentences=2,
                           max_new_token=10, threads=1)
    assert fid["teacher_forced"]["top1_agreement"]["mean"] == 1.0
    assert fid["teacher_forced"]["kl"]["mean"] < 1e-9
    assert fid["hidden_cosine"]["min"] > 1 - 1e-6
    assert fid["per_tensor"]["worst_output"][0]["rel_error"] < 1e-5


def test_fallback_reaches_a_stricter_target_than_plain_static(quantized, tiny_artifacts, calib, tmp_path: Path):
    plain = json.loads((quantized["static"] / "artifact.json").read_text())["fidelity"]
    cos0 = plain["hidden_cosine"]["mean"]
    target = cos0 + (1 - cos0) * 0.5
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "fb", QuantizeConfig("static", calibration=calib,
                            min_cosine=target, step_nodes=2, **FID))
    meta = json.loads((out / "artifact.json").read_text())
    fb = meta["quantization"]["fallback"]
    assert fb["met"] is True and "targets met" in fb["message"]
    assert meta["fidelity"]["hidden_cosine"]["mean"] >= target > cos0
    assert fb["excluded_tensors"] or fb["head_code_kept_fp32"]
    assert len(fb["steps"]) >= 2 and fb["steps"][1]["newly_excluded"]
    assert all(s["gpt_bytes"] > 0 and s["gpt_step_ms_2threads"] > 0 for s in fb["steps"])
    # The nodes kept in FP32 are plain MatMuls again: their weight is not a DequantizeLinear output.
    excluded = meta["quantization"]["components"]["gpt"]["excluded_nodes"]
    graph = onnx.load(str(out / "gpt.onnx"), load_external_data=False).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    by_name = {n.name: n for n in graph.node}
    for name in excluded:
        assert by_name[name].op_type == "MatMul" and producer.get(by_name[name].input[1]) != "DequantizeLinear"
    assert len(excluded) == len(fb["excluded_tensors"])


def test_fallback_says_when_a_target_cannot_be_met(tiny_artifacts, tmp_path: Path):
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "fb", QuantizeConfig("dynamic", max_kl=-1.0, step_nodes=8, **FID))
    fb = json.loads((out / "artifact.json").read_text())["quantization"]["fallback"]
    assert fb["met"] is False and "cannot be met" in fb["message"]


def test_bad_requests(tiny_artifacts, quantized, tmp_path: Path):
    fp32 = tiny_artifacts["fp32"]
    with pytest.raises(ForgeError, match="needs --calibration"):
        quantize_artifact(fp32, tmp_path / "x", QuantizeConfig("static", fidelity=False))
    with pytest.raises(ForgeError, match="unknown method"):
        quantize_artifact(fp32, tmp_path / "x", QuantizeConfig("int3", fidelity=False))
    with pytest.raises(ForgeError, match="needs the FP32 artifact"):
        quantize_artifact(quantized["dynamic"], tmp_path / "x", QuantizeConfig("int4", fidelity=False))
    with pytest.raises(ForgeError, match=r"--min-agreement does not apply to --method int4 \(it applies to: dynamic, static\)"):
        quantize_artifact(fp32, tmp_path / "x", QuantizeConfig("int4", min_agreement=0.9, fidelity=False))
    with pytest.raises(ForgeError, match="unknown decoder weights 'int4'"):
        quantize_artifact(fp32, tmp_path / "x", QuantizeConfig("dynamic", decoder="int4", fidelity=False))
    assert not (tmp_path / "x").exists()
    res = CliRunner().invoke(main, ["quantize", "--artifact", str(tmp_path / "none"), "--method", "dynamic",
                                    "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_decoder_fp32_is_copied_as_it_is(tiny_artifacts, quantized, tmp_path: Path):
    fp32 = tiny_artifacts["fp32"]
    out = quantize_artifact(fp32, tmp_path / "dyn", QuantizeConfig("dynamic", decoder="fp32", fidelity=False))
    for name in ("decoder.onnx", "decoder.onnx.data"):
        assert sha256_file(out / name) == sha256_file(fp32 / name), name
    q = json.loads((out / "artifact.json").read_text())
    assert q["components"]["decoder"] == json.loads((fp32 / "artifact.json").read_text())["components"]["decoder"]
    assert q["quantization"]["options"]["decoder"] == "fp32" and "decoder" not in q["quantization"]["components"]
    assert q["quantization"]["not_quantized"]["decoder"] == "fp32 (--decoder fp32)"
    # everything but the Decoder equals the default build's (same method, same source)
    for name in ("gpt.onnx", "gpt_fast.onnx", "gpt_fast.onnx.data", "head_code.onnx"):
        assert sha256_file(out / name) == sha256_file(quantized["dynamic"] / name), name
    assert json.loads((quantized["dynamic"] / "artifact.json").read_text())["quantization"]["options"]["decoder"] == "int8"


def test_source_artifact_folder_is_never_written(tiny_artifacts, tmp_path: Path):
    src = tmp_path / "src"
    shutil.copytree(tiny_artifacts["fp32"], src)
    before = (src.stat().st_mtime_ns, sorted(p.name for p in src.iterdir()))
    quantize_artifact(src, tmp_path / "dyn", QuantizeConfig("dynamic", fidelity=False))
    assert (src.stat().st_mtime_ns, sorted(p.name for p in src.iterdir())) == before


def test_a_published_source_leaves_what_publish_added_behind(tiny_artifacts, tmp_path: Path):
    """Quantizing a published FP32 variant: its manifest, sums, signature, card and report describe
    that folder, so the quantized artifact does not carry them (the runtime would refuse the stale
    manifest, publish the reserved names)."""
    from chattts_forge.integrity import PUBLISHED_NAMES
    from chattts_forge.runtime import LoadedArtifact

    src = tmp_path / "published-fp32"
    shutil.copytree(tiny_artifacts["fp32"], src)
    for name in PUBLISHED_NAMES:
        (src / name).write_text("{}\n")
    out = quantize_artifact(src, tmp_path / "dyn", QuantizeConfig("dynamic", fidelity=False))
    assert not PUBLISHED_NAMES & {p.name for p in out.iterdir()}
    LoadedArtifact(out, verify="sha256").session("gpt")  # the folder is whole without them


def test_fast_gpt_graph_is_rebuilt_quantized_or_dropped(tiny_artifacts, calib, tmp_path: Path):
    from chattts_forge.quantize.fast_gpt_graph import optimize_artifact

    src = tmp_path / "fp32"
    shutil.copytree(tiny_artifacts["fp32"], src)
    optimize_artifact(src)  # adds the FP32 gpt_fast.onnx the runtime prefers
    int4 = quantize_artifact(src, tmp_path / "int4", QuantizeConfig("int4", **FID))
    meta = json.loads((int4 / "artifact.json").read_text())
    assert meta["components"]["gpt_fast"]["precision"] == "int4"
    assert "MatMulNBits" in _ops(int4 / "gpt_fast.onnx")
    assert meta["fidelity"]["gpt_fast"]["teacher_forced"]["top1_agreement"]["mean"] > 0
    static = quantize_artifact(src, tmp_path / "static", QuantizeConfig("static", calibration=calib, fidelity=False))
    smeta = json.loads((static / "artifact.json").read_text())
    assert smeta["components"]["gpt_fast"]["precision"] == "int8-static"
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(static / "gpt_fast.onnx")
    # Symmetric activations take onnxruntime's quantize_static (plain graph only): the fast graph is dropped.
    legacy = quantize_artifact(src, tmp_path / "legacy", QuantizeConfig("static", calibration=calib, symmetric_activations=True,
                               fidelity=False))
    lmeta = json.loads((legacy / "artifact.json").read_text())
    assert "gpt_fast" not in lmeta["components"] and not (legacy / "gpt_fast.onnx").exists()
    assert lmeta["quantization"]["gpt_fast"].startswith("dropped")


def _recorded_paths(meta: dict) -> list[str]:
    """Every path-valued record of an artifact.json (ONNX node names also start with '/': skipped)."""
    found = []

    def walk(o, key=""):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, k)
        elif isinstance(o, list):
            for v in o:
                walk(v, key)
        elif isinstance(o, str) and key in {"asset_dir", "path", "reference", "weights_from", "files"}:
            found.append(o)

    walk(meta)
    return found


@pytest.mark.parametrize("method", ["dynamic", "static", "int4"])
def test_artifact_json_records_paths_relative_to_its_folder(quantized, tiny_artifacts, tiny_ckpt, method: str):
    """A build tree records the same artifact.json bytes wherever it sits on disk."""
    from chattts_forge.fsutil import recorded_path

    for folder in (tiny_artifacts["fp32"], quantized[method]):
        meta = json.loads((folder / "artifact.json").read_text())
        paths = _recorded_paths(meta)
        assert paths and not [p for p in paths if Path(p).is_absolute()]
        assert recorded_path(meta["source"]["asset_dir"], folder) == tiny_ckpt.resolve()
    meta = json.loads((quantized[method] / "artifact.json").read_text())
    assert recorded_path(meta["quantization"]["source_artifact"]["path"], quantized[method]) == tiny_artifacts["fp32"].resolve()
    if method == "static":
        cal = meta["quantization"]["calibration"]
        assert recorded_path(cal["source_artifact"]["source"]["asset_dir"], quantized[method]) == tiny_ckpt.resolve()
        # corpus files by their path under the corpus root (the built-in corpora here), with sha256
        from chattts_forge.calibration_data.corpus import CORPORA_DIR
        from chattts_forge.integrity import sha256_file

        corpus = cal["corpus"]
        assert corpus["files"] and not [f for f in corpus["files"] if Path(f).is_absolute()]
        for f in corpus["files"]:
            assert corpus["file_sha256"][Path(f).name] == sha256_file(CORPORA_DIR / f)


@pytest.mark.parametrize("method", ["dynamic", "static", "int4", "auto"])
def test_quantization_block_is_the_typed_record(quantized, method: str):
    """artifact.json's `quantization` is `artifact.Quantization` as written: loading it and writing it
    back gives the same JSON text (keys, order, values), the optional keys only where the method has them."""
    from chattts_forge.artifact import Quantization, QuantizationOptions

    q = json.loads((quantized[method] / "artifact.json").read_text())["quantization"]
    record = Quantization.from_dict(q)
    assert record.method == method and isinstance(record.options, QuantizationOptions)
    assert json.dumps(record.to_dict()) == json.dumps(q)
    assert ("algorithm" in q, "auto" in q, "kv_cache" in q) == (method == "int4", method == "auto", False)
    assert ("algorithm" in q["options"]) == (method == "int4")
    with pytest.raises(ForgeError, match="unknown key"):
        Quantization.from_dict(q | {"blocksize": 32})
    with pytest.raises(ForgeError, match="missing key.*sizes"):
        Quantization.from_dict({k: v for k, v in q.items() if k != "sizes"})
