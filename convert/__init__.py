"""convert stage: a ChatTTS checkpoint -> ONNX artifact folders (FP32, FP16) with parity checked.

Library entry point: `chattts_forge.convert.export.convert_checkpoint(checkpoint, out, precision)`;
CLI: `chattts-forge convert --checkpoint DIR --out OUT [--precision fp32|fp16|all]`.
Modules: `modules` (export wrappers), `components` (graph I/O, parity cases), `onnx_export`,
`parity`, `fp16`, `metadata` (artifact.json, metadata_props, support files), `parity_full` (the
runtime against ChatTTS on a full checkpoint). The fused GPT graph (`gpt_fast.onnx`) is built by
`chattts_forge.quantize.fast_gpt_graph`, which convert and quantize share (docs/architecture.md).
"""
