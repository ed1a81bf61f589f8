"""Checking the FP32 source artifact, copying what is not quantized, describing quantized graphs.

Nothing here imports torch: only onnx, onnxruntime's quantization tools and numpy.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from chattts_forge.artifact import ARTIFACT_JSON, GPT, ArtifactMeta
from chattts_forge.errors import BadInput
from chattts_forge.graph_storage import storage_record

# Op types that carry integer / low-bit math once a graph is quantized.
INT8_OPS = {
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "QLinearMatMul",
    "MatMulIntegerToFloat",
    "ConvInteger",
    "QLinearConv",
    "QuantizeLinear",
    "DequantizeLinear",
    "QGemm",
    "QAttention",
}
INT4_OPS = {"MatMulNBits", "GatherBlockQuantized"}
QUANTIZED_OPS = INT8_OPS | INT4_OPS
# Float ops a quantizer could have turned into integer ones (for "what stayed FP32").
QUANTIZABLE_FLOAT_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather"}


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


def graph_summary(path: Path) -> dict[str, Any]:
    """Op-type counts of a graph, the quantized ops among them and the float ops left in FP32."""
    model = onnx.load(str(path), load_external_data=False)
    counts = Counter(n.op_type for n in model.graph.node)
    # In QDQ graphs a quantized MatMul stays a MatMul node whose weight comes from DequantizeLinear.
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    qdq_matmuls = sum(
        1 for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and producer.get(n.input[1]) == "DequantizeLinear"
    )
    float_left = {k: v for k, v in sorted(counts.items()) if k in QUANTIZABLE_FLOAT_OPS}
    if qdq_matmuls:
        float_left["MatMul"] = float_left.get("MatMul", 0) - qdq_matmuls
        float_left = {k: v for k, v in float_left.items() if v}
    quantized = {k: v for k, v in sorted(counts.items()) if k in QUANTIZED_OPS}
    if qdq_matmuls:
        quantized["MatMul (QDQ)"] = qdq_matmuls
    return {"op_types": dict(sorted(counts.items())), "quantized_ops": quantized, "float_ops_left": float_left}


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


def matmul_nodes_with_const_weight(model: onnx.ModelProto) -> list[str]:
    """Names of MatMul/Gemm nodes whose second input is an initializer (what weight quantizers touch)."""
    inits = {i.name for i in model.graph.initializer}
    # A weight may reach the MatMul through a Transpose/Identity of an initializer (TorchScript export).
    produced_from_init = {}
    for node in model.graph.node:
        if node.op_type in ("Transpose", "Identity", "Cast") and node.input and node.input[0] in inits:
            produced_from_init[node.output[0]] = node.input[0]
    consts = inits | set(produced_from_init)
    names = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in consts:
            names.append(node.name)
    return names
