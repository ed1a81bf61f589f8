"""convert: FP32/FP16 artifacts of the tiny checkpoint, their records, and failure behaviour."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from chattts_forge.integrity import sha256_file
from chattts_forge.quantize.fast_gpt_graph import FAST_GPT_OPSET

COMPONENTS = ("embed", "gpt", "head_code", "head_text", "decoder", "dvae", "dvae_encoder", "vocos")
META_KEYS = (
    "component",
    "precision",
    "sample_rate",
    "hop_length",
    "num_vq",
    "n_mels",
    "hidden_size",
    "num_hidden_layers",
    "chattts_forge_version",
)


def _artifact(folder: Path) -> dict:
    return json.loads((folder / "artifact.json").read_text(encoding="utf-8"))


def _session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def _position_ids(mask: np.ndarray, seq: int) -> np.ndarray:
    pos = np.cumsum(mask, -1) - 1
    pos[mask == 0] = 1
    return pos[:, -seq:].astype(np.int64)


def test_fp32_parity_recorded_within_tolerance(tiny_artifacts):
    doc = _artifact(tiny_artifacts["fp32"])
    # fp32/ also holds the fused GPT graph (quantize.fast_gpt_graph), checked against gpt.onnx itself.
    assert set(doc["components"]) == {*COMPONENTS, "gpt_fast"}
    fast = doc["components"]["gpt_fast"]["parity"]
    assert fast["reference"].startswith("plain gpt.onnx") and 0 <= fast["max_abs"] <= fast["tolerance_abs"] == 1e-4
    for name in COMPONENTS:
        comp = doc["components"][name]
        parity = comp["parity"]
        assert parity["tolerance_abs"] == 1e-4, name
        assert 0 <= parity["max_abs"] <= 1e-4, (name, parity["max_abs"])
        assert np.isfinite(parity["max_rel"]), name
        batches = {shape[0] for case in parity["cases"] for shape in case["input_shapes"].values()}
        assert {1, 3} <= batches, (name, batches)
        assert all(case["max_abs"] <= parity["max_abs"] for case in parity["cases"])
    gpt_pasts = {
        c["input_shapes"]["past_key_values.0.key"][2] for c in doc["components"]["gpt"]["parity"]["cases"]
    }
    assert 0 in gpt_pasts and max(gpt_pasts) > 0
    # The vocoder waveform against vocos.decode is held to the same 1e-4.
    assert doc["components"]["vocos"]["parity"]["max_abs"] <= 1e-4


def test_artifact_json_and_metadata_complete(tiny_artifacts, tiny_ckpt):
    for variant, folder in tiny_artifacts.items():
        doc = _artifact(folder)
        assert doc["schema"] == "chattts-forge/artifact/1"
        assert doc["variant"] == variant
        assert doc["audio"] == {"sample_rate": 24000, "hop_length": 256, "n_mels": 100, "num_vq": 4}
        assert doc["tokens"]["eos_code"] == 625
        assert {"spk_emb", "empty_spk", "Stts", "Ptts", "break_0", "Ebreak"} <= set(doc["tokens"])
        assert doc["source"]["kind"] == "synthetic" and doc["source"]["preset"] == "tiny"
        assert doc["source"]["hashes"]["gpt/model.safetensors"] == sha256_file(
            tiny_ckpt / "gpt/model.safetensors"
        )
        assert doc["versions"]["onnxruntime"] and doc["versions"]["torch"]
        assert doc["toolchain"]["name"] == "chattts-forge"
        for rec in doc["files"].values():  # support files: {file, bytes, sha256}, as external data is recorded
            assert (folder / rec["file"]).is_file(), rec
            assert rec["bytes"] == (folder / rec["file"]).stat().st_size
            assert rec["sha256"] == sha256_file(folder / rec["file"])
        stats = np.load(folder / "speaker_stats.npy")
        assert stats.dtype == np.float16 and stats.shape == (2, doc["dims"]["hidden_size"])
        coef = json.loads((folder / "dvae_coef.json").read_text())
        assert len(coef["decoder"]) == 100 and len(coef["dvae"]) == 100
        for name, comp in doc["components"].items():
            path = folder / comp["file"]
            assert comp["sha256"] == sha256_file(path)
            assert comp["bytes"] == path.stat().st_size
            assert comp["converter"]
            model = onnx.load(str(path))
            # the recorded opset is the graph's standard-domain import (the fused GPT needs 23 for RMSNormalization)
            assert comp["opset"] == (FAST_GPT_OPSET if name == "gpt_fast" else 17)
            assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {comp["opset"]}
            props = {p.key: p.value for p in model.metadata_props}
            assert set(META_KEYS) <= set(props), name
            assert props["component"] == name
            assert props["precision"] == comp["precision"]
            assert [i.name for i in model.graph.input] == [i["name"] for i in comp["inputs"]]
            assert [o.name for o in model.graph.output] == [o["name"] for o in comp["outputs"]]
            # float32 at every graph boundary, also in FP16 graphs (the fused GPT adds the int32
            # sequence lengths GroupQueryAttention takes)
            allowed = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL}
            if name == "gpt_fast":
                allowed.add(onnx.TensorProto.INT32)
            for io in (*model.graph.input, *model.graph.output):
                assert io.type.tensor_type.elem_type in allowed, (name, io.name)


def test_fp16_artifact(tiny_artifacts):
    fp32, fp16 = tiny_artifacts["fp32"], tiny_artifacts["fp16"]
    doc = _artifact(fp16)
    # The vocoder and the DVAE encoder (voice cloning: exact codes) stay FP32, the same bytes.
    for name in ("vocos", "dvae_encoder"):
        assert sha256_file(fp16 / f"{name}.onnx") == sha256_file(fp32 / f"{name}.onnx")
        assert doc["components"][name]["precision"] == "fp32"
        assert doc["fp16"]["converters"][name].startswith("none (kept FP32")
    assert "none" not in doc["fp16"]["converter"]
    for name in ("embed", "gpt", "head_code", "head_text", "decoder", "dvae"):
        comp = doc["components"][name]
        assert comp["precision"] == "fp16"
        assert doc["fp16"]["converters"][name] == comp["converter"]
        err = doc["fp16"]["error_vs_fp32"][name]
        assert np.isfinite(err["max_abs"]) and err["max_rel"] <= comp["parity"]["tolerance_rel"]
        model = onnx.load(str(fp16 / comp["file"]))
        fp16_inits = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
        assert fp16_inits, f"{name}: no FP16 weights"
    # onnxconverter-common wherever it works; the GPT falls back (1.16 crashes on it) and says so.
    assert doc["fp16"]["converters"]["head_code"].startswith("onnxconverter-common")


def test_fp16_graphs_run_on_cpu_close_to_fp32(tiny_artifacts):
    fp32, fp16 = tiny_artifacts["fp32"], tiny_artifacts["fp16"]
    doc = _artifact(fp32)
    dims = doc["dims"]
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        feeds = {
            "head_code.onnx": {
                "hidden_states": rng.standard_normal((batch, dims["hidden_size"]), dtype=np.float32)
            },
            "decoder.onnx": {
                "hidden_states": rng.standard_normal((batch, dims["hidden_size"], 9), dtype=np.float32)
            },
            "dvae.onnx": {"codes": rng.integers(0, 625, (batch, 4, 9)).astype(np.int64)},
            "embed.onnx": {
                "input_ids": rng.integers(0, 600, (batch, 5, 4)).astype(np.int64),
                "text_mask": np.array([[True, True, False, False, False]] * batch),
            },
        }
        layers = dims["num_hidden_layers"]
        head_dim = dims["hidden_size"] // dims["num_attention_heads"]
        for past_len in (0, 4):
            mask = np.ones((batch, past_len + 3), np.int64)
            mask[-1, :2] = 0
            past = [
                rng.standard_normal(
                    (batch, dims["num_key_value_heads"], past_len, head_dim), dtype=np.float32
                )
                for _ in range(2 * layers)
            ]
            embeds = rng.standard_normal((batch, 3, dims["hidden_size"]), dtype=np.float32)
            feeds[f"gpt.onnx@past{past_len}"] = _gpt_feed(past, embeds, mask, layers)
        for key, feed in feeds.items():
            file = key.split("@")[0]
            ref = _session(fp32 / file).run(None, feed)
            got = _session(fp16 / file).run(None, feed)
            for r, g in zip(ref, got, strict=True):
                assert g.dtype == np.float32 and g.shape == r.shape
                assert np.all(np.isfinite(g)), key
                if file == "gpt.onnx":  # left-padding rows are never read; compare real positions
                    real = feed["attention_mask"].astype(bool)
                    keep = real[:, None, :, None] if g.ndim == 4 else real[:, -g.shape[1] :, None]
                    r, g = r[np.broadcast_to(keep, r.shape)], g[np.broadcast_to(keep, g.shape)]
                assert np.abs(g - r).max() <= 5e-2 * np.abs(r).max(), key


def _gpt_feed(past_arrays, embeds, mask, layers):
    feed = {
        "inputs_embeds": embeds,
        "attention_mask": mask,
        "position_ids": _position_ids(mask, embeds.shape[1]),
    }
    for i in range(layers):
        feed[f"past_key_values.{i}.key"] = past_arrays[2 * i]
        feed[f"past_key_values.{i}.value"] = past_arrays[2 * i + 1]
    return feed


@pytest.mark.parametrize("batch", [1, 3])
def test_gpt_graph_incremental_equals_full_and_chattts(tiny_artifacts, tiny_chat, batch):
    """Past 0 (empty Concat inputs) and past > 0, batch 1 and 3, left padding: prefill + decode
    steps through the graph equal one full pass and ChatTTS's own LlamaModel call."""
    import torch

    from chattts_forge.convert.components import gpt_reference

    folder = tiny_artifacts["fp32"]
    dims = _artifact(folder)["dims"]
    layers, heads, head_dim = (
        dims["num_hidden_layers"],
        dims["num_key_value_heads"],
        dims["hidden_size"] // dims["num_attention_heads"],
    )
    sess = _session(folder / "gpt.onnx")
    rng = np.random.default_rng(batch)
    total, prefill = 12, 8
    embeds = rng.standard_normal((batch, total, dims["hidden_size"]), dtype=np.float32)
    mask = np.ones((batch, total), dtype=np.int64)
    if batch == 3:
        mask[1, :2] = 0
        mask[2, :5] = 0
    empty = [np.zeros((batch, heads, 0, head_dim), np.float32) for _ in range(2 * layers)]
    full = sess.run(None, _gpt_feed(empty, embeds, mask, layers))
    out = sess.run(None, _gpt_feed(empty, embeds[:, :prefill], mask[:, :prefill], layers))
    hidden_steps = [out[0]]
    past = out[1:]
    for t in range(prefill, total):
        out = sess.run(None, _gpt_feed(past, embeds[:, t : t + 1], mask[:, : t + 1], layers))
        assert out[1].shape == (batch, heads, t + 1, head_dim)
        hidden_steps.append(out[0])
        past = out[1:]
    incremental = np.concatenate(hidden_steps, 1)
    real = mask.astype(bool)
    assert np.abs(incremental - full[0])[real].max() < 1e-5
    ref_hidden, _ = gpt_reference(tiny_chat.gpt.gpt, torch.from_numpy(embeds), torch.from_numpy(mask), [])
    assert np.abs(full[0] - ref_hidden.numpy())[real].max() < 1e-4


def test_vocos_graph_matches_vocos_decode(tiny_artifacts, tiny_chat):
    import torch

    rng = np.random.default_rng(5)
    mel = (rng.standard_normal((3, 100, 37)) * 2 - 3).astype(np.float32)
    with torch.inference_mode():
        ref = tiny_chat.vocos.decode(torch.from_numpy(mel)).numpy()
    got = _session(tiny_artifacts["fp32"] / "vocos.onnx").run(None, {"mel": mel})[0]
    assert got.shape == ref.shape == (3, 256 * 36)
    assert np.abs(got - ref).max() < 1e-5


def _run_cli(*args: str):
    """The real `chattts-forge` entry point, in-process (the modules are already imported)."""
    from click.testing import CliRunner

    from chattts_forge.cli import main

    return CliRunner().invoke(main, list(args))


def test_broken_checkpoint_fails_cleanly(tiny_ckpt, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_ckpt, broken)
    weights = broken / "gpt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    out = tmp_path / "out"
    proc = _run_cli("convert", "--checkpoint", str(broken), "--out", str(out), "--precision", "fp32")
    assert proc.exit_code == 2, proc.output
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "checkpoint" in error_lines[0]
    assert not out.exists()


def test_unwritable_output_fails_cleanly(tiny_ckpt, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    out = blocker / "out"
    proc = _run_cli("convert", "--checkpoint", str(tiny_ckpt), "--out", str(out))
    assert proc.exit_code == 2, proc.output
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [blocker]


def test_failed_parity_writes_nothing(tiny_ckpt, tmp_path, monkeypatch):
    """An export outside its tolerance raises ForgeError and leaves no (partial) artifact folder."""
    from chattts_forge.convert import components, export
    from chattts_forge.errors import ForgeError

    real = components.SPEC_BUILDERS["head_code"]

    def strict(src, dims):
        spec = real(src, dims)
        spec.tolerance_abs = 0.0  # the real error (~1e-6) cannot meet this
        return spec

    monkeypatch.setitem(components.SPEC_BUILDERS, "head_code", strict)
    out = tmp_path / "out"
    with pytest.raises(ForgeError, match="head_code.*parity"):
        export.convert_checkpoint(tiny_ckpt, out, precision="all")
    assert not out.exists() or not any(out.iterdir())
