"""The Llama weights of ChatTTS's GPT for the fused graph (quantize.fast_gpt_graph): read out of a
plain exported gpt.onnx (`extract_llama_weights`: projections, norms folded into their MatMuls,
embeddings by name, checked complete) or from a checkpoint's safetensors (`weights_from_safetensors`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from safetensors.numpy import load_file

from chattts_forge.errors import BadInput, ForgeError

_PROJ_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _initializer_arrays(model: onnx.ModelProto, base_dir: Path | None) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        out[init.name] = numpy_helper.to_array(init, base_dir=str(base_dir) if base_dir else "")
    # Constant nodes can carry weights too (some exporters fold them that way).
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            out[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return out


def _load_graph(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ForgeError(f"{path}: no such GPT graph")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - any parse failure is a broken file for the user
        raise BadInput(f"{path}: not a readable ONNX model ({e})") from None


class _GraphConstants:
    """The constant tensors of a graph, followed through Identity / Cast / Transpose nodes
    (exporters sometimes keep W and transpose it)."""

    def __init__(self, model: onnx.ModelProto, base_dir: Path) -> None:
        self.arrays = _initializer_arrays(model, base_dir)
        self.producers = {o: n for n in model.graph.node for o in n.output}

    def of(self, tensor: str) -> np.ndarray | None:
        if tensor in self.arrays:
            return self.arrays[tensor]
        node = self.producers.get(tensor)
        if node is None:
            return None
        if node.op_type in ("Identity", "Cast") and node.input:
            return self.of(node.input[0])
        if node.op_type == "Transpose":
            inner = self.of(node.input[0])
            if inner is None:
                return None
            perm = [a.ints for a in node.attribute if a.name == "perm"]
            return np.transpose(inner, perm[0] if perm else None)
        return None


def _projection_weights(model: onnx.ModelProto, consts: _GraphConstants, weights: dict[str, np.ndarray]) -> None:
    """Projections by the module scope torch.onnx.export writes into node names, as [out, in]."""
    scope = re.compile(r"layers\.(\d+)[/.](self_attn|mlp)[/.](\w+_proj)[/.]")
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        m = scope.search(node.name + "/") or scope.search(node.output[0] + "/")
        if not m:
            continue
        layer, block, proj = m.groups()
        w = consts.of(node.input[1])
        if w is None:
            continue
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i == 1 for a in node.attribute):
            w = w.T
        weights[f"layers.{layer}.{block}.{proj}.weight"] = np.ascontiguousarray(w.T, dtype=np.float32)


def _named_weights(consts: _GraphConstants, weights: dict[str, np.ndarray]) -> None:
    """Parameter names kept verbatim (dynamo exporter, or norms in TorchScript exports), with any
    module prefix ("llama.", "model.", ...)."""
    param = re.compile(r"(?:^|\.)(layers\.\d+\.(?:self_attn|mlp|input_layernorm|post_attention_layernorm)(?:\.\w+)?\.weight|norm\.weight)$")
    for name, arr in consts.arrays.items():
        m = param.search(name)
        if m and m.group(1) not in weights and arr.ndim in (1, 2):
            weights[m.group(1)] = arr.astype(np.float32)  # nn.Linear layout [out, in]


def _folded_norm_weights(model: onnx.ModelProto, consts: _GraphConstants, weights: dict[str, np.ndarray]) -> None:
    """RMSNorm weights that were folded into Mul nodes without their parameter name."""
    norm_scope = re.compile(r"/(?:layers\.(\d+)/(input_layernorm|post_attention_layernorm)|(norm))/Mul")
    for node in model.graph.node:
        if node.op_type != "Mul":
            continue
        m = norm_scope.search(node.name)
        if not m:
            continue
        key = f"layers.{m.group(1)}.{m.group(2)}.weight" if m.group(1) else "norm.weight"
        if key in weights:
            continue
        for inp in node.input:
            c = consts.of(inp)
            if c is not None and c.ndim == 1 and c.size > 1:
                weights[key] = c.astype(np.float32)


def _check_complete(path: Path, weights: dict[str, np.ndarray]) -> int:
    """The number of layers, once every Llama weight of every layer was found (else a ForgeError)."""
    layer_ids = sorted({int(k.split(".")[1]) for k in weights if k.startswith("layers.")})
    if not layer_ids:
        raise ForgeError(f"{path}: found no Llama layer weights (is this a plain FP32 gpt.onnx?)")
    num_layers = layer_ids[-1] + 1
    missing = [
        f"layers.{i}.{blk}.{p}.weight"
        for i in range(num_layers)
        for blk, projs in (("self_attn", _PROJ_NAMES[:4]), ("mlp", _PROJ_NAMES[4:]))
        for p in projs
        if f"layers.{i}.{blk}.{p}.weight" not in weights
    ] + [
        f"layers.{i}.{n}.weight"
        for i in range(num_layers)
        for n in ("input_layernorm", "post_attention_layernorm")
        if f"layers.{i}.{n}.weight" not in weights
    ]
    if "norm.weight" not in weights:
        missing.append("norm.weight")
    if missing:
        raise BadInput(
            f"{path}: cannot find {len(missing)} Llama weight(s) in the graph (first: {missing[0]}); "
            "only plain FP32 exports can be optimised - optimise the FP32 artifact and quantize with --quantize"
        )
    return num_layers


def extract_llama_weights(gpt_path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The Llama parameters of a plain FP32 `gpt.onnx`, in transformers' state-dict naming.

    Projections are found by the module scope torch.onnx.export writes into node names
    (`/layers.3/self_attn/q_proj/MatMul`), or directly by initializer name when the exporter kept
    parameter names; RMSNorm weights by their parameter names (`layers.3.input_layernorm.weight`,
    `norm.weight`) or the `Mul` nodes of their scope. Returns (weights, hyper-parameters read from
    the graph metadata and shapes). Weights of `nn.Linear` are returned as [out, in].
    """
    path = Path(gpt_path)
    model = _load_graph(path)
    consts = _GraphConstants(model, path.parent)
    weights: dict[str, np.ndarray] = {}
    _projection_weights(model, consts, weights)
    _named_weights(consts, weights)
    _folded_norm_weights(model, consts, weights)
    num_layers = _check_complete(path, weights)
    meta = {p.key: p.value for p in model.metadata_props}
    hidden = weights["layers.0.self_attn.q_proj.weight"].shape[1]
    kv_dim = weights["layers.0.self_attn.k_proj.weight"].shape[0]
    heads = int(meta.get("num_attention_heads", 0)) or _heads_from_graph(model, hidden)
    hp = {
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_dim // (hidden // heads),
        "intermediate_size": weights["layers.0.mlp.gate_proj.weight"].shape[0],
    }
    return weights, hp


def _heads_from_graph(model: onnx.ModelProto, hidden: int) -> int:
    # The past key input is [B, kv_heads, P, head_dim]: head_dim gives the head count.
    for inp in model.graph.input:
        if inp.name.endswith(".key"):
            dims = inp.type.tensor_type.shape.dim
            if len(dims) == 4 and dims[3].dim_value:
                return hidden // dims[3].dim_value
    raise ForgeError("cannot tell the number of attention heads from the GPT graph")


def weights_from_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Llama weights from a checkpoint's `gpt/model.safetensors` (prefix-free transformers names)."""
    raw = load_file(str(path))
    return {k.removeprefix("model.").removeprefix("gpt."): v.astype(np.float32) for k, v in raw.items()}
