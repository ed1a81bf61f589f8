"""INT4 weight-only quantization (onnxruntime MatMulNBits) of one graph's MatMuls.

Block-wise 4-bit weights (block size 128 by default), `accuracy_level` 4 (int8 compute of the
activations: the fast CPU kernel; level 0 is much slower at batch > 1). Activations stay float.

Algorithms (all from `onnxruntime.quantization.matmul_nbits_quantizer`):
- `rtn`: round to nearest, symmetric (onnxruntime's default blockwise quantizer; no calibration);
- `k_quant`: llama.cpp-style k-quant search of each block's scale and zero point (asymmetric, no
  calibration);
- `gptq`: GPTQ (asymmetric), error compensation from the Hessian of each MatMul's recorded input
  activations: needs a calibration reader yielding the graph's feeds (at least `MIN_GPTQ_SAMPLES`);
- `importance`: RTN's layout with each block's scale searched against the rounding error weighted by
  calibrate's per-channel mean squares (`int4_importance.py`).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    GPTQWeightOnlyQuantConfig,
    KQuantWeightOnlyQuantConfig,
    MatMulNBitsQuantizer,
)

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger

log = get_logger(__name__)

ACCURACY_LEVELS = (0, 1, 2, 3, 4)
ALGORITHMS = ("rtn", "k_quant", "gptq", "importance")  # importance: int4_importance.py
BLOCK_SIZES = (16, 32, 64, 128, 256)
MIN_GPTQ_SAMPLES = 8
# GPTQ runs the whole graph once per distinct MatMul input and sample (80 x samples at full size):
# an even spread of this many samples keeps it to minutes; the Hessians barely change beyond it.
MAX_GPTQ_SAMPLES = 32


class FeedListReader(CalibrationDataReader):
    """A CalibrationDataReader over a list of feeds; deep-copyable (GPTQ copies its reader)."""

    def __init__(self, feeds: Iterable[dict[str, np.ndarray]]) -> None:
        self.feeds = list(feeds)
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self.feeds):
            return None
        self._next += 1
        return self.feeds[self._next - 1]

    def __deepcopy__(self, memo: dict[int, Any]) -> FeedListReader:
        return FeedListReader(self.feeds)  # the arrays are read only: share them


def initializers_in_use_order(model: onnx.ModelProto) -> None:
    """Put the initializers in the order the nodes first use them (then the unused ones, by name).
    onnxruntime's GPTQ path appends them in the order of a Python set, which changes with the
    hash seed: without this, the same GPTQ saved twice differs in bytes, not in numbers."""
    first_use: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        for name in node.input:
            first_use.setdefault(name, i)
    ordered = sorted(model.graph.initializer, key=lambda t: (first_use.get(t.name, len(model.graph.node)), t.name))
    copies = [onnx.TensorProto.FromString(t.SerializeToString()) for t in ordered]
    model.graph.ClearField("initializer")
    model.graph.initializer.extend(copies)


def evenly_spaced(total: int, count: int) -> list[int]:
    """`count` indices spread over range(total) (all of them when there are fewer)."""
    if total <= count:
        return list(range(total))
    return sorted({round(i * (total - 1) / (count - 1)) for i in range(count)})


def check_gptq_block(src: Path, block_size: int, exclude_nodes: Iterable[str] = ()) -> None:
    """onnxruntime's GPTQ cannot pad a block: every quantized MatMul's input width K (of its [K, N]
    constant weight) must be at least the block size."""
    excluded = set(exclude_nodes)
    model = onnx.load(str(src), load_external_data=False)
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    widths = [shapes[n.input[1]][0] for n in model.graph.node
              if n.op_type == "MatMul" and n.name not in excluded and len(shapes.get(n.input[1], [])) == 2]
    if widths and min(widths) < block_size:
        raise ForgeError(f"GPTQ needs --block-size <= the narrowest MatMul input of {src.name} "
                         f"({min(widths)}), got {block_size}")


def check_int4_options(block_size: int, accuracy_level: int, algorithm: str) -> None:
    """Validate INT4 options up front (before any work)."""
    if block_size not in BLOCK_SIZES:
        raise ForgeError(f"--block-size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {block_size}")
    if accuracy_level not in ACCURACY_LEVELS:
        raise ForgeError(f"--accuracy-level must be one of {ACCURACY_LEVELS}, got {accuracy_level}")
    if algorithm not in ALGORITHMS:
        raise ForgeError(f"unknown INT4 algorithm '{algorithm}' (choose from: {', '.join(ALGORITHMS)})")


def quantize_int4_graph(
    src: Path,
    dst: Path,
    block_size: int = 128,
    accuracy_level: int = 4,
    symmetric: bool = True,
    exclude_nodes: list[str] | None = None,
    algorithm: str = "rtn",
    feeds: list[dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Quantize `src` -> `dst`; returns the options record for artifact.json.

    `feeds`: the graph's calibration feeds (GPTQ only). k_quant and GPTQ are asymmetric (zero points).
    """
    check_int4_options(block_size, accuracy_level, algorithm)
    if algorithm == "importance":
        raise ForgeError("importance INT4 needs calibration statistics: use int4_importance.quantize_importance_int4_graph")
    if algorithm == "gptq" and len(feeds or []) < MIN_GPTQ_SAMPLES:
        raise ForgeError(f"GPTQ needs at least {MIN_GPTQ_SAMPLES} calibration samples of {src.name}, "
                         f"got {len(feeds or [])} (record more with `calibrate --max-samples`)")
    extra: dict[str, Any] = {}
    if algorithm == "rtn":
        config: Any = DefaultWeightOnlyQuantConfig(
            block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level,
            quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",),
        )
    elif algorithm == "k_quant":
        symmetric = False
        config = KQuantWeightOnlyQuantConfig(op_types_to_quantize=("MatMul",))
    else:
        symmetric = False
        check_gptq_block(src, block_size, exclude_nodes or [])
        used = [feeds[i] for i in evenly_spaced(len(feeds or []), MAX_GPTQ_SAMPLES)] if feeds else []
        config = GPTQWeightOnlyQuantConfig(calibration_data_reader=FeedListReader(used), block_size=block_size,
                                           op_types_to_quantize=("MatMul",))
        # onnxruntime's GPTQ prints its own progress bar to stdout, which is silenced below (the INC
        # path also prints per node): say up front how long this is.
        log.info("GPTQ on %s: the whole graph runs once per MatMul input and sample (%d samples); "
                 "minutes on the full-size GPT (2.5-3 min a graph on 2 cores)", src.name, len(used))
        extra = {"calibration_samples": len(used), "percdamp": config.percdamp,
                 "actorder": config.actorder, "mse": config.mse}
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the INC path logs per node through the root logger
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = onnx.load(str(src))
            quantizer = MatMulNBitsQuantizer(
                model, block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level,
                nodes_to_exclude=list(exclude_nodes or []), algo_config=config,
            )
            quantizer.process()
        out = quantizer.model
        if algorithm == "gptq":
            initializers_in_use_order(getattr(out, "model", out))
        if hasattr(out, "save_model_to_file"):  # onnxruntime's ONNXModel (rtn path: as before)
            out.save_model_to_file(str(dst), use_external_data_format=False)
        else:
            onnx.save(getattr(out, "model", out), str(dst))
    except ForgeError:
        raise
    except Exception as e:
        raise ForgeError(f"int4 quantization ({algorithm}) of {src.name} failed: {str(e).splitlines()[0]}") from None
    finally:
        root.setLevel(level)
    return {
        "weight_type": "int4",
        "activation_type": "float32 (weight-only)",
        "algorithm": algorithm,
        "block_size": block_size,
        "accuracy_level": accuracy_level,
        "symmetric": symmetric,
        "op_types": ["MatMul"],
        **extra,
    }
