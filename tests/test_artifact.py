"""The artifact contract (chattts_forge.artifact): artifact.json as a typed object, names, hashing."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pytest

from chattts_forge.artifact import (
    ARTIFACT_JSON,
    BASE_KEYS,
    FAST_GPT,
    FAST_GPT_FILE,
    FLOAT_VARIANTS,
    KV_CACHE_SUFFIX,
    KV_CACHE_VARIANTS,
    KV_CACHES,
    METHOD_PRECISION,
    METHOD_VARIANT,
    QUANTIZE_METHODS,
    SCHEMA,
    VARIANT_KV_CACHE,
    VARIANT_METHOD,
    VARIANTS,
    ArtifactMeta,
    quantized_variant,
)
from chattts_forge.errors import ForgeError
from chattts_forge.folder_files import hash_tree
from chattts_forge.integrity import sha256_file

REPO = Path(__file__).resolve().parent.parent
# The installed packages' source folders (pyproject's package-dir), tests excluded.
SOURCE_DIRS = ("chattts_forge", "convert", "runtime", "calibration_data", "quantize", "evaluate", "publish")


def _minimal(**changes: object) -> dict:
    doc = {"schema": SCHEMA, "name": "chattts", "variant": "fp32",
           "components": {"gpt": {"file": "gpt.onnx", "precision": "fp32"}}}
    doc.update(changes)
    return doc


def _write(folder: Path, doc: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ARTIFACT_JSON).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return folder


def _document_bytes(meta: ArtifactMeta) -> bytes:
    # The serialisation fsutil.atomic_write_json uses.
    return (json.dumps(meta.to_dict(), indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def test_load_then_write_gives_the_same_bytes(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    for variant, folder in tiny_artifacts.items():
        meta = ArtifactMeta.load(folder)
        assert meta.variant == variant and meta.schema == SCHEMA
        assert _document_bytes(meta) == (folder / ARTIFACT_JSON).read_bytes()
        copy = tmp_path / variant
        copy.mkdir()
        meta.write(copy)
        assert (copy / ARTIFACT_JSON).read_bytes() == (folder / ARTIFACT_JSON).read_bytes()
        assert sorted(p.name for p in copy.iterdir()) == [ARTIFACT_JSON]  # no temp file left


def test_a_fresh_description_has_the_documented_keys_in_order(tmp_path: Path) -> None:
    fresh = ArtifactMeta(variant="fp32", components={"gpt": {"file": "gpt.onnx"}})
    assert tuple(fresh.to_dict()) == BASE_KEYS
    # A quantized artifact always records `fidelity`, null when it was not measured, after the base keys.
    fresh.quantization = {"method": "dynamic"}
    assert tuple(fresh.to_dict()) == (*BASE_KEYS, "fidelity") and fresh.to_dict()["fidelity"] is None
    # Keys a loaded document had keep their place; unknown ones are kept too.
    folder = _write(tmp_path / "a", _minimal(future_section={"x": 1}, created_at="2026-11-30T00:00:00Z"))
    meta = ArtifactMeta.load(folder)
    assert meta.extra == {"future_section": {"x": 1}}
    meta.variant = "int4"
    meta.fidelity = {"mean": 1.0}
    assert list(meta.to_dict()) == ["schema", "name", "variant", "components", "future_section", "created_at",
                                     "fidelity"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is not an artifact folder"),
        ("{not json", "is unreadable"),
        ([1, 2], "not a JSON object"),
        (_minimal(schema="other/1"), "schema 'other/1' is not"),
        (_minimal(variant=3), "'variant' is missing"),
        (_minimal(components=["gpt"]), "'components' is missing or not a mapping"),
        (_minimal(components={"gpt": "gpt.onnx"}), "'components' is missing or not a mapping"),
        (_minimal(source="synthetic"), "'source' is not a JSON object"),
    ],
)
def test_a_broken_description_is_a_one_line_error(tmp_path: Path, content: object, message: str) -> None:
    folder = tmp_path / "art"
    folder.mkdir()
    if isinstance(content, str):
        (folder / ARTIFACT_JSON).write_text(content, encoding="utf-8")
    elif content is not None:
        _write(folder, content)
    with pytest.raises(ForgeError, match=message) as err:
        ArtifactMeta.load(folder)
    assert "\n" not in str(err.value)


def test_missing_folder_dims_and_component_are_named(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="does not exist"):
        ArtifactMeta.load(tmp_path / "nope")
    meta = ArtifactMeta.load(_write(tmp_path / "a", _minimal()))
    with pytest.raises(ForgeError, match="bad or missing 'dims'"):
        meta.require_dims()
    with pytest.raises(ForgeError, match="lists no component 'vocos'"):
        meta.component("vocos")
    with pytest.raises(ForgeError, match="component 'gpt' file .*gpt.onnx is missing"):
        meta.component_file(tmp_path / "a", "gpt")
    (tmp_path / "a" / "gpt.onnx").write_bytes(b"graph")
    assert meta.component_files(tmp_path / "a", "gpt") == [tmp_path / "a" / "gpt.onnx"]
    (tmp_path / "a" / "gpt.onnx.data").write_bytes(b"weights")
    assert meta.component_files(tmp_path / "a", "gpt") == [tmp_path / "a" / "gpt.onnx", tmp_path / "a" / "gpt.onnx.data"]
    assert meta.support_file("tokenizer") == "tokenizer.json"


def test_hash_tree_is_recursive_and_refuses_links(tmp_path: Path) -> None:
    root = tmp_path / "art"
    (root / "sub").mkdir(parents=True)
    (root / "a.onnx").write_bytes(b"a")
    (root / "sub" / "b.bin").write_bytes(b"bb")
    (root / ".hidden").write_bytes(b"")
    files = hash_tree(root)
    assert list(files) == [".hidden", "a.onnx", "sub/b.bin"]
    assert files["sub/b.bin"].bytes == 2 and files["sub/b.bin"].sha256 == sha256_file(root / "sub" / "b.bin")
    os.symlink(root / "a.onnx", root / "link.onnx")
    with pytest.raises(ForgeError, match="symbolic links"):
        hash_tree(root)
    with pytest.raises(ForgeError, match="is not a folder"):
        hash_tree(tmp_path / "nope")


def test_evaluate_and_publish_hash_the_same_files(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    """evaluate's report names exactly the files publish re-hashes (also inside subfolders)."""
    from chattts_forge.evaluate.report_assembly import describe_artifact

    art = shutil.copytree(tiny_artifacts["fp16"], tmp_path / "fp16")
    (art / "extra").mkdir()
    (art / "extra" / "notes.txt").write_text("x", encoding="utf-8")
    described = describe_artifact(art)["files"]
    assert described == {rel: {"sha256": e.sha256, "bytes": e.bytes} for rel, e in hash_tree(art).items()}
    assert "extra/notes.txt" in described


def test_variant_tables_agree() -> None:
    assert VARIANTS == (*FLOAT_VARIANTS, *(METHOD_VARIANT[m] for m in QUANTIZE_METHODS), *KV_CACHE_VARIANTS)
    assert len(set(VARIANTS)) == len(VARIANTS)
    assert {VARIANT_METHOD[METHOD_VARIANT[m]] for m in QUANTIZE_METHODS} == set(QUANTIZE_METHODS)
    assert set(VARIANT_METHOD) == set(VARIANTS) - set(FLOAT_VARIANTS)
    # An INT8-cache variant is named from its method and cache, and maps back to both.
    for variant, (method, kv) in KV_CACHE_VARIANTS.items():
        assert variant == quantized_variant(method, kv) != quantized_variant(method)
        assert VARIANT_METHOD[variant] == method and VARIANT_KV_CACHE[variant] == kv != "fp32"
    assert quantized_variant("dynamic", "int8") in VARIANTS
    assert set(KV_CACHE_SUFFIX) == set(KV_CACHES) and KV_CACHE_SUFFIX["fp32"] == ""
    for bad in (("dynamic", "fp16"), ("int2", "fp32")):
        with pytest.raises(ForgeError, match="unknown"):
            quantized_variant(*bad)
    assert set(METHOD_PRECISION) == set(QUANTIZE_METHODS)
    assert FAST_GPT_FILE == f"{FAST_GPT}.onnx"


def test_artifact_names_are_spelled_only_in_the_contract() -> None:
    """No module but chattts_forge/artifact.py spells the contract's file or component names."""
    names = {ARTIFACT_JSON, FAST_GPT, FAST_GPT_FILE}
    offenders = []
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == REPO / "chattts_forge" / "artifact.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in names:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert offenders == []


def test_a_description_without_a_name_stays_without_one(tmp_path: Path) -> None:
    doc = _minimal()
    del doc["name"]
    meta = ArtifactMeta.load(_write(tmp_path / "a", doc))
    assert meta.name is None and "name" not in meta.to_dict()
    assert _document_bytes(meta) == (tmp_path / "a" / ARTIFACT_JSON).read_bytes()


def test_quantize_writes_its_description_once(tiny_artifacts: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Fidelity (including the rebuilt fast GPT graph) reads the description in memory; artifact.json
    is written once, at the end, and then loads as the runtime reads it."""
    import chattts_forge.fsutil as fsutil
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    written: list[Path] = []
    real_write = fsutil.atomic_write_bytes

    def counting_write(path: Path, data: bytes) -> None:  # every atomic_write_* ends here
        written.append(Path(path))
        real_write(path, data)

    monkeypatch.setattr(fsutil, "atomic_write_bytes", counting_write)
    out = quantize_artifact(tiny_artifacts["fp32"], tmp_path / "int8", QuantizeConfig("dynamic", fidelity_sentences=1,
                            fidelity_steps=8, threads=1, progress=False))
    assert [p.name for p in written if p.name == ARTIFACT_JSON] == [ARTIFACT_JSON]
    meta = ArtifactMeta.load(out)
    assert meta.variant == METHOD_VARIANT["dynamic"] and meta.has_component(FAST_GPT)
    assert meta.fidelity is not None and FAST_GPT in meta.fidelity
    for name in ("gpt", "head_code", FAST_GPT):
        entry = meta.component(name)
        assert entry["sha256"] == sha256_file(meta.component_file(out, name))
