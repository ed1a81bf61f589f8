"""graph_storage: the runtime's graphs keep their weights in page-aligned external data; the
numbers are unchanged, the records describe both files, and the runtime checks both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from chattts_forge.artifact import EXTERNAL_DATA_COMPONENTS, ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.graph_storage import (
    ALIGN,
    ALIGN_THRESHOLD,
    SIZE_THRESHOLD,
    is_stored_externally,
    save_with_external_data,
    store_components_externally,
)
from chattts_forge.integrity import sha256_file


def _model() -> onnx.ModelProto:
    """x @ big + small_bias, with a mid-sized tensor between them so the big one needs padding."""
    rng = np.random.default_rng(0)
    big = rng.standard_normal((64, 4096 + 3)).astype(np.float32)  # > ALIGN_THRESHOLD bytes
    mid = rng.standard_normal((300,)).astype(np.float32)  # external, not aligned
    bias = np.array(0.5, dtype=np.float32)  # below SIZE_THRESHOLD: stays inline
    assert big.nbytes >= ALIGN_THRESHOLD and SIZE_THRESHOLD <= mid.nbytes < ALIGN_THRESHOLD and bias.nbytes < SIZE_THRESHOLD
    nodes = [
        helper.make_node("ReduceSum", ["mid"], ["mid_sum"], keepdims=0),
        helper.make_node("MatMul", ["x", "big"], ["y0"]),
        helper.make_node("Add", ["y0", "mid_sum"], ["y1"]),
        helper.make_node("Add", ["y1", "bias"], ["y2"]),
        helper.make_node("ReduceSum", ["y2"], ["y"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(mid, "mid"), numpy_helper.from_array(big, "big"),
                     numpy_helper.from_array(bias, "bias")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_external_data_keeps_the_numbers_aligns_and_leaves_the_model_alone(tmp_path: Path):
    model = _model()
    before = model.SerializeToString()
    inline, external = tmp_path / "inline.onnx", tmp_path / "ext.onnx"
    inline.write_bytes(before)
    assert save_with_external_data(model, external) == ["ext.onnx", "ext.onnx.data"]
    assert model.SerializeToString() == before  # the caller's model is untouched
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    assert np.array_equal(_run(inline, x), _run(external, x))

    stored = onnx.load(str(external), load_external_data=False)
    where = {t.name: {e.key: e.value for e in t.external_data} for t in stored.graph.initializer}
    assert where["bias"] == {}  # small: inline
    assert where["mid"]["location"] == "ext.onnx.data" and int(where["mid"]["offset"]) == 0
    assert int(where["big"]["offset"]) % ALIGN == 0 and int(where["big"]["offset"]) > 0  # padded after "mid"
    assert is_stored_externally(external) and not is_stored_externally(inline)
    # Deterministic: the same model written again gives the same bytes (no appending to the data file).
    first = (external.read_bytes(), (tmp_path / "ext.onnx.data").read_bytes())
    save_with_external_data(onnx.load(str(external)), external)
    assert (external.read_bytes(), (tmp_path / "ext.onnx.data").read_bytes()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data", "inline.onnx"]  # no temp left


def test_tensors_in_typed_fields_count_and_move(tmp_path: Path):
    """Exporters may write float_data instead of raw_data: such a tensor is inline payload too."""
    model = _model()
    mid = numpy_helper.to_array(model.graph.initializer[0])
    model.graph.initializer[0].CopyFrom(helper.make_tensor("mid", onnx.TensorProto.FLOAT, mid.shape, mid.tolist()))
    assert not model.graph.initializer[0].HasField("raw_data")
    typed = tmp_path / "typed.onnx"
    typed.write_bytes(model.SerializeToString())
    (tmp_path / "typed.onnx.data").write_bytes(b"stale")
    assert not is_stored_externally(typed)  # a data file beside it is not enough
    save_with_external_data(model, typed)
    assert is_stored_externally(typed)
    x = np.ones((2, 64), np.float32)
    assert np.array_equal(_run(typed, x), ort.InferenceSession(model.SerializeToString(),
                                                              providers=["CPUExecutionProvider"]).run(None, {"x": x})[0])


def test_converted_artifacts_store_the_runtime_graphs_externally(tiny_artifacts):
    for variant in ("fp32", "fp16"):
        folder = tiny_artifacts[variant]
        meta = ArtifactMeta.load(folder)
        for name, rec in meta.components.items():
            graph = folder / rec["file"]
            assert rec["sha256"] == sha256_file(graph) and rec["bytes"] == graph.stat().st_size, (variant, name)
            if name in EXTERNAL_DATA_COMPONENTS:
                data = folder / rec["external_data"]["file"]
                assert rec["external_data"] == {"file": f"{rec['file']}.data", "bytes": data.stat().st_size,
                                                "sha256": sha256_file(data)}
                assert is_stored_externally(graph), (variant, name)
            else:
                assert "external_data" not in rec and not (folder / f"{rec['file']}.data").exists(), (variant, name)
    # The vocoder stays byte-identical across variants, weights included.
    for f in ("vocos.onnx", "vocos.onnx.data"):
        assert sha256_file(tiny_artifacts["fp32"] / f) == sha256_file(tiny_artifacts["fp16"] / f)


def test_store_is_idempotent_and_converts_an_inline_folder(tiny_artifacts, tmp_path: Path):
    """An artifact written before external data (every graph inline) converts in place, the same
    numbers; a second pass rewrites nothing."""
    src = tiny_artifacts["fp32"]
    folder = tmp_path / "old"
    shutil.copytree(src, folder)
    meta = ArtifactMeta.load(folder)
    vocos = meta.component_file(folder, "vocos")
    save_inline = onnx.load(str(vocos))  # loads the weights from vocos.onnx.data
    (folder / "vocos.onnx.data").unlink()
    vocos.write_bytes(save_inline.SerializeToString())
    assert not is_stored_externally(vocos)
    assert store_components_externally(folder, meta, ["vocos"]) == ["vocos"]
    assert sha256_file(vocos) == sha256_file(src / "vocos.onnx")
    assert sha256_file(folder / "vocos.onnx.data") == sha256_file(src / "vocos.onnx.data")
    assert meta.components["vocos"] == ArtifactMeta.load(src).components["vocos"]
    assert store_components_externally(folder, meta) == []


def test_runtime_checks_the_external_data_file(tiny_artifacts, tmp_path: Path):
    from chattts_forge.runtime.loaded_artifact import LoadedArtifact

    folder = tmp_path / "a"
    shutil.copytree(tiny_artifacts["fp32"], folder)
    data = folder / "embed.onnx.data"
    blob = bytearray(data.read_bytes())
    blob[-1] ^= 0xFF  # same size, different bytes: only the sha256 can tell (tiny: cheap to hash)
    data.write_bytes(bytes(blob))
    with pytest.raises(ForgeError, match="embed.onnx.data does not match its sha256"):
        LoadedArtifact(folder).check_component("embed")
    data.write_bytes(bytes(blob[:-8]))
    with pytest.raises(ForgeError, match="embed.onnx.data has .* bytes, artifact.json says"):
        LoadedArtifact(folder).check_component("embed")
    data.unlink()
    with pytest.raises(ForgeError, match=r"embed.onnx.data \(component 'embed'\) is missing"):
        LoadedArtifact(folder).check_component("embed")
    # The record is what the runtime reads: artifact.json names the data file.
    assert json.loads((folder / "artifact.json").read_text())["components"]["embed"]["external_data"]["file"] == (
        "embed.onnx.data")
