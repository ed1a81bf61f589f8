"""The fused GPT step graph (`gpt_fast.onnx`) with an in-place KV cache: built from a plain gpt.onnx.

The plain `gpt.onnx` (see docs/artifact-format.md) takes the past keys/values as inputs and returns
them grown by the new positions (`Concat`), so every decode step copies the whole cache: at batch 8
and context 400 that is ~400 MB of memory traffic per step, more than the weights themselves.
`optimize_gpt` rebuilds the same network as a graph of onnxruntime's fused contrib operators, in
the layout onnxruntime-genai's model builder uses for Llama:

- the standard `RMSNormalization` (ONNX opset 23) for the first norm, then
  `com.microsoft.SkipSimplifiedLayerNormalization` (RMSNorm + residual add),
- one packed QKV `MatMul` and one packed gate/up `MatMul` per layer (fewer, wider GEMVs),
- `com.microsoft.GroupQueryAttention` with rotary embedding inside (explicit `position_ids`),
  an additive `attention_bias` for ChatTTS's left-padding mask, and past/present key/value
  buffers of a fixed capacity that the caller binds to the *same* memory (past-present buffer
  sharing): new keys/values are written in place, nothing is copied,
- optionally the projections quantized by a `GraphQuantizer` the caller gives (the quantize stage's
  dynamic INT8 `MatMulInteger` or INT4 `MatMulNBits`: `chattts_forge.quantize.fast_gpt`).

The fast graph (`gpt_fast.onnx`) is numerically the plain graph (max |diff| ~1e-6 in FP32); it
is driven by `chattts_forge.runtime.fast_gpt.FastGptStep`, which keeps the plain graph's call
contract (inputs_embeds, attention_mask, position_ids).

Why here: this module is torch-free (numpy + onnx) and its parity check runs the runtime's own
driver, so it sits in the runtime layer, where both `convert` (FP32 graph) and `quantize`
(quantized graphs) may import it; see docs/architecture.md.

Library use::

    from chattts_forge.runtime.fast_gpt_graph import optimize_artifact, optimize_gpt
    info = optimize_gpt("artifacts/fp32")                 # writes artifacts/fp32/gpt_fast.onnx
    optimize_artifact("artifacts/fp32")                   # ... and records it in artifact.json
    # quantized fast graphs: chattts_forge.quantize.fast_gpt.optimize_gpt(..., quantize="int4")

`info` is the dict to record under `artifact.json` -> `components.gpt_fast`.

Fast-graph interface (B batch, S new positions, T = past + S total positions, C cache capacity):
inputs `inputs_embeds` f32 [B,S,hidden], `position_ids` int64 [B,S], `attention_bias` f32
[B,1,S,T] (0 or -inf-like for masked keys), `seqlens_k` int32 [B] (= T - 1), `total_sequence_length`
int32 [] (= T), `past_key_values.{i}.key|value` f32 [B,kv_heads,C,head_dim]; outputs
`last_hidden_state` f32 [B,S,hidden], `present.{i}.key|value` (the same buffers as the past ones).
With `kv_cache="int8"` the past/present buffers are int8 (per-channel scales are constants of the
graph, calibrated by `chattts_forge.quantize.kv_cache`) and the record carries a `kv_cache` block.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from chattts_forge import __version__
from chattts_forge.artifact import FAST_GPT, FAST_GPT_FILE, ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import portable_path, sha256_file
from chattts_forge.log import get_logger

log = get_logger(__name__)

# Recorded in every gpt_fast.onnx and artifact.json: the label keeps the module's former name so that
# published artifacts stay byte-identical across the move (it names the converter, not an import path).
FAST_GPT_CONVERTER = "chattts_forge.convert.optimize (onnx.helper, com.microsoft fused ops)"
MS_DOMAIN = "com.microsoft"
# Opset 23 brings the standard RMSNormalization; onnxruntime's own SimplifiedLayerNormalization sits in
# the standard domain without a standard schema, so onnx.checker rejects a graph that uses it.
FAST_GPT_OPSET = 23
# Additive bias for masked keys: finite so that a fully masked (padding) query row stays finite
# instead of NaN, exactly like transformers' finfo(float32).min mask.
MASK_BIAS = float(np.finfo(np.float32).min)

# KV cache element types of the fast graph: fp32, or int8 with calibrated per-channel scales
# (onnxruntime's CPU GroupQueryAttention quantizes on write and dequantizes on read).
KV_CACHE_TYPES = ("fp32", "int8")

_PROJ_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# --------------------------------------------------------------------------------------------
# Weights: read the Llama parameters out of a plain exported gpt.onnx
# --------------------------------------------------------------------------------------------


def _initializer_arrays(model: onnx.ModelProto, base_dir: Path | None) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        out[init.name] = numpy_helper.to_array(init, base_dir=str(base_dir) if base_dir else "")
    # Constant nodes can carry weights too (some exporters fold them that way).
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            out[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return out


def extract_llama_weights(gpt_path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The Llama parameters of a plain FP32 `gpt.onnx`, in transformers' state-dict naming.

    Projections are found by the module scope torch.onnx.export writes into node names
    (`/layers.3/self_attn/q_proj/MatMul`), or directly by initializer name when the exporter kept
    parameter names; RMSNorm weights by their parameter names (`layers.3.input_layernorm.weight`,
    `norm.weight`) or the `Mul` nodes of their scope. Returns (weights, hyper-parameters read from
    the graph metadata and shapes). Weights of `nn.Linear` are returned as [out, in].
    """
    path = Path(gpt_path)
    if not path.is_file():
        raise ForgeError(f"{path}: no such GPT graph")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - any parse failure is a broken file for the user
        raise ForgeError(f"{path}: not a readable ONNX model ({e})") from None
    arrays = _initializer_arrays(model, path.parent)
    producers = {o: n for n in model.graph.node for o in n.output}
    weights: dict[str, np.ndarray] = {}

    def const_of(tensor: str) -> np.ndarray | None:
        # Follow Transpose / Identity / Cast of a constant (exporters sometimes keep W and transpose it).
        if tensor in arrays:
            return arrays[tensor]
        node = producers.get(tensor)
        if node is None:
            return None
        if node.op_type in ("Identity", "Cast") and node.input:
            return const_of(node.input[0])
        if node.op_type == "Transpose":
            inner = const_of(node.input[0])
            if inner is None:
                return None
            perm = [a.ints for a in node.attribute if a.name == "perm"]
            return np.transpose(inner, perm[0] if perm else None)
        return None

    scope = re.compile(r"layers\.(\d+)[/.](self_attn|mlp)[/.](\w+_proj)[/.]")
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        m = scope.search(node.name + "/") or scope.search(node.output[0] + "/")
        if not m:
            continue
        layer, block, proj = m.groups()
        w = const_of(node.input[1])
        if w is None:
            continue
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i == 1 for a in node.attribute):
            w = w.T
        weights[f"layers.{layer}.{block}.{proj}.weight"] = np.ascontiguousarray(w.T, dtype=np.float32)
    # Parameter names kept verbatim (dynamo exporter, or norms in TorchScript exports), with any
    # module prefix ("llama.", "model.", ...).
    param = re.compile(r"(?:^|\.)(layers\.\d+\.(?:self_attn|mlp|input_layernorm|post_attention_layernorm)(?:\.\w+)?\.weight|norm\.weight)$")
    for name, arr in arrays.items():
        m = param.search(name)
        if m and m.group(1) not in weights and arr.ndim in (1, 2):
            weights[m.group(1)] = arr.astype(np.float32)  # nn.Linear layout [out, in]
    # RMSNorm weights that were folded into Mul nodes without their parameter name.
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
            c = const_of(inp)
            if c is not None and c.ndim == 1 and c.size > 1:
                weights[key] = c.astype(np.float32)

    meta = {p.key: p.value for p in model.metadata_props}
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
        raise ForgeError(
            f"{path}: cannot find {len(missing)} Llama weight(s) in the graph (first: {missing[0]}); "
            "only plain FP32 exports can be optimised - optimise the FP32 artifact and quantize with --quantize"
        )
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
    from safetensors.numpy import load_file

    raw = load_file(str(path))
    return {k.removeprefix("model.").removeprefix("gpt."): v.astype(np.float32) for k, v in raw.items()}


# --------------------------------------------------------------------------------------------
# The fast graph
# --------------------------------------------------------------------------------------------


def rotary_cache(head_dim: int, max_positions: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_positions, head_dim/2], computed in float32 like transformers' Llama."""
    inv_freq = (1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))).astype(
        np.float32
    )
    freqs = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def build_fast_gpt(
    weights: Mapping[str, np.ndarray],
    *,
    num_attention_heads: int,
    num_key_value_heads: int,
    rms_norm_eps: float = 1e-6,
    rope_theta: float = 10000.0,
    max_positions: int = 4096,
    pack_projections: bool = True,
    kv_cache: str = "fp32",
    kv_scales: Mapping[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """An ONNX model of the Llama step with fused contrib ops and an in-place KV cache (see module doc).

    `kv_cache="int8"`: the past/present buffers are int8 and GroupQueryAttention quantizes each new
    key/value on write (`kv_cache_bit_width=8`, PER_CHANNEL) with the constant scales
    `kv_scales["{i}.key"|"{i}.value"]` [1, kv_heads, 1, head_dim] (see `kv_cache_scales`).
    """
    if kv_cache not in KV_CACHE_TYPES:
        raise ForgeError(f"unknown KV cache type '{kv_cache}' (choose from: {', '.join(KV_CACHE_TYPES)})")
    hidden = int(weights["layers.0.self_attn.q_proj.weight"].shape[1])
    head_dim = hidden // num_attention_heads
    num_layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("layers."))
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def w_t(key: str) -> np.ndarray:  # nn.Linear [out, in] -> MatMul B [in, out]
        return np.asarray(weights[key], dtype=np.float32).T

    cos, sin = rotary_cache(head_dim, max_positions, rope_theta)
    init("cos_cache", cos)
    init("sin_cache", sin)
    if pack_projections:
        # Explicit widths: q is num_heads wide, k and v num_kv_heads (an equal split is wrong under GQA).
        kv_width = num_key_value_heads * head_dim
        init("qkv_split_sizes", np.array([hidden, kv_width, kv_width], dtype=np.int64))

    inputs = [
        helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["batch", "seq", hidden]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, ["batch", 1, "seq", "total"]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])]
    kv_shape = ["batch", num_key_value_heads, "capacity", head_dim]
    kv_type = TensorProto.INT8 if kv_cache == "int8" else TensorProto.FLOAT
    scale_shape = (1, num_key_value_heads, 1, head_dim)
    for i in range(num_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", kv_type, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", kv_type, kv_shape))
            if kv_cache == "int8":
                scale = (kv_scales or {}).get(f"{i}.{kind}")
                if scale is None:
                    raise ForgeError(f"an int8 KV cache needs the scale of layer {i}'s {kind}s (kv_scales['{i}.{kind}'])")
                scale = np.asarray(scale, dtype=np.float32).reshape(scale_shape)
                if not (np.isfinite(scale).all() and (scale > 0).all()):
                    raise ForgeError(f"KV cache scale of layer {i}'s {kind}s must be finite and > 0")
                init(f"kv_cache.{i}.{kind}_scale", scale)

    x = "inputs_embeds"
    residual_in: str | None = None  # the pending residual branch to add before the next norm
    normed = ""
    for i in range(num_layers):
        p = f"/layers.{i}"
        ln_w = init(f"layers.{i}.input_layernorm.weight", np.asarray(weights[f"layers.{i}.input_layernorm.weight"], np.float32))
        if residual_in is None:
            normed = f"{p}/input_layernorm/output_0"
            nodes.append(
                helper.make_node("RMSNormalization", [x, ln_w], [normed], name=f"{p}/input_layernorm/RMSNormalization", epsilon=rms_norm_eps, axis=-1, stash_type=1)
            )
            resid = x
        else:
            normed = f"{p}/input_layernorm/output_0"
            resid = f"{p}/input_layernorm/residual_0"
            nodes.append(
                helper.make_node("SkipSimplifiedLayerNormalization", [residual_in, x, ln_w], [normed, "", "", resid], name=f"{p}/input_layernorm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN, epsilon=rms_norm_eps)
            )
        # attention
        attn_in: list[str]
        qkv_keys = [f"layers.{i}.self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj")]
        if pack_projections:
            qkv_w = init(f"layers.{i}.self_attn.qkv_proj.weight_t", np.concatenate([w_t(k) for k in qkv_keys], axis=1))
            qkv = f"{p}/self_attn/qkv_proj/MatMul_output_0"
            nodes.append(helper.make_node("MatMul", [normed, qkv_w], [qkv], name=f"{p}/self_attn/qkv_proj/MatMul"))
            attn_in = [f"{p}/self_attn/{n}_output_0" for n in ("q", "k", "v")]
            nodes.append(helper.make_node("Split", [qkv, "qkv_split_sizes"], attn_in, name=f"{p}/self_attn/qkv_proj/Split", axis=-1))
        else:
            attn_in = []
            for k, n in zip(qkv_keys, ("q_proj", "k_proj", "v_proj"), strict=True):
                wname = init(f"layers.{i}.self_attn.{n}.weight_t", w_t(k))
                out = f"{p}/self_attn/{n}/MatMul_output_0"
                nodes.append(helper.make_node("MatMul", [normed, wname], [out], name=f"{p}/self_attn/{n}/MatMul"))
                attn_in.append(out)
        # Rotary outside the attention op: GroupQueryAttention derives decode positions from
        # seqlens_k, which is wrong for ChatTTS's left-padded rows (position = cumsum(mask) - 1).
        for j, n in ((0, "q"), (1, "k")):
            rot = f"{p}/self_attn/rotary_{n}/output_0"
            nodes.append(
                helper.make_node("RotaryEmbedding", [attn_in[j], "position_ids", "cos_cache", "sin_cache"], [rot], name=f"{p}/self_attn/rotary_{n}/RotaryEmbedding", domain=MS_DOMAIN, num_heads=num_attention_heads if n == "q" else num_key_value_heads, interleaved=0)
            )
            attn_in[j] = rot
        attn_out = f"{p}/self_attn/GroupQueryAttention_output_0"
        gqa_inputs = [*attn_in, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k", "total_sequence_length", "", "", "", "attention_bias"]
        quant_attrs: dict[str, Any] = {}
        if kv_cache == "int8":
            # inputs 11 (head_sink) unused, 12/13 the per-channel cache scales
            gqa_inputs += ["", f"kv_cache.{i}.key_scale", f"kv_cache.{i}.value_scale"]
            quant_attrs = {"kv_cache_bit_width": 8, "k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL"}
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                gqa_inputs,
                [attn_out, f"present.{i}.key", f"present.{i}.value"],
                name=f"{p}/self_attn/GroupQueryAttention",
                domain=MS_DOMAIN,
                num_heads=num_attention_heads,
                kv_num_heads=num_key_value_heads,
                do_rotary=0,
                scale=float(1.0 / np.sqrt(head_dim)),
                **quant_attrs,
            )
        )
        o_w = init(f"layers.{i}.self_attn.o_proj.weight_t", w_t(f"layers.{i}.self_attn.o_proj.weight"))
        o_out = f"{p}/self_attn/o_proj/MatMul_output_0"
        nodes.append(helper.make_node("MatMul", [attn_out, o_w], [o_out], name=f"{p}/self_attn/o_proj/MatMul"))
        # post-attention norm (+ residual)
        pa_w = init(f"layers.{i}.post_attention_layernorm.weight", np.asarray(weights[f"layers.{i}.post_attention_layernorm.weight"], np.float32))
        mlp_in = f"{p}/post_attention_layernorm/output_0"
        resid2 = f"{p}/post_attention_layernorm/residual_0"
        nodes.append(
            helper.make_node("SkipSimplifiedLayerNormalization", [o_out, resid, pa_w], [mlp_in, "", "", resid2], name=f"{p}/post_attention_layernorm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN, epsilon=rms_norm_eps)
        )
        # MLP: down(silu(gate(x)) * up(x))
        if pack_projections:
            gu_w = init(
                f"layers.{i}.mlp.gate_up_proj.weight_t",
                np.concatenate([w_t(f"layers.{i}.mlp.gate_proj.weight"), w_t(f"layers.{i}.mlp.up_proj.weight")], axis=1),
            )
            gu = f"{p}/mlp/gate_up_proj/MatMul_output_0"
            nodes.append(helper.make_node("MatMul", [mlp_in, gu_w], [gu], name=f"{p}/mlp/gate_up_proj/MatMul"))
            gate, up = f"{p}/mlp/gate_output_0", f"{p}/mlp/up_output_0"
            nodes.append(helper.make_node("Split", [gu], [gate, up], name=f"{p}/mlp/Split", axis=-1, num_outputs=2))
        else:
            gate, up = f"{p}/mlp/gate_proj/MatMul_output_0", f"{p}/mlp/up_proj/MatMul_output_0"
            for n, out in (("gate_proj", gate), ("up_proj", up)):
                wname = init(f"layers.{i}.mlp.{n}.weight_t", w_t(f"layers.{i}.mlp.{n}.weight"))
                nodes.append(helper.make_node("MatMul", [mlp_in, wname], [out], name=f"{p}/mlp/{n}/MatMul"))
        sig = f"{p}/mlp/act_fn/Sigmoid_output_0"
        silu = f"{p}/mlp/act_fn/Mul_output_0"
        prod = f"{p}/mlp/Mul_output_0"
        nodes.append(helper.make_node("Sigmoid", [gate], [sig], name=f"{p}/mlp/act_fn/Sigmoid"))
        nodes.append(helper.make_node("Mul", [gate, sig], [silu], name=f"{p}/mlp/act_fn/Mul"))
        nodes.append(helper.make_node("Mul", [silu, up], [prod], name=f"{p}/mlp/Mul"))
        d_w = init(f"layers.{i}.mlp.down_proj.weight_t", w_t(f"layers.{i}.mlp.down_proj.weight"))
        down = f"{p}/mlp/down_proj/MatMul_output_0"
        nodes.append(helper.make_node("MatMul", [prod, d_w], [down], name=f"{p}/mlp/down_proj/MatMul"))
        x, residual_in = down, resid2
    norm_w = init("norm.weight", np.asarray(weights["norm.weight"], np.float32))
    nodes.append(
        helper.make_node("SkipSimplifiedLayerNormalization", [x, residual_in, norm_w], ["last_hidden_state", "", "", ""], name="/norm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN, epsilon=rms_norm_eps)
    )
    # Every intermediate is float32: declare it, so tools whose shape inference does not know the
    # contrib ops (onnxruntime's quantizers) still know the element types.
    declared = {v.name for v in inputs + outputs}
    value_info = [
        helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
        for n in nodes
        for t in n.output
        if t and t not in declared
    ]
    graph = helper.make_graph(nodes, "chattts_gpt_fast", inputs, outputs, inits, value_info=value_info)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", FAST_GPT_OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
        producer_name="chattts-forge",
    )
    model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", FAST_GPT_OPSET)])
    return model


# --------------------------------------------------------------------------------------------
# Quantized variants of the fast graph (the quantizer comes from the quantize stage)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphQuantizer:
    """How to quantize the projection MatMuls of a fast graph (the attention is GroupQueryAttention).

    The runtime layer has no quantizers: `chattts_forge.quantize.fast_gpt.fast_gpt_quantizer` makes
    these with the quantize stage's own onnxruntime quantizers.
    """

    method: str  # recorded as quantization.method: "dynamic" | "int4"
    precision: str  # the graph's precision label: "int8-dynamic" | "int4"
    pack_projections: bool  # packing shares one scale across q/k/v (gate/up): wrong for per-tensor INT8
    quantize: Callable[[Path, Path], dict[str, Any]]  # (fp32 graph, quantized graph) -> options record


# --------------------------------------------------------------------------------------------
# Parity: the fast graph against the plain graph, on left-padded prefill + decode steps
# --------------------------------------------------------------------------------------------


def _session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def compare_with_plain(
    plain_gpt: str | os.PathLike[str],
    fast_gpt: str | os.PathLike[str],
    hp: Mapping[str, int],
    *,
    batch: int = 3,
    prompt: int = 9,
    decode_steps: int = 6,
    seed: int = 0,
    threads: int = 1,
) -> dict[str, Any]:
    """Max |difference| of the hidden states of every valid position, plain vs fast graph.

    Rows are left-padded by different amounts (ChatTTS batching), then `decode_steps` single steps.
    """
    from chattts_forge.runtime.fast_gpt import FastGptStep

    plain = _session(Path(plain_gpt), threads)
    fast = FastGptStep(
        _session(Path(fast_gpt), threads), hp["num_hidden_layers"], hp["num_key_value_heads"],
        hp["hidden_size"] // hp["num_attention_heads"], hp["hidden_size"], capacity=prompt + 2,
    )
    rng = np.random.default_rng(seed)
    hidden, layers = hp["hidden_size"], hp["num_hidden_layers"]
    kv, hd = hp["num_key_value_heads"], hidden // hp["num_attention_heads"]
    mask = np.ones((batch, prompt), dtype=np.int64)
    for b in range(batch):
        mask[b, : min(b * 2, prompt - 1)] = 0
    past = [np.zeros((batch, kv, 0, hd), np.float32) for _ in range(2 * layers)]
    past_names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    fast.reset(batch)
    worst, worst_rel = 0.0, 0.0
    emb = rng.standard_normal((batch, prompt, hidden), dtype=np.float32)
    for step in range(decode_steps + 1):
        if step:
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
            emb = rng.standard_normal((batch, 1, hidden), dtype=np.float32)
        pos = np.cumsum(mask, axis=1) - 1
        pos[mask == 0] = 1
        pos = pos[:, -emb.shape[1]:]
        feeds = {"inputs_embeds": emb, "attention_mask": mask, "position_ids": pos, **dict(zip(past_names, past, strict=True))}
        outs = plain.run(None, feeds)
        ref, past = outs[0], outs[1:]
        got = fast(emb, mask, pos)
        valid = mask[:, -emb.shape[1]:].astype(bool)
        diff = np.abs(got - ref)[valid]
        worst = max(worst, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / (np.abs(ref[valid]) + 1e-3)).max()))
    return {
        "reference": "plain gpt.onnx (onnxruntime)",
        "max_abs": worst,
        "max_rel": worst_rel,
        "cases": f"batch {batch} left-padded, prompt {prompt}, {decode_steps} decode steps, seed {seed}",
    }


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _io_record(model_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    m = onnx.load(str(model_path), load_external_data=False)
    names = {TensorProto.FLOAT: "float32", TensorProto.INT64: "int64", TensorProto.INT32: "int32"}

    def rec(v: onnx.ValueInfoProto) -> dict[str, Any]:
        t = v.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "shape": shape, "dtype": names.get(t.elem_type, str(t.elem_type))}

    return [rec(v) for v in m.graph.input], [rec(v) for v in m.graph.output]


def optimize_gpt(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    quantizer: GraphQuantizer | None = None,
    weights_from: str | os.PathLike[str] | None = None,
    pack_projections: bool | None = None,
    check_parity: bool = True,
    tolerance: float = 1e-4,
    threads: int = 1,
    kv_cache: str = "fp32",
    kv_scales: Mapping[str, np.ndarray] | None = None,
    kv_record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the fast GPT graph of an artifact (or of a plain `gpt.onnx`) and write it to `out`.

    `source`: an FP32 artifact folder or its `gpt.onnx`. `weights_from`: where the FP32 weights
    come from when `source` is a quantized artifact (its FP32 source artifact folder, a plain FP32
    gpt.onnx, or a checkpoint's `gpt/model.safetensors`). `quantizer`: None (FP32) or how to
    quantize the projections (`GraphQuantizer`). `out` defaults to `<artifact>/gpt_fast.onnx`.
    Projections are packed (QKV, gate/up) unless the quantizer says not to. FP32 graphs whose
    hidden states differ from the plain graph's by more than `tolerance` raise ForgeError (nothing
    is written); quantized ones record their difference. `kv_cache="int8"` stores the KV
    cache in int8 with `kv_scales` (from `quantize.kv_cache.kv_cache_scales`; `kv_record` says where
    they came from and is recorded under `kv_cache`). Returns the `components.gpt_fast` record.
    """
    if kv_cache not in KV_CACHE_TYPES:
        raise ForgeError(f"unknown KV cache type '{kv_cache}' (choose from: {', '.join(KV_CACHE_TYPES)})")
    src = Path(source).expanduser()
    gpt_path = src / "gpt.onnx" if src.is_dir() else src
    dims = (ArtifactMeta.load(src).dims or {}) if src.is_dir() else {}
    if out is None:
        if not src.is_dir():
            raise ForgeError("give `out` when the source is a gpt.onnx file")
        out = src / FAST_GPT_FILE
    out = Path(out).expanduser()
    method = quantizer.method if quantizer is not None else None
    precision = quantizer.precision if quantizer is not None else "fp32"

    # weights
    w_src = Path(weights_from).expanduser() if weights_from is not None else gpt_path
    if w_src.is_dir():
        w_src = w_src / "gpt.onnx"
    if w_src.suffix == ".safetensors":
        weights = weights_from_safetensors(w_src)
        if not dims:
            raise ForgeError("weights from safetensors need an artifact folder as source (for its dims)")
        hp = {k: int(dims[k]) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")}
    else:
        weights, hp = extract_llama_weights(w_src)
        if dims:
            hp["num_attention_heads"] = int(dims["num_attention_heads"])
            hp["num_key_value_heads"] = int(dims["num_key_value_heads"])
    eps = float(dims.get("rms_norm_eps", 1e-6))
    theta = float(dims.get("rope_theta", 10000.0))
    max_pos = int(dims.get("max_position_embeddings", 4096))
    pack = pack_projections if pack_projections is not None else (quantizer.pack_projections if quantizer else True)

    log.info("building the fast GPT graph (%d layers, hidden %d, packed=%s, quantize=%s)", hp["num_hidden_layers"], hp["hidden_size"], pack, method)
    model = build_fast_gpt(
        weights,
        num_attention_heads=hp["num_attention_heads"],
        num_key_value_heads=hp["num_key_value_heads"],
        rms_norm_eps=eps,
        rope_theta=theta,
        max_positions=max_pos,
        pack_projections=pack,
        kv_cache=kv_cache,
        kv_scales=kv_scales,
    )
    model.metadata_props.extend(
        [
            onnx.StringStringEntryProto(key="component", value=FAST_GPT),
            onnx.StringStringEntryProto(key="precision", value=precision),
            onnx.StringStringEntryProto(key="hidden_size", value=str(hp["hidden_size"])),
            onnx.StringStringEntryProto(key="num_hidden_layers", value=str(hp["num_hidden_layers"])),
            onnx.StringStringEntryProto(key="converter", value=FAST_GPT_CONVERTER),
            onnx.StringStringEntryProto(key="chattts_forge_version", value=__version__),
        ]
    )
    if kv_cache != "fp32":  # only then: FP32-cache graphs keep their bytes
        model.metadata_props.append(onnx.StringStringEntryProto(key="kv_cache", value=kv_cache))
    # The artifact-wide facts every component carries (see docs/artifact-format.md), when known.
    for key in ("sample_rate", "hop_length", "num_vq", "n_mels", "num_audio_tokens", "num_text_tokens"):
        if key in dims:
            model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=str(dims[key])))
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gpt_fast.", dir=out.parent) as tmp:
        tmp_dir = Path(tmp)
        fp32_path = tmp_dir / "fp32.onnx"
        onnx.save(model, str(fp32_path))
        del model
        quant_info: dict[str, Any] | None = None
        final_tmp = fp32_path
        if quantizer is not None:
            final_tmp = tmp_dir / "quant.onnx"
            quant_info = {"method": quantizer.method, **quantizer.quantize(fp32_path, final_tmp)}
        parity = None
        if check_parity:
            parity = compare_with_plain(w_src if w_src.suffix == ".onnx" else gpt_path, final_tmp, hp, threads=threads)
            exact = quantizer is None and kv_cache == "fp32"  # anything quantized records its difference
            parity["tolerance_abs"] = tolerance if exact else None
            if exact and parity["max_abs"] > tolerance:
                raise ForgeError(
                    f"fast GPT graph differs from the plain graph by {parity['max_abs']:.3g} > {tolerance:g}; nothing written"
                )
            log.info("fast GPT parity vs plain graph: max abs %.3g", parity["max_abs"])
        os.replace(final_tmp, out)
    inputs, outputs = _io_record(out)
    record: dict[str, Any] = {
        "file": out.name,
        "precision": precision,
        "opset": FAST_GPT_OPSET,
        "converter": FAST_GPT_CONVERTER,
        "inputs": inputs,
        "outputs": outputs,
        "sha256": sha256_file(out),
        "bytes": out.stat().st_size,
        "optimization": {
            "attention": "com.microsoft.GroupQueryAttention, past/present buffer shared (IO binding), attention_bias mask",
            "rotary": "com.microsoft.RotaryEmbedding with explicit position_ids",
            "norms": "RMSNormalization (opset 23) / com.microsoft.SkipSimplifiedLayerNormalization",
            "packed_projections": pack,
            # Relative to the artifact folder, so the record holds no temp or checkout path.
            "weights_from": portable_path(w_src, out.parent),
            "driver": "chattts_forge.runtime.fast_gpt.FastGptStep",
        },
        "quantization": quant_info,
        "parity": parity,
    }
    if kv_cache != "fp32":  # absent: a float32 cache (earlier records keep their bytes)
        record["kv_cache"] = {**(kv_record or {}), "dtype": kv_cache}
    log.info("wrote %s (%.1f MB)", out, record["bytes"] / 1e6)
    return record


def optimize_artifact(
    artifact_dir: str | os.PathLike[str],
    *,
    weights_from: str | os.PathLike[str] | None = None,
    quantizer: GraphQuantizer | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Add `gpt_fast.onnx` to an artifact folder and record it in its artifact.json.

    FP32 fast graph unless a `quantizer` is given (quantized artifacts: see
    `chattts_forge.quantize.fast_gpt.optimize_artifact`, which picks it from the variant).
    `kwargs` go to `optimize_gpt`. Returns the component record.
    """
    folder = Path(artifact_dir).expanduser()
    meta = ArtifactMeta.load(folder)
    record = optimize_gpt(folder, folder / FAST_GPT_FILE, quantizer=quantizer, weights_from=weights_from, **kwargs)
    meta.components[FAST_GPT] = record
    from chattts_forge.graph_storage import store_components_externally

    store_components_externally(folder, meta, [FAST_GPT])  # memory-mapped by the runtime
    meta.write(folder)
    return meta.components[FAST_GPT]
