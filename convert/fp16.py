"""FP32 -> FP16 graph conversion, float32 kept at the graph boundary (keep_io_types).

onnxconverter-common is used wherever it works; its 1.16 release crashes on the GPT graph
(`remove_unnecessary_cast_node`: "'list' object has no attribute 'input'"), so there we fall back
to `onnxruntime.transformers.float16`, the same algorithm maintained in onnxruntime. Which converter
produced each file is recorded in artifact.json.

Op block list (kept in float32 on top of each converter's defaults), and why:
- `RandomNormalLike`/`RandomUniformLike`/`Range`/`CumSum`: index and position arithmetic, never
  worth FP16;
- `Pow`, `ReduceMean`, `Sqrt`, `Reciprocal`: the RMSNorm/LayerNorm statistics. x**2 overflows FP16
  (65504) for activations above 256, which ChatTTS's GPT reaches; the norm is cheap in float32.
- `Exp`, `Clip`, `Cos`, `Sin`: the vocoder's (it stays float32 anyway) and RoPE's.
Node block list: every node of the rotary embedding (`/rotary_emb/` in its name, constants
included). Its angle is position * inv_freq: with inv_freq rounded to FP16 (5e-4 relative) and the
angle itself in FP16 (resolution 0.25 above 256), keys at position 300 came out 3% wrong
(measured on `full`). Both converters still route values between two blocked nodes through an
FP16 Cast and back; `bypass_fp16_round_trips` rewires those to the float32 value.
"""

from __future__ import annotations

import warnings
from importlib import metadata
from typing import Any

import onnx

from chattts_forge.log import get_logger

log = get_logger(__name__)

NODE_BLOCK_PATTERNS: tuple[str, ...] = ("/rotary_emb/",)

EXTRA_OP_BLOCK_LIST: tuple[str, ...] = (
    "RandomNormalLike",
    "RandomUniformLike",
    "Range",
    "CumSum",
    "Pow",
    "ReduceMean",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Clip",
    "Cos",
    "Sin",
)


def _converter_versions() -> dict[str, str]:
    out = {}
    for dist in ("onnxconverter-common", "onnxruntime"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


def op_block_list(converter: str) -> list[str]:
    if converter == "onnxconverter-common":
        # the chosen FP16 converter only; 1.3 s to import either
        from onnxconverter_common import float16
    else:
        # the chosen FP16 converter only; 1.3 s to import either
        from onnxruntime.transformers import float16
    return sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(EXTRA_OP_BLOCK_LIST))


def convert_to_fp16(model: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """An FP16 copy of `model` (float32 inputs/outputs) and a record of how it was made."""
    versions = _converter_versions()
    errors: dict[str, str] = {}
    blocked_nodes = [n.name for n in model.graph.node if any(p in n.name for p in NODE_BLOCK_PATTERNS)]
    for converter in ("onnxconverter-common", "onnxruntime.transformers.float16"):
        blocked = op_block_list(converter)
        src = onnx.ModelProto()
        src.CopyFrom(model)
        try:
            with warnings.catch_warnings():
                # "the float32 number X will be truncated": expected for the -1e4 attention mask.
                warnings.simplefilter("ignore", UserWarning)
                out = _run_converter(converter, src, blocked, blocked_nodes)
            bypassed = bypass_fp16_round_trips(out)
        except Exception as e:  # converter bugs surface as arbitrary exceptions
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors[converter] = f"{type(e).__name__}: {first}"
            log.info("%s: %s failed (%s); trying the next converter", name, converter, errors[converter])
            continue
        if converter == "onnxconverter-common":
            label = f"onnxconverter-common {versions['onnxconverter-common']}"
        else:
            label = f"onnxruntime.transformers.float16 (onnxruntime {versions['onnxruntime']})"
        record: dict[str, Any] = {
            "converter": label,
            "keep_io_types": True,
            "op_block_list": blocked,
            "node_block_list": blocked_nodes,
            "fp16_round_trips_bypassed": bypassed,
        }
        if errors:
            record["fallback_from"] = errors
        return out, record
    raise RuntimeError(f"{name}: no FP16 converter worked: {errors}")


def bypass_fp16_round_trips(model: onnx.ModelProto) -> int:
    """Rewire `X -> Cast(fp16) -> Cast(fp32) -> ...` to `X -> Cast(fp32) -> ...`; returns how many.

    The second Cast is kept (it still gives float32 if X was not), so types are unchanged; the
    FP16 Cast is dropped once nothing else reads it.
    """
    graph = model.graph
    fp16, fp32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT

    def cast_to(node: onnx.NodeProto) -> int | None:
        if node.op_type != "Cast":
            return None
        return next((a.i for a in node.attribute if a.name == "to"), None)

    # Only a float32 X loses precision in the round trip (the converters also leave identity
    # Cast(fp16) of FP16 values, and rewiring those trips an onnxruntime optimizer bug).
    inferred = onnx.shape_inference.infer_shapes(model)
    elem_types = {
        v.name: v.type.tensor_type.elem_type
        for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
    }
    elem_types.update({t.name: t.data_type for t in graph.initializer})
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    rewired = 0
    dead: list[onnx.NodeProto] = []
    for node in graph.node:
        if cast_to(node) != fp16 or node.output[0] in graph_outputs:
            continue
        if elem_types.get(node.input[0]) != fp32:
            continue
        users = consumers.get(node.output[0], [])
        to32 = [u for u in users if cast_to(u) == fp32]
        for user in to32:
            user.input[0] = node.input[0]
            rewired += 1
        if to32 and len(to32) == len(users):
            dead.append(node)
    for node in dead:
        graph.node.remove(node)
    _topological_sort(graph)
    return rewired


def _topological_sort(graph: onnx.GraphProto) -> None:
    """Order nodes so every input is produced before it is read (the converters append their
    Casts at the end; onnxruntime rejects some such graphs once inputs are rewired)."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise RuntimeError("graph has a cycle or a dangling input after FP16 conversion")
        ready_ids = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in ready_ids]
        for n in ready:
            available.update(n.output)
        ordered.extend(ready)
    copies = [onnx.NodeProto() for _ in ordered]
    for c, n in zip(copies, ordered, strict=True):
        c.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(copies)


def _run_converter(
    converter: str, model: onnx.ModelProto, blocked: list[str], blocked_nodes: list[str]
) -> onnx.ModelProto:
    if converter == "onnxconverter-common":
        # the chosen FP16 converter only; 1.3 s to import either
        from onnxconverter_common import float16

        return float16.convert_float_to_float16(
            model, keep_io_types=True, op_block_list=blocked, node_block_list=blocked_nodes or None
        )
    # the chosen FP16 converter only; 1.3 s to import either
    from onnxruntime.transformers import float16 as ort_float16

    return ort_float16.convert_float_to_float16(
        model, keep_io_types=True, op_block_list=blocked, node_block_list=blocked_nodes or None
    )
