"""quantize stage: FP32 artifact -> dynamic INT8, static INT8 (QDQ), INT4 weight-only or auto (mixed) artifact.

Library::

    from chattts_forge.quantize import QuantizeConfig, quantize_artifact, measure_fidelity
    quantize_artifact("artifacts/fp32", "artifacts/int8-dynamic", QuantizeConfig("dynamic"))
    quantize_artifact("artifacts/fp32", "artifacts/int8-static",
                      QuantizeConfig("static", calibration="build/calib", min_agreement=0.99))  # fallback
    quantize_artifact("artifacts/fp32", "artifacts/int4", QuantizeConfig("int4", block_size=128))
    quantize_artifact("artifacts/fp32", "artifacts/int4", QuantizeConfig("int4", calibration="build/calib",
                      algorithm="gptq", block_size=32))                     # rtn | k_quant | gptq
    quantize_artifact("artifacts/fp32", "artifacts/auto", QuantizeConfig("auto", calibration="build/calib",
                      gate="GATE.toml"))      # fastest per-MatMul FP32/INT8/INT4 meeting the gate
    fid = measure_fidelity("artifacts/fp32", "artifacts/int4", corpus="builtin:evaluation")

`QuantizeConfig(method, **options)` (config.py) is the method's own config type (`Int4Config`, ...),
composed of the options dataclasses it reads (`CommonOptions`, `StaticInt8Options`, `BlockOptions`,
`Int4Options`, `AutoOptions`, ...); an option of another method is a one-line BadInput. Each option
is declared once on its field: the CLI's options (their union), the build driver's step arguments and
the record are derived from them; each method is a class of the registry in `methods.py` (`METHODS`:
what it needs, how it quantizes the plain and fused GPT graphs, its record; the base class in
`method_base.py`).

What is quantized: the GPT's constant-weight MatMuls (q/k/v/o, gate/up/down) and the code head
(`head_code`, one MatMul; `quantize_head=False` keeps it FP32), and, whatever the method, the
Decoder's pointwise MatMuls as weight-only INT8 (`decoder.py`; `decoder="fp32"` keeps it). Attention
MatMuls (both inputs are activations), the embeddings (Gathers), the text head (unused by the code
stage) and the convolutions (Decoder, DVAE: dynamic ConvInteger is a slow CPU path) stay FP32;
vocos.onnx (+ its .data) is copied byte for byte and its sha256 is checked. The fused GPT and the
Decoder the stage writes keep their weights in external data (`chattts_forge.graph_storage`).
The stage's steps: `quantize.py`; the methods: `methods.py`, `method_base.py` (quantizers: `dynamic.py`, `static.py`,
`static_fused.py` with `smooth.py`, `int4.py`, `int4_gptq.py`, `int4_importance.py`, `auto.py`).
A fused `gpt_fast.onnx` in the source (quantize.fast_gpt_graph) is FP32 and never copied: each method
says what becomes of it (`QuantizationMethod.write_fast_graph`): dynamic and RTN int4 rebuild it with
the same quantizer (`fast_graph_quantizer`), static (minmax or percentile ranges, SmoothQuant),
calibrated int4 (k_quant, gptq, importance) and
auto quantize the source's own gpt_fast.onnx with the same per-MatMul choices as gpt.onnx
(`fused.py`; parity of the two graphs on the recorded samples is recorded); fallback runs and
legacy static (entropy/symmetric, via onnxruntime's quantize_static) drop it so the
runtime uses the quantized `gpt.onnx`. Before any work the input artifact's files are checked
against their recorded sizes and sha256, and the calibration folder against the artifact (`inputs.py`). Calibration: `chattts-forge calibrate`
(`chattts_forge.calibration_data`). Decode-step timing of the results:
`python -m chattts_forge.quantize.stepbench FP32_DIR QUANT_DIR...`.

The output is a complete artifact folder (written atomically) that `chattts-forge synth` runs. Its
artifact.json gets: `variant` (int8-dynamic | int8-static | int4 | auto, `-kv8` with an int8 KV
cache), per-component `precision`/`sha256`/`bytes`, `"quantization"` (the typed record
`chattts_forge.artifact.Quantization`: method, options, per-graph op summary and per-op precision,
excluded nodes, calibration corpus hash and sample counts, fallback steps, sizes; like Optimum's
ort_config.json) and `"fidelity"`.

`measure_fidelity(fp32_dir, quant_dir, corpus="builtin:evaluation", max_sentences=8,
max_new_token=48, seed=0, threads=None, per_tensor=True, top_tensors=10)` returns (and
artifact.json stores under "fidelity")::

    {
      "reference": str,                          # the FP32 artifact folder
      "corpus": {"name": str, "sha256": str, "sentences_used": int},
      "method": "teacher-forced replay of FP32 runtime trajectories (raw code logits)",
      "settings": {"max_sentences": int, "max_new_token": int, "seed": int},
      "teacher_forced": {
        "top1_agreement": {"mean": float, "min_stream": float, "per_stream": [float] * num_vq},
        "kl": {"mean": float, "max_stream": float, "per_stream": [float] * num_vq},   # nats, KL(fp32||q)
        "steps": int},                           # GPT steps x rows compared
      "hidden_cosine": {"mean": float, "min": float},   # GPT last hidden state, per step
      "mel": {"snr_db": float, "lsd_db": float, "frames": int},   # after each artifact's Decoder
      "per_tensor": {                            # absent when per_tensor=False
        "graph": "gpt", "samples": int, "tensors_compared": int,
        "worst_local": [{"node", "op_type", "tensor", "rel_error", "cosine", "input_rel_error",
                         "local_error", "producer_of_input"}],   # sorted by error the node adds
        "worst_output": [{"node", "rel_error", "cosine"}],       # sorted by output error
        "all_local": None | [...],               # every row, when keep_all_tensors=True
        "head_code_rel_error": float},           # the code head alone, on FP32 hidden states
      "gpt_fast": {"teacher_forced": {...as above}, "hidden_cosine": {...}}   # only when the artifact
    }                                            # has a fused gpt_fast graph (replayed by FastGptStep)

Fidelity is weight-agnostic: it compares the quantized graphs with their own FP32 source on the
held-out split, so it means the same on synthetic (random) checkpoints as on the released one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chattts_forge.artifact import QUANTIZE_METHODS as METHODS
from chattts_forge.quantize.config import FidelitySettings, QuantizeConfig, Targets

if TYPE_CHECKING:
    from chattts_forge.quantize.fidelity import measure_fidelity
    from chattts_forge.quantize.quantize import quantize_artifact

__all__ = ["METHODS", "FidelitySettings", "QuantizeConfig", "Targets", "measure_fidelity", "quantize_artifact"]

# The stage's functions load onnx, onnxruntime and the runtime: imported when first used, so that
# the CLI, the driver and the method registry import this package cheaply.
_LAZY = {"measure_fidelity": "chattts_forge.quantize.fidelity", "quantize_artifact": "chattts_forge.quantize.quantize"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
