"""A quantized variant's folder made from the FP32 artifact: the source checked to be FP32, the files
not quantized copied byte for byte, a rewritten graph's metadata and its artifact.json entry.

(What a graph's ops say, quantized or float, is `quantize.graph_ops`.) Nothing here imports torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import onnx

from chattts_forge.artifact import ARTIFACT_JSON, GPT, ArtifactMeta
from chattts_forge.errors import BadInput
from chattts_forge.graph_storage import storage_record


def require_fp32_source(meta: ArtifactMeta, artifact_dir: Path) -> None:
    """Quantizing starts from FP32 only (quantizing FP16 or INT8 graphs again loses accuracy twice)."""
    gpt_precision = meta.component(GPT).get("precision", "fp32")
    if meta.quantization or gpt_precision != "fp32":
        raise BadInput(
            f"{artifact_dir} is a '{meta.variant}' artifact (gpt precision {gpt_precision}); "
            "quantize needs the FP32 artifact from `convert`"
        )


def copy_unchanged(src_dir: Path, dst_dir: Path, skip: set[str]) -> list[str]:
    """Copy every file of `src_dir` (recursively) except the names in `skip`, byte for byte."""
    copied = []
    for path in sorted(src_dir.rglob("*")):
        rel = path.relative_to(src_dir).as_posix()
        if not path.is_file() or rel in skip or rel == ARTIFACT_JSON:
            continue
        target = dst_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied.append(rel)
    return copied


def set_onnx_metadata(path: Path, updates: dict[str, str]) -> None:
    """Rewrite a saved model's metadata_props (keeps the others; the quantizers drop or keep them)."""
    model = onnx.load(str(path), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    props.update({k: str(v) for k, v in updates.items()})
    del model.metadata_props[:]
    for key in sorted(props):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, props[key]
    path.write_bytes(model.SerializeToString())


def copy_metadata_props(src: Path, dst: Path, precision: str) -> None:
    model = onnx.load(str(src), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    props["precision"] = precision
    set_onnx_metadata(dst, props)


def component_fields(path: Path, base: dict[str, Any], precision: str) -> dict[str, Any]:
    """artifact.json entry of a rewritten component before its files are hashed: the source entry
    with the new precision and file (its parity is the source's, so it is dropped)."""
    rec = {k: v for k, v in base.items() if k not in ("parity",)}
    rec["precision"] = precision
    rec["file"] = path.name
    return rec


def component_record(path: Path, base: dict[str, Any], precision: str) -> dict[str, Any]:
    """artifact.json entry of a component a quantizer wrote at `path`: `component_fields` with its
    hash and size (the source's external_data does not carry over)."""
    return storage_record(path.parent, component_fields(path, base, precision))
