"""INT4 weight-only quantization (onnxruntime MatMulNBits) of one graph's MatMuls.

Block-wise 4-bit weights (block size 128 by default), `accuracy_level` 4 (int8 compute of the
activations: the fast CPU kernel; level 0 is much slower at batch > 1). Activations stay float.

Algorithms:
- `rtn`: round to nearest, symmetric (onnxruntime's default blockwise quantizer; no calibration);
- `k_quant`: llama.cpp-style k-quant search of each block's scale and zero point (onnxruntime's;
  asymmetric, no calibration);
- `gptq`: GPTQ error compensation from the Hessians (X^T X) calibrate streamed, in RTN's layout
  (`int4_gptq.py`; onnxruntime's GPTQ, which builds its own from raw feeds, gave the same bytes for
  8, 32 and 128 calibration sentences here and is not used);
- `importance`: RTN's layout with each block's scale searched against the rounding error weighted by
  calibrate's per-channel mean squares (`int4_importance.py`).
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    KQuantWeightOnlyQuantConfig,
    MatMulNBitsQuantizer,
)

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.quantize.config import Int4Algorithm

log = get_logger(__name__)

ACCURACY_LEVELS = (0, 1, 2, 3, 4)
ALGORITHMS = Int4Algorithm.values()  # declared once, with the --algorithm option (config.py)
BLOCK_SIZES = (16, 32, 64, 128, 256)
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


def check_int4_options(block_size: int, accuracy_level: int, algorithm: str) -> None:
    """Validate INT4 options up front (before any work)."""
    if block_size not in BLOCK_SIZES:
        raise BadInput(f"--block-size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {block_size}")
    if accuracy_level not in ACCURACY_LEVELS:
        raise BadInput(f"--accuracy-level must be one of {ACCURACY_LEVELS}, got {accuracy_level}")
    if algorithm not in ALGORITHMS:
        raise BadInput(f"unknown INT4 algorithm '{algorithm}' (choose from: {', '.join(ALGORITHMS)})")


def quantize_int4_graph(
    src: Path,
    dst: Path,
    block_size: int = 128,
    accuracy_level: int = 4,
    symmetric: bool = True,
    exclude_nodes: list[str] | None = None,
    algorithm: str = "rtn",
) -> dict[str, Any]:
    """Quantize `src` -> `dst` with onnxruntime's rtn or k_quant (asymmetric: zero points); returns the
    options record for artifact.json."""
    check_int4_options(block_size, accuracy_level, algorithm)
    if algorithm in ("importance", "gptq"):
        raise BadInput(f"{algorithm} INT4 needs calibration statistics: use quantize_{algorithm}_int4_graph "
                         f"(int4_{algorithm}.py)")
    if algorithm == "rtn":
        config: Any = DefaultWeightOnlyQuantConfig(
            block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level,
            quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",),
        )
    else:
        symmetric = False
        config = KQuantWeightOnlyQuantConfig(op_types_to_quantize=("MatMul",))
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
        "algorithm": str(algorithm),  # a plain spelling (an Int4Algorithm from the config)
        "block_size": block_size,
        "accuracy_level": accuracy_level,
        "symmetric": symmetric,
        "op_types": ["MatMul"],
    }
