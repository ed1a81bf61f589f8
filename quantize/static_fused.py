"""Static INT8 on the fused GPT graph (`gpt_fast.onnx`): calibrated activation scales, integer kernels.

The calibration set records the inputs of the *plain* `gpt.onnx` (inputs_embeds, attention_mask,
position_ids, past key/values). `fused_feed` turns each recorded sample into the fused graph's feed
(additive attention bias, seqlens_k, a cache buffer holding the past), so the activation ranges are
recorded on the fused graph itself: the same activations the runtime will quantize, no name mapping.

Only the inputs of the constant-weight MatMuls (packed QKV, o_proj, packed gate/up, down_proj) get a
QuantizeLinear/DequantizeLinear pair; their outputs stay float. onnxruntime's CPU QDQ transformer
turns `DQ(x) -> MatMul <- DQ(W)` with a float output into `MatMulIntegerToFloat`, the kernel dynamic
INT8 ends up in, minus the run-time min/max scan of DynamicQuantizeLinear. (onnxruntime's own
`quantize_static` also quantizes each MatMul's output and gives `QLinearMatMul -> DequantizeLinear`:
one more rounding per MatMul and no faster.) Weights: symmetric int8 per output channel (axis 1 of
[in, out]); activations asymmetric uint8 by default (U8S8: onnxruntime's fast x86 path).

Weights use 7 bits (+-63, onnxruntime's `reduce_range`) by default: x86 CPUs without VNNI (AVX2,
this build machine) multiply u8 x s8 with `vpmaddubsw`, which adds two products into a saturating
int16 (255 * 127 * 2 > 32767). Per-channel scales put a +-127 weight in every column, so full-range
weights saturate often: measured on the tiny checkpoint (fused graph, 4 held-out sentences), top-1
agreement 0.83 with 8-bit per-channel weights, 0.94 with 7-bit ones (dynamic INT8: 0.96).
`--weight-bits 8` is for CPUs with VNNI or AMX, whose kernels add in int32 (the runtime warns elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from chattts_forge.calibration_data.observe import const_weight_matmuls, fused_feed
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.quantize.dynamic_fused import replace_nodes
from chattts_forge.quantize.smooth import smooth_inputs

log = get_logger(__name__)

ACTIVATION_TYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def fused_feeds(samples: Iterable[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    for s in samples:
        yield fused_feed(s)


def record_ranges(model_path: Path, tensors: list[str], feeds: Iterable[dict[str, np.ndarray]],
                  threads: int = 1) -> tuple[dict[str, tuple[float, float]], int]:
    """Min/max of each of `tensors` over every feed (the graph run with those tensors as outputs)."""
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    if not tensors:  # nothing to calibrate (e.g. an auto assignment without INT8 MatMuls)
        return {}, 0
    model = onnx.load(str(model_path))
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in tensors if t not in have)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del model
    lo = dict.fromkeys(tensors, np.inf)
    hi = dict.fromkeys(tensors, -np.inf)
    count = 0
    for feed in feeds:
        try:
            outs = sess.run(tensors, feed)
        except Exception as e:  # a sample of another graph: say so in one line
            raise ForgeError(f"calibration sample does not fit {model_path.name}: {str(e).splitlines()[0]}") from None
        for t, v in zip(tensors, outs, strict=True):
            lo[t] = min(lo[t], float(v.min()))
            hi[t] = max(hi[t], float(v.max()))
        count += 1
    if not count:
        raise ForgeError(f"calibration data has no samples for {model_path.name} (re-run `calibrate`)")
    return {t: (lo[t], hi[t]) for t in tensors}, count


def activation_qparams(lo: float, hi: float, activation_type: str) -> tuple[np.float32, np.ndarray]:
    """Scale and zero point covering [lo, hi] (always including 0, as onnxruntime does)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if activation_type == "uint8":
        scale = (hi - lo) / 255.0 or 1.0
        zp = np.array(int(np.clip(round(-lo / scale), 0, 255)), dtype=np.uint8)
    else:  # symmetric int8
        scale = max(abs(lo), abs(hi)) / 127.0 or 1.0
        zp = np.array(0, dtype=np.int8)
    return np.float32(scale), zp


def weight_int8_per_channel(w: np.ndarray, reduce_range: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights of a MatMul B [in, out], one scale per output column; `reduce_range`:
    7-bit values (+-63), see the module doc."""
    qmax = 63 if reduce_range else 127
    scale = np.abs(w).max(axis=0) / qmax
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)
    return q, scale


def insert_qdq(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]], nodes: list[str],
               activation_type: str = "uint8", reduce_range: bool = True) -> onnx.ModelProto:
    """Quantize the named MatMuls in place: Q/DQ on the activation input, int8 per-channel DQ weight."""
    inits = {i.name: i for i in model.graph.initializer}
    chosen = set(nodes)
    new_nodes: list[onnx.NodeProto] = []
    quantized_inputs: dict[str, str] = {}  # activation -> its dequantized copy (shared by consumers)
    dropped: dict[str, None] = {}  # in node order (a set's order changes with the hash seed: bytes would too)
    for node in model.graph.node:
        if node.name not in chosen:
            new_nodes.append(node)
            continue
        x, wname = node.input[0], node.input[1]
        if x not in quantized_inputs:
            scale, zp = activation_qparams(*ranges[x], activation_type)
            base = x.replace("/", "_").strip("_")
            s_name, z_name = f"{base}_scale", f"{base}_zero_point"
            model.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), s_name),
                                            numpy_helper.from_array(zp, z_name)])
            q_out, dq_out = f"{x}_quantized", f"{x}_dequantized"
            new_nodes.append(helper.make_node("QuantizeLinear", [x, s_name, z_name], [q_out], name=f"{node.name}_input_Q"))
            new_nodes.append(helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out],
                                              name=f"{node.name}_input_DQ"))
            quantized_inputs[x] = dq_out
        w = numpy_helper.to_array(inits[wname])
        qw, wscale = weight_int8_per_channel(w, reduce_range)
        model.graph.initializer.extend([
            numpy_helper.from_array(qw, f"{wname}_quantized"),
            numpy_helper.from_array(wscale, f"{wname}_scale"),
            numpy_helper.from_array(np.zeros(wscale.shape, np.int8), f"{wname}_zero_point"),
        ])
        dropped[wname] = None
        new_nodes.append(helper.make_node("DequantizeLinear", [f"{wname}_quantized", f"{wname}_scale",
                                                              f"{wname}_zero_point"], [f"{wname}_dequantized"],
                                          name=f"{node.name}_weight_DQ", axis=1))
        new_nodes.append(helper.make_node("MatMul", [quantized_inputs[x], f"{wname}_dequantized"], list(node.output),
                                          name=node.name))
    replace_nodes(model, new_nodes, dropped)
    declared = {v.name for v in model.graph.value_info}
    model.graph.value_info.extend(
        helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
        for t in (*quantized_inputs.values(), *(f"{w}_dequantized" for w in dropped)) if t not in declared
    )
    return model


@dataclass(frozen=True)
class StaticSettings:
    """How `quantize_static_inputs` quantizes: the activations' type, 7-bit weights
    (`reduce_range`) or 8-bit, and the ranges: `percentile`, each clipped at that percentile of |x|
    (the streamed histograms), or `smooth_alpha`, SmoothQuant migration first (`smooth.py`); either
    needs statistics. The method resolves them from its options (methods.StaticInt8)."""

    activation_type: str = "uint8"
    reduce_range: bool = True
    smooth_alpha: float | None = None
    percentile: float | None = None


def quantize_static_inputs(src: Path, dst: Path, feeds: Iterable[dict[str, np.ndarray]] | None = None, *,
                           settings: StaticSettings = StaticSettings(), exclude_nodes: Iterable[str] = (),
                           threads: int = 1, statistics: tuple[Any, str] | None = None) -> dict[str, Any]:
    """Static INT8 of every constant-weight MatMul of `src`, as `settings` say. Ranges from
    `statistics` = (a `calibration_data.statistics.Statistics`, the graph's name in it: calibrate's
    streamed min/max of the graph's own MatMul inputs), or else measured on `feeds` (the graph's own
    inputs). Returns the options record for artifact.json."""
    activation_type, reduce_range = str(settings.activation_type), settings.reduce_range
    smooth_alpha, percentile = settings.smooth_alpha, settings.percentile
    if activation_type not in ACTIVATION_TYPES:
        raise BadInput(f"activation type must be uint8 or int8, got '{activation_type}'")
    model = onnx.load(str(src))
    excluded = set(exclude_nodes)
    targets = [n for n in const_weight_matmuls(model) if n.name not in excluded]
    tensors = sorted({n.input[0] for n in targets})
    if statistics is not None:
        stats, graph = statistics
        ranges, count = stats.ranges(graph, tensors, percentile=percentile), stats.samples(graph)
    elif percentile is not None:
        raise ForgeError("percentile ranges are read from calibration statistics (their histograms)")
    elif feeds is not None:
        ranges, count = record_ranges(src, tensors, feeds, threads=threads)
    else:
        raise BadInput(f"static INT8 of {src.name} needs calibration statistics or feeds")
    smoothing = None
    if smooth_alpha is not None:
        if percentile is not None:
            raise BadInput("SmoothQuant migration takes minmax ranges, not percentile ones")
        if statistics is None:
            raise BadInput("SmoothQuant migration needs calibration statistics (per-channel absmax)")
        smoothed = smooth_inputs(model, targets, statistics[0].tensors(statistics[1]), ranges, smooth_alpha)
        ranges, smoothing = smoothed.ranges, smoothed.record(smooth_alpha)
    insert_qdq(model, ranges, [n.name for n in targets], activation_type, reduce_range)
    onnx.save(model, str(dst))
    log.info("static INT8 %s: %d MatMuls, %d activation ranges from %d samples", src.name,
             len(targets), len(tensors), count)
    return {
        "format": "QDQ (activation inputs only; fused by onnxruntime into MatMulIntegerToFloat)",
        "calibrate_method": "minmax" if percentile is None else "percentile",
        **({"percentile": percentile} if percentile is not None else {}),
        "per_channel": True,
        "weight_type": "int8 (symmetric, per output channel)",
        "weight_range": "7-bit (+-63, reduce_range)" if reduce_range else "8-bit (+-127)",
        "activation_type": activation_type,
        "symmetric_activations": activation_type == "int8",
        "matmuls_quantized": len(targets),
        "excluded_nodes": sorted(excluded),
        "calibration_samples": count,
        "ranges_from": "streamed calibration statistics" if statistics is not None else "calibration feeds",
        "activation_ranges": {t: [round(lo, 6), round(hi, 6)] for t, (lo, hi) in ranges.items()},
        **({"smoothing": smoothing} if smoothing else {}),
    }
