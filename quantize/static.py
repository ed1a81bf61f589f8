"""Static INT8 (QDQ) quantization of one graph from recorded calibration inputs.

Choices (measured on the GPT step, 2 threads, see issue 5/8): QDQ format; weights signed int8
per channel; activations **uint8** by default, because int8 activations hit a slow onnxruntime CPU
path (550 ms vs 24 ms per step); only MatMuls with a constant weight are quantized
(`MatMulConstBOnly`: attention score/value MatMuls keep FP32 inputs, which both matter for accuracy
and have no fast int8 kernel). The graph is pre-processed with `quant_pre_process` (symbolic shape
inference + ORT basic optimizations) first. Calibration ranges are cached in a JSON file so that the
fallback search re-quantizes with other exclusions without re-running calibration.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.quantize.graph_ops import matmul_nodes_with_const_weight

log = get_logger(__name__)

CALIBRATE_METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}


@contextlib.contextmanager
def _scratch_cwd(near: Path) -> Iterator[None]:
    """Run in a throw-away working folder: when symbolic shape inference fails, onnxruntime dumps
    `sym_shape_infer_temp.onnx` (+ external data) into the current folder, wherever that is."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=".preprocess.", dir=near) as tmp:
        os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(old)


def preprocess(src: Path, dst: Path) -> dict[str, Any]:
    """`quant_pre_process` with a fallback to ONNX-only shape inference; returns what was done."""
    src, dst = src.resolve(), dst.resolve()
    with _scratch_cwd(dst.parent):
        try:
            # auto_merge: the GPT's past/total sequence dims conflict in symbolic inference otherwise.
            quant_pre_process(str(src), str(dst), skip_optimization=False, auto_merge=True)
            return {"pre_process": "quant_pre_process (symbolic shape inference, auto_merge, optimization)"}
        except Exception as e:  # symbolic shape inference fails on some graphs; degrade, say so
            log.warning("quant_pre_process failed on %s (%s); retrying without symbolic shape inference", src.name, e)
            quant_pre_process(str(src), str(dst), skip_optimization=False, skip_symbolic_shape=True)
            return {"pre_process": "quant_pre_process (onnx shape inference only)", "symbolic_shape_error": str(e)[:200]}


def resolve_excludes(model_path: Path, patterns: list[str]) -> list[str]:
    """Node names of `model_path` matching any fnmatch pattern (or exact name)."""
    if not patterns:
        return []
    names = [n.name for n in onnx.load(str(model_path), load_external_data=False).graph.node]
    out = [n for n in names if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(n == p or fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        log.warning("%s: --exclude pattern(s) matched no node: %s", model_path.name, ", ".join(unmatched))
    return out


class StoreReader:
    """onnxruntime CalibrationDataReader over the recorded samples of one component."""

    def __init__(self, store: CalibrationStore, component: str, input_names: list[str]) -> None:
        self._it = store.iter_samples(component)
        self.input_names = input_names

    def get_next(self) -> dict[str, Any] | None:
        sample = next(self._it, None)
        if sample is None:
            return None
        missing = [n for n in self.input_names if n not in sample]
        if missing:
            raise ForgeError(f"calibration sample lacks graph input(s) {missing}; was it recorded from this artifact?")
        return {n: sample[n] for n in self.input_names}


@dataclass(frozen=True)
class StaticOptions:
    """onnxruntime quantize_static's choices (`quantize --method static` with non-minmax ranges)."""

    calibrate_method: str = "minmax"
    per_channel: bool = True
    symmetric_activations: bool = False
    activation_type: str = "uint8"
    exclude_nodes: list[str] = field(default_factory=list)


def quantize_static_graph(
    src: Path,
    dst: Path,
    store: CalibrationStore,
    component: str,
    options: StaticOptions,
    cache_path: Path | None = None,
    preprocessed: Path | None = None,
) -> dict[str, Any]:
    """Quantize `src` -> `dst` (QDQ) from the `component` samples of `store`.

    `preprocessed`: an already pre-processed copy of `src` (the fallback loop passes it to avoid
    redoing it); `cache_path`: calibration ranges cache (created on first use). Returns the options
    record for artifact.json.
    """
    calibrate_method, per_channel, activation_type = options.calibrate_method, options.per_channel, options.activation_type
    symmetric_activations, exclude_nodes = options.symmetric_activations, options.exclude_nodes
    if calibrate_method not in CALIBRATE_METHODS:
        raise BadInput(f"unknown calibration method '{calibrate_method}' (minmax, entropy, percentile)")
    if activation_type not in ("uint8", "int8"):
        raise BadInput(f"activation type must be uint8 or int8, got '{activation_type}'")
    if store.count(component) == 0:
        raise ForgeError(f"calibration data has no samples for '{component}' (re-run `calibrate`)")
    if activation_type == "int8":
        log.warning("int8 activations: onnxruntime's CPU QDQ path is ~20x slower than uint8 on this GPT")
    with tempfile.TemporaryDirectory(prefix="forge-static-") as tmp:
        record: dict[str, Any] = {}
        if preprocessed is None:
            preprocessed = Path(tmp) / "pre.onnx"
            record.update(preprocess(src, preprocessed))
        model = onnx.load(str(preprocessed), load_external_data=False)
        input_names = [i.name for i in model.graph.input]
        # onnxruntime's QDQ quantizer ignores MatMulConstBOnly: keep activation x activation MatMuls
        # (attention scores and values) in FP32 explicitly.
        const_mm = set(matmul_nodes_with_const_weight(model))
        activation_mm = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.name not in const_mm]
        del model
        extra = {
            "MatMulConstBOnly": True,
            "ActivationSymmetric": symmetric_activations,
            "WeightSymmetric": True,
            # Not CalibMaxIntermediateOutputs: onnxruntime 1.32's MinMaxCalibrater *drops* every full
            # batch of intermediate outputs instead of reducing it ("No data is collected").
        }
        # onnxruntime's quantizer logs through the root logger; keep its advice out of our output.
        root = logging.getLogger()
        level = root.level
        root.setLevel(max(level, logging.ERROR))
        try:
            quantize_static(
                str(preprocessed),
                str(dst),
                StoreReader(store, component, input_names),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul", "Gemm"],
                per_channel=per_channel,
                reduce_range=False,
                activation_type=QuantType.QUInt8 if activation_type == "uint8" else QuantType.QInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=list(exclude_nodes or []) + activation_mm,
                calibrate_method=CALIBRATE_METHODS[calibrate_method],
                extra_options=extra,
                calibration_cache_path=str(cache_path) if cache_path else None,
            )
        except ForgeError:
            raise
        except Exception as e:
            raise ForgeError(f"static quantization of {src.name} failed: {str(e).splitlines()[0]}") from None
        finally:
            root.setLevel(level)
    record.update(_options_record(options, len(activation_mm), store.count(component)))
    return record


def _options_record(options: StaticOptions, activation_matmuls: int, samples: int) -> dict[str, Any]:
    return {
        "format": "QDQ",
        "calibrate_method": options.calibrate_method,
        "per_channel": options.per_channel,
        "weight_type": "int8",
        "activation_type": options.activation_type,
        "symmetric_activations": options.symmetric_activations,
        "op_types": ["MatMul", "Gemm"],
        "matmul_const_b_only": True,
        "activation_matmuls_kept_fp32": activation_matmuls,
        "calibration_samples": samples,
    }


def preprocess_for_static(src: Path, dst: Path) -> dict[str, Any]:
    """Public wrapper so the fallback loop pre-processes once."""
    return preprocess(src, dst)
