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
- `Exp`, `Clip`, `Cos`, `Sin`: not present in FP16 graphs here (the vocoder, the only user, stays
  float32), listed so a future converted vocoder never gets an overflowing exp.
"""

from __future__ import annotations

import warnings
from typing import Any

import onnx

from chattts_forge.log import get_logger

log = get_logger(__name__)

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
    from importlib import metadata

    out = {}
    for dist in ("onnxconverter-common", "onnxruntime"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


def op_block_list(converter: str) -> list[str]:
    if converter == "onnxconverter-common":
        from onnxconverter_common import float16
    else:
        from onnxruntime.transformers import float16
    return sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(EXTRA_OP_BLOCK_LIST))


def convert_to_fp16(model: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """An FP16 copy of `model` (float32 inputs/outputs) and a record of how it was made."""
    versions = _converter_versions()
    errors: dict[str, str] = {}
    for converter in ("onnxconverter-common", "onnxruntime.transformers.float16"):
        blocked = op_block_list(converter)
        src = onnx.ModelProto()
        src.CopyFrom(model)
        try:
            with warnings.catch_warnings():
                # "the float32 number X will be truncated": expected for the -1e4 attention mask.
                warnings.simplefilter("ignore", UserWarning)
                out = _run_converter(converter, src, blocked)
        except Exception as e:  # converter bugs surface as arbitrary exceptions
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors[converter] = f"{type(e).__name__}: {first}"
            log.info("%s: %s failed (%s); trying the next converter", name, converter, errors[converter])
            continue
        if converter == "onnxconverter-common":
            label = f"onnxconverter-common {versions['onnxconverter-common']}"
        else:
            label = f"onnxruntime.transformers.float16 (onnxruntime {versions['onnxruntime']})"
        record: dict[str, Any] = {"converter": label, "keep_io_types": True, "op_block_list": blocked}
        if errors:
            record["fallback_from"] = errors
        return out, record
    raise RuntimeError(f"{name}: no FP16 converter worked: {errors}")


def _run_converter(converter: str, model: onnx.ModelProto, blocked: list[str]) -> onnx.ModelProto:
    if converter == "onnxconverter-common":
        from onnxconverter_common import float16

        return float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked)
    from onnxruntime.transformers import float16 as ort_float16

    return ort_float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked)
