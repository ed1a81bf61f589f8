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

Why here: graph building is the quantize stage's (the runtime loads and runs graphs, it builds
none). This module is torch-free (numpy + onnx) and its parity check runs the runtime's own driver;
`convert` imports it for the FP32 graph (convert may import quantize, never the reverse), quantize's
`fast_gpt.py`, `fused.py` and method classes for the quantized ones; see docs/architecture.md.

Library use::

    from chattts_forge.quantize.fast_gpt_graph import optimize_artifact, optimize_gpt
    info = optimize_gpt("artifacts/fp32")                 # writes artifacts/fp32/gpt_fast.onnx
    optimize_artifact("artifacts/fp32")                   # ... and records it in artifact.json
    # quantized fast graphs: chattts_forge.quantize.fast_gpt.optimize_gpt(..., quantize="int4")

`info` is the dict to record under `artifact.json` -> `components.gpt_fast`.

The weights come from quantize.gpt_weights (a plain gpt.onnx or a checkpoint's safetensors).

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
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import portable_path
from chattts_forge.graph_storage import write_component
from chattts_forge.log import get_logger
from chattts_forge.quantize.fast_gpt_parity import LeftPaddedSteps, ParityCases, fused_parity
from chattts_forge.quantize.gpt_weights import extract_llama_weights, weights_from_safetensors

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


@dataclass(frozen=True)
class FusedGraphShape:
    """How the fused graph is laid out: the attention heads, the norms' epsilon, the rotary base
    and table length, packed projections or not, and the KV cache's element type.

    `kv_cache="int8"`: the past/present buffers are int8 and GroupQueryAttention quantizes each new
    key/value on write (`kv_cache_bit_width=8`, PER_CHANNEL) with the constant scales
    `kv_scales["{i}.key"|"{i}.value"]` [1, kv_heads, 1, head_dim] (see `kv_cache_scales`).
    """

    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 4096
    pack_projections: bool = True
    kv_cache: str = "fp32"
    kv_scales: Mapping[str, np.ndarray] | None = None


def check_kv_cache(kv_cache: str) -> None:
    if kv_cache not in KV_CACHE_TYPES:
        raise BadInput(f"unknown KV cache type '{kv_cache}' (choose from: {', '.join(KV_CACHE_TYPES)})")


class _FusedGraphBuilder:
    """Appends the fused graph's nodes and initializers in graph order (the order is part of the
    bytes: keep it)."""

    def __init__(self, weights: Mapping[str, np.ndarray], shape: FusedGraphShape) -> None:
        self.weights, self.shape = weights, shape
        self.hidden = int(weights["layers.0.self_attn.q_proj.weight"].shape[1])
        self.head_dim = self.hidden // shape.num_attention_heads
        self.num_layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("layers."))
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def w_t(self, key: str) -> np.ndarray:  # nn.Linear [out, in] -> MatMul B [in, out]
        return np.asarray(self.weights[key], dtype=np.float32).T

    def norm_weight(self, key: str) -> str:
        return self.init(key, np.asarray(self.weights[key], np.float32))

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.nodes.append(helper.make_node(*args, **kwargs))

    def interface(self) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
        """The rotary tables, the QKV split widths, the graph inputs/outputs and the int8 cache scales."""
        shape, hidden, head_dim = self.shape, self.hidden, self.head_dim
        cos, sin = rotary_cache(head_dim, shape.max_positions, shape.rope_theta)
        self.init("cos_cache", cos)
        self.init("sin_cache", sin)
        if shape.pack_projections:
            # Explicit widths: q is num_heads wide, k and v num_kv_heads (an equal split is wrong under GQA).
            kv_width = shape.num_key_value_heads * head_dim
            self.init("qkv_split_sizes", np.array([hidden, kv_width, kv_width], dtype=np.int64))
        inputs = [
            helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["batch", "seq", hidden]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, ["batch", 1, "seq", "total"]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        ]
        outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])]
        kv_shape = ["batch", shape.num_key_value_heads, "capacity", head_dim]
        kv_type = TensorProto.INT8 if shape.kv_cache == "int8" else TensorProto.FLOAT
        for i in range(self.num_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", kv_type, kv_shape))
                outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", kv_type, kv_shape))
                if shape.kv_cache == "int8":
                    self.kv_scale(i, kind)
        return inputs, outputs

    def kv_scale(self, i: int, kind: str) -> None:
        scale = (self.shape.kv_scales or {}).get(f"{i}.{kind}")
        if scale is None:
            raise BadInput(f"an int8 KV cache needs the scale of layer {i}'s {kind}s (kv_scales['{i}.{kind}'])")
        scale = np.asarray(scale, dtype=np.float32).reshape((1, self.shape.num_key_value_heads, 1, self.head_dim))
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise BadInput(f"KV cache scale of layer {i}'s {kind}s must be finite and > 0")
        self.init(f"kv_cache.{i}.{kind}_scale", scale)

    def input_norm(self, i: int, x: str, residual_in: str | None) -> tuple[str, str]:
        """Layer i's input RMSNorm (+ the pending residual add): (normed, residual)."""
        p, eps = f"/layers.{i}", self.shape.rms_norm_eps
        ln_w = self.norm_weight(f"layers.{i}.input_layernorm.weight")
        normed = f"{p}/input_layernorm/output_0"
        if residual_in is None:
            self.add("RMSNormalization", [x, ln_w], [normed], name=f"{p}/input_layernorm/RMSNormalization",
                     epsilon=eps, axis=-1, stash_type=1)
            return normed, x
        resid = f"{p}/input_layernorm/residual_0"
        self.add("SkipSimplifiedLayerNormalization", [residual_in, x, ln_w], [normed, "", "", resid],
                 name=f"{p}/input_layernorm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN, epsilon=eps)
        return normed, resid

    def projections(self, i: int, x: str, block: str, names: tuple[str, ...], packed: str, split: dict[str, Any],
                    outs: list[str]) -> list[str]:
        """Layer i's projections `names` of `x`: one packed MatMul + Split, or one MatMul each."""
        p = f"/layers.{i}"
        keys = [f"layers.{i}.{block}.{n}.weight" for n in names]
        if self.shape.pack_projections:
            w = self.init(f"layers.{i}.{block}.{packed}.weight_t", np.concatenate([self.w_t(k) for k in keys], axis=1))
            mm = f"{p}/{block}/{packed}/MatMul_output_0"
            self.add("MatMul", [x, w], [mm], name=f"{p}/{block}/{packed}/MatMul")
            self.add("Split", [mm, *split.pop("sizes", [])], outs, **split)
            return outs
        result = []
        for k, n in zip(keys, names, strict=True):
            w = self.init(f"layers.{i}.{block}.{n}.weight_t", self.w_t(k))
            out = f"{p}/{block}/{n}/MatMul_output_0"
            self.add("MatMul", [x, w], [out], name=f"{p}/{block}/{n}/MatMul")
            result.append(out)
        return result

    def attention(self, i: int, normed: str) -> str:
        """Layer i's attention: QKV, rotary, GroupQueryAttention on the in-place cache, o_proj."""
        p, shape = f"/layers.{i}", self.shape
        attn_in = self.projections(i, normed, "self_attn", ("q_proj", "k_proj", "v_proj"), "qkv_proj",
                                   {"sizes": ["qkv_split_sizes"], "name": f"{p}/self_attn/qkv_proj/Split", "axis": -1},
                                   [f"{p}/self_attn/{n}_output_0" for n in ("q", "k", "v")])
        # Rotary outside the attention op: GroupQueryAttention derives decode positions from
        # seqlens_k, which is wrong for ChatTTS's left-padded rows (position = cumsum(mask) - 1).
        for j, n in ((0, "q"), (1, "k")):
            rot = f"{p}/self_attn/rotary_{n}/output_0"
            self.add("RotaryEmbedding", [attn_in[j], "position_ids", "cos_cache", "sin_cache"], [rot],
                     name=f"{p}/self_attn/rotary_{n}/RotaryEmbedding", domain=MS_DOMAIN,
                     num_heads=shape.num_attention_heads if n == "q" else shape.num_key_value_heads, interleaved=0)
            attn_in[j] = rot
        attn_out = f"{p}/self_attn/GroupQueryAttention_output_0"
        gqa_inputs = [*attn_in, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                      "total_sequence_length", "", "", "", "attention_bias"]
        quant_attrs: dict[str, Any] = {}
        if shape.kv_cache == "int8":
            # inputs 11 (head_sink) unused, 12/13 the per-channel cache scales
            gqa_inputs += ["", f"kv_cache.{i}.key_scale", f"kv_cache.{i}.value_scale"]
            quant_attrs = {"kv_cache_bit_width": 8, "k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL"}
        self.add("GroupQueryAttention", gqa_inputs, [attn_out, f"present.{i}.key", f"present.{i}.value"],
                 name=f"{p}/self_attn/GroupQueryAttention", domain=MS_DOMAIN, num_heads=shape.num_attention_heads,
                 kv_num_heads=shape.num_key_value_heads, do_rotary=0, scale=float(1.0 / np.sqrt(self.head_dim)),
                 **quant_attrs)
        o_w = self.init(f"layers.{i}.self_attn.o_proj.weight_t", self.w_t(f"layers.{i}.self_attn.o_proj.weight"))
        o_out = f"{p}/self_attn/o_proj/MatMul_output_0"
        self.add("MatMul", [attn_out, o_w], [o_out], name=f"{p}/self_attn/o_proj/MatMul")
        return o_out

    def mlp(self, i: int, attn_out: str, resid: str) -> tuple[str, str]:
        """Layer i's post-attention norm (+ residual) and MLP down(silu(gate(x)) * up(x)): (down, residual)."""
        p = f"/layers.{i}"
        pa_w = self.norm_weight(f"layers.{i}.post_attention_layernorm.weight")
        mlp_in = f"{p}/post_attention_layernorm/output_0"
        resid2 = f"{p}/post_attention_layernorm/residual_0"
        self.add("SkipSimplifiedLayerNormalization", [attn_out, resid, pa_w], [mlp_in, "", "", resid2],
                 name=f"{p}/post_attention_layernorm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN,
                 epsilon=self.shape.rms_norm_eps)
        gate, up = self.projections(i, mlp_in, "mlp", ("gate_proj", "up_proj"), "gate_up_proj",
                                    {"name": f"{p}/mlp/Split", "axis": -1, "num_outputs": 2},
                                    [f"{p}/mlp/gate_output_0", f"{p}/mlp/up_output_0"])
        sig = f"{p}/mlp/act_fn/Sigmoid_output_0"
        silu = f"{p}/mlp/act_fn/Mul_output_0"
        prod = f"{p}/mlp/Mul_output_0"
        self.add("Sigmoid", [gate], [sig], name=f"{p}/mlp/act_fn/Sigmoid")
        self.add("Mul", [gate, sig], [silu], name=f"{p}/mlp/act_fn/Mul")
        self.add("Mul", [silu, up], [prod], name=f"{p}/mlp/Mul")
        d_w = self.init(f"layers.{i}.mlp.down_proj.weight_t", self.w_t(f"layers.{i}.mlp.down_proj.weight"))
        down = f"{p}/mlp/down_proj/MatMul_output_0"
        self.add("MatMul", [prod, d_w], [down], name=f"{p}/mlp/down_proj/MatMul")
        return down, resid2

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        # Every intermediate is float32: declare it, so tools whose shape inference does not know the
        # contrib ops (onnxruntime's quantizers) still know the element types.
        declared = {v.name for v in inputs + outputs}
        value_info = [
            helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
            for n in self.nodes
            for t in n.output
            if t and t not in declared
        ]
        graph = helper.make_graph(self.nodes, "chattts_gpt_fast", inputs, outputs, self.inits, value_info=value_info)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", FAST_GPT_OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
            producer_name="chattts-forge",
        )
        model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", FAST_GPT_OPSET)])
        return model


def build_fast_gpt(weights: Mapping[str, np.ndarray], shape: FusedGraphShape) -> onnx.ModelProto:
    """An ONNX model of the Llama step with fused contrib ops and an in-place KV cache (see module
    doc), laid out as `shape` says."""
    check_kv_cache(shape.kv_cache)
    graph = _FusedGraphBuilder(weights, shape)
    inputs, outputs = graph.interface()
    x = "inputs_embeds"
    residual_in: str | None = None  # the pending residual branch to add before the next norm
    for i in range(graph.num_layers):
        normed, resid = graph.input_norm(i, x, residual_in)
        attn_out = graph.attention(i, normed)
        x, residual_in = graph.mlp(i, attn_out, resid)
    norm_w = graph.norm_weight("norm.weight")
    graph.add("SkipSimplifiedLayerNormalization", [x, residual_in, norm_w], ["last_hidden_state", "", "", ""],
              name="/norm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN, epsilon=shape.rms_norm_eps)
    return graph.model(inputs, outputs)


# --------------------------------------------------------------------------------------------
# Quantized variants of the fast graph (the quantizer comes from the quantize stage)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphQuantizer:
    """How to quantize the projection MatMuls of a fast graph (the attention is GroupQueryAttention).

    The builder takes no quantizer of its own: the quantize stage's method classes
    (`chattts_forge.quantize.methods`, `fast_graph_quantizer`) make these with its own onnxruntime
    quantizers.
    """

    method: str  # recorded as quantization.method
    precision: str  # the graph's precision label (the method's variant)
    pack_projections: bool  # packing shares one scale across q/k/v (gate/up): wrong for per-tensor INT8
    quantize: Callable[[Path, Path], dict[str, Any]]  # (fp32 graph, quantized graph) -> options record


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FusedGraphOptions:
    """How `optimize_gpt` builds a fused graph.

    `quantizer`: None (FP32) or how to quantize the projections. `weights_from`: where the FP32
    weights come from when the source is a quantized artifact (its FP32 source artifact folder, a
    plain FP32 gpt.onnx, or a checkpoint's `gpt/model.safetensors`). `pack_projections`: None
    follows the quantizer (packed when FP32). FP32 graphs whose hidden states differ from the plain
    graph's by more than `tolerance` are refused; quantized ones record their difference.
    `kv_cache="int8"` stores the KV cache in int8 with `kv_scales` (from
    `quantize.kv_cache.kv_cache_scales`; `kv_record` says where they came from and is recorded
    under `kv_cache`). `dims`: the checkpoint dimensions (default: the source folder's artifact.json).
    """

    quantizer: GraphQuantizer | None = None
    weights_from: str | os.PathLike[str] | None = None
    pack_projections: bool | None = None
    check_parity: bool = True
    tolerance: float = 1e-4
    threads: int = 1
    kv_cache: str = "fp32"
    kv_scales: Mapping[str, np.ndarray] | None = None
    kv_record: Mapping[str, Any] | None = None
    dims: Mapping[str, Any] | None = None  # the artifact's dims, when its artifact.json is not written yet

    @property
    def method(self) -> str | None:
        return self.quantizer.method if self.quantizer is not None else None

    @property
    def precision(self) -> str:
        return self.quantizer.precision if self.quantizer is not None else "fp32"

    @property
    def packed(self) -> bool:
        if self.pack_projections is not None:
            return self.pack_projections
        return self.quantizer.pack_projections if self.quantizer is not None else True

    @property
    def exact(self) -> bool:
        """FP32 weights and cache: the fused graph must equal the plain one within `tolerance`."""
        return self.quantizer is None and self.kv_cache == "fp32"


def _io_record(model_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    m = onnx.load(str(model_path), load_external_data=False)
    names = {TensorProto.FLOAT: "float32", TensorProto.INT64: "int64", TensorProto.INT32: "int32"}

    def rec(v: onnx.ValueInfoProto) -> dict[str, Any]:
        t = v.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "shape": shape, "dtype": names.get(t.elem_type, str(t.elem_type))}

    return [rec(v) for v in m.graph.input], [rec(v) for v in m.graph.output]


_HP_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def _fp32_weights(w_src: Path, dims: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The FP32 Llama weights and hyper-parameters from a plain gpt.onnx or a safetensors file."""
    if w_src.suffix == ".safetensors":
        if not dims:
            raise ForgeError("weights from safetensors need an artifact folder as source (for its dims)")
        return weights_from_safetensors(w_src), {k: int(dims[k]) for k in _HP_KEYS}
    weights, hp = extract_llama_weights(w_src)
    if dims:
        hp["num_attention_heads"] = int(dims["num_attention_heads"])
        hp["num_key_value_heads"] = int(dims["num_key_value_heads"])
    return weights, hp


def _stamp(model: onnx.ModelProto, precision: str, hp: Mapping[str, Any], dims: Mapping[str, Any],
           kv_cache: str) -> None:
    """The fused graph's metadata_props: what it is, its precision, the artifact-wide facts."""
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


def make_fused_graph(
    fp32_graph: Path,
    dst: Path,
    quantize: Callable[[Path, Path], dict[str, Any]] | None,
    plain_gpt: Path | None,
    cases: ParityCases | None,
    *,
    threads: int | None = 1,
    restamp: Callable[[Path, Path], None] | None = None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The one last step of every `gpt_fast.onnx`, rebuilt (`optimize_gpt`) or quantized from the
    source's FP32 fused graph (`quantize.fused`): `quantize(fp32_graph, dst)` (None: `dst` is the
    FP32 graph itself), `restamp(fp32_graph, dst)` (the metadata the quantizer dropped), then the
    parity check against `plain_gpt` on `cases` (skipped when None). Returns (the quantizer's
    options record, the parity record)."""
    options = None
    if quantize is not None:
        options = quantize(fp32_graph, dst)
    if restamp is not None:
        restamp(fp32_graph, dst)
    parity = None
    if cases is not None and plain_gpt is not None:
        parity = fused_parity(plain_gpt, dst, cases, threads)
    return options, parity


def _weights_source(src: Path, gpt_path: Path, weights_from: str | os.PathLike[str] | None) -> Path:
    w_src = Path(weights_from).expanduser() if weights_from is not None else gpt_path
    return w_src / "gpt.onnx" if w_src.is_dir() else w_src


def optimize_gpt(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    options: FusedGraphOptions | None = None,
) -> dict[str, Any]:
    """Build the fast GPT graph of an artifact (or of a plain `gpt.onnx`) and write it to `out`.

    `source`: an FP32 artifact folder or its `gpt.onnx` (`options.weights_from` for a quantized
    one); `out` defaults to `<artifact>/gpt_fast.onnx`; `options`: `FusedGraphOptions`. A fused FP32
    graph that differs from the plain one beyond the tolerance raises ForgeError (nothing is
    written). Returns the `components.gpt_fast` record.
    """
    opts = options or FusedGraphOptions()
    check_kv_cache(opts.kv_cache)
    src = Path(source).expanduser()
    gpt_path = src / "gpt.onnx" if src.is_dir() else src
    if opts.dims is not None:
        dims: Mapping[str, Any] = opts.dims
    else:
        dims = (ArtifactMeta.load(src).dims or {}) if src.is_dir() else {}
    if out is None:
        if not src.is_dir():
            raise BadInput("give `out` when the source is a gpt.onnx file")
        out = src / FAST_GPT_FILE
    out = Path(out).expanduser()
    w_src = _weights_source(src, gpt_path, opts.weights_from)
    weights, hp = _fp32_weights(w_src, dims)
    log.info("building the fast GPT graph (%d layers, hidden %d, packed=%s, quantize=%s)", hp["num_hidden_layers"],
             hp["hidden_size"], opts.packed, opts.method)
    shape = FusedGraphShape(
        num_attention_heads=hp["num_attention_heads"], num_key_value_heads=hp["num_key_value_heads"],
        rms_norm_eps=float(dims.get("rms_norm_eps", 1e-6)), rope_theta=float(dims.get("rope_theta", 10000.0)),
        max_positions=int(dims.get("max_position_embeddings", 4096)), pack_projections=opts.packed,
        kv_cache=opts.kv_cache, kv_scales=opts.kv_scales,
    )
    model = build_fast_gpt(weights, shape)
    _stamp(model, opts.precision, hp, dims, opts.kv_cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gpt_fast.", dir=out.parent) as tmp:
        fp32_path = Path(tmp) / "fp32.onnx"
        onnx.save(model, str(fp32_path))
        del model
        final_tmp = fp32_path if opts.quantizer is None else Path(tmp) / "quant.onnx"
        cases = LeftPaddedSteps(hp) if opts.check_parity else None
        quant, parity = make_fused_graph(fp32_path, final_tmp, opts.quantizer and opts.quantizer.quantize,
                                         w_src if w_src.suffix == ".onnx" else gpt_path, cases, threads=opts.threads)
        if parity is not None:
            _judge_exact(parity, opts)
        record = write_component(onnx.load(str(final_tmp)), out.parent, FAST_GPT,
                                 _rebuilt_record(final_tmp, out, opts, w_src, quant, parity))
    log.info("wrote %s (%.1f MB)", out, record["bytes"] / 1e6)
    return record


def _judge_exact(parity: dict[str, Any], opts: FusedGraphOptions) -> None:
    """FP32 graphs must match within the tolerance; anything quantized records its difference."""
    parity["tolerance_abs"] = opts.tolerance if opts.exact else None
    if opts.exact and parity["max_abs"] > opts.tolerance:
        raise ForgeError(
            f"fast GPT graph differs from the plain graph by {parity['max_abs']:.3g} > {opts.tolerance:g}; nothing written"
        )
    log.info("fast GPT parity vs plain graph: max abs %.3g", parity["max_abs"])


def _rebuilt_record(graph: Path, out: Path, opts: FusedGraphOptions, w_src: Path, quant: dict[str, Any] | None,
                    parity: dict[str, Any] | None) -> dict[str, Any]:
    """The `components.gpt_fast` record of the graph `optimize_gpt` built (at `graph`, to be stored
    at `out`); `write_component` fills in its sha256 and bytes."""
    inputs, outputs = _io_record(graph)
    record: dict[str, Any] = {
        "file": out.name,
        "precision": opts.precision,
        "opset": FAST_GPT_OPSET,
        "converter": FAST_GPT_CONVERTER,
        "inputs": inputs,
        "outputs": outputs,
        "sha256": None,
        "bytes": None,
        "optimization": {
            "attention": "com.microsoft.GroupQueryAttention, past/present buffer shared (IO binding), attention_bias mask",
            "rotary": "com.microsoft.RotaryEmbedding with explicit position_ids",
            "norms": "RMSNormalization (opset 23) / com.microsoft.SkipSimplifiedLayerNormalization",
            "packed_projections": opts.packed,
            # Relative to the artifact folder, so the record holds no temp or checkout path.
            "weights_from": portable_path(w_src, out.parent),
            "driver": "chattts_forge.runtime.fast_gpt.FastGptStep",
        },
        "quantization": None if quant is None else {"method": opts.method, **quant},
        "parity": parity,
    }
    if opts.kv_cache != "fp32":  # absent: a float32 cache (earlier records keep their bytes)
        record["kv_cache"] = {**(opts.kv_record or {}), "dtype": opts.kv_cache}
    return record


def optimize_artifact(artifact_dir: str | os.PathLike[str], options: FusedGraphOptions | None = None) -> dict[str, Any]:
    """Add `gpt_fast.onnx` to an artifact folder and record it in its artifact.json.

    FP32 fast graph unless `options.quantizer` is given (quantized artifacts: see
    `chattts_forge.quantize.fast_gpt.optimize_artifact`, which picks it from the variant).
    Returns the component record.
    """
    folder = Path(artifact_dir).expanduser()
    meta = ArtifactMeta.load(folder)
    meta.components[FAST_GPT] = record = optimize_gpt(folder, folder / FAST_GPT_FILE, options)
    meta.write(folder)
    return record
