"""`chattts-forge quantize`: dynamic INT8, static INT8 (QDQ), INT4 weight-only or auto (mixed) artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chattts_forge.artifact import DECODER_WEIGHTS, KV_CACHES, QUANTIZE_METHODS, quantized_variant


@click.command("quantize")
@click.option("--artifact", "artifact_dir", required=True, type=click.Path(path_type=Path),
              help="FP32 artifact folder (output of `convert`).")
@click.option("--method", required=True, type=click.Choice(QUANTIZE_METHODS))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Artifact folder to write.")
@click.option("--calibration", type=click.Path(path_type=Path), default=None,
              help="Calibration folder from `chattts-forge calibrate` (static, auto, int4 gptq).")
@click.option("--per-channel/--per-tensor", default=None,
              help="Weight scales per output channel (default: per tensor for dynamic, per channel for static).")
@click.option("--calibrate-method", type=click.Choice(["minmax", "entropy", "percentile"]), default="minmax",
              show_default=True, help="Static: how activation ranges are chosen.")
@click.option("--activation-type", type=click.Choice(["uint8", "int8"]), default="uint8", show_default=True,
              help="Static: activation type (int8 is a ~20x slower onnxruntime CPU path).")
@click.option("--symmetric-activations", is_flag=True, help="Static: symmetric activation ranges.")
@click.option("--percentile", type=float, default=None,
              help="Static with --calibrate-method percentile: clip each activation range at this percentile "
                   "of |x| (from the streamed histograms; default 99.99).")
@click.option("--weight-bits", type=click.Choice(["7", "8"]), default="7", show_default=True,
              callback=lambda _ctx, _param, v: int(v),
              help="Static: weight bits per channel. 8 is finer, but onnxruntime's u8s8 kernels saturate "
                   "on CPUs without AVX-512 VNNI, AVX-VNNI or AMX (the runtime warns there).")
@click.option("--smooth-alpha", type=float, default=None,
              help="Static: SmoothQuant migration strength (0..1, default 0.75): each MatMul input's per-channel "
                   "range moved into its weights, from the calibration statistics.")
@click.option("--smooth/--no-smooth", default=True, show_default=True,
              help="Static: the SmoothQuant migration (off by itself with --calibrate-method percentile).")
@click.option("--exclude", multiple=True, metavar="PATTERN",
              help="Keep nodes whose name matches this glob in FP32 (repeatable).")
@click.option("--block-size", default=128, show_default=True, type=int,
              help="INT4 (and auto's INT4 MatMuls): weights per quantization block (16..256).")
@click.option("--algorithm", type=click.Choice(["rtn", "k_quant", "gptq", "importance"]), default=None,
              help="INT4: rtn, k_quant, gptq or importance (default: gptq with --calibration, else rtn).")
@click.option("--gate", type=click.Path(path_type=Path), default=None,
              help="auto: GATE.toml whose fidelity thresholds the chosen assignment must meet (default: the shipped gate).")
@click.option("--accuracy-level", default=4, show_default=True, type=int,
              help="INT4: MatMulNBits accuracy_level (4: int8 compute, fastest on CPU).")
@click.option("--head/--no-head", "quantize_head", default=True, show_default=True,
              help="Also quantize the code head (head_code.onnx).")
@click.option("--min-agreement", type=float, default=None,
              help="Fallback target: teacher-forced top-1 code agreement (0..1) on the held-out split.")
@click.option("--min-cosine", type=float, default=None, help="Fallback target: mean hidden-state cosine.")
@click.option("--max-kl", type=float, default=None, help="Fallback target: mean KL divergence (nats).")
@click.option("--step-nodes", type=int, default=None, help="Fallback: nodes excluded per step (default 10%).")
@click.option("--fidelity/--no-fidelity", default=True, show_default=True,
              help="Measure fidelity against the FP32 source (stored in artifact.json).")
@click.option("--fidelity-corpus", default="builtin:evaluation", show_default=True,
              help="Held-out corpus for fidelity and fallback.")
@click.option("--fidelity-sentences", default=8, show_default=True, type=int)
@click.option("--fidelity-steps", default=48, show_default=True, type=int, help="GPT steps per sentence at most.")
@click.option("--fp32-runs", "fp32_runs", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="FP32 runs recorded once for the build (evaluate-reference's trajectories.npz): replayed "
                   "instead of recorded again when their sentences, steps and seed are fidelity's.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=None, type=int, help="onnxruntime intra-op threads for fidelity runs.")
@click.option("--kv-cache", type=click.Choice(KV_CACHES), default="fp32", show_default=True,
              help="KV cache of the fused GPT graph (dynamic/int4): int8 quarters its memory, scales "
                   "calibrated from --calibration; its fidelity is measured like the weights'. It names its "
                   f"own variant ({quantized_variant('dynamic', 'int8')}, {quantized_variant('int4', 'int8')}).")
@click.option("--decoder", "decoder", type=click.Choice(DECODER_WEIGHTS), default="int8", show_default=True,
              help="The Decoder's pointwise MatMuls: int8 = weight-only INT8 computed in float (MatMulNBits "
                   "8-bit, convolutions FP32; streams exactly), int8-a8 = the same with int8 activations "
                   "(faster; streamed audio no longer equals whole-text audio), or fp32.")
def quantize(artifact_dir: Path, out_dir: Path, **options: Any) -> None:
    """Quantize an FP32 artifact; vocos.onnx and every other file are copied unchanged.

    \b
    dynamic  onnxruntime dynamic INT8 (GPT + code head), signed weights, per tensor
    static   INT8 from `calibrate` statistics on gpt.onnx and the fused gpt_fast.onnx (per-channel weights,
             uint8 activations, SmoothQuant migration)
    int4     MatMulNBits 4-bit weight-only (block 128, accuracy_level 4; rtn, k_quant, calibrated gptq or importance)
    auto     per-MatMul FP32/INT8/INT4 from sensitivity + search: the fastest that meets --gate's fidelity
    Every method also stores the Decoder's MatMuls as weight-only INT8 unless --decoder fp32.
    With --min-agreement/--min-cosine/--max-kl, static and dynamic keep the most harmful nodes in FP32,
    step by step, until the targets hold on the held-out split (or say that they cannot).
    """
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    # Every other option is a QuantizeConfig field of the same name (the method a registry name).
    out = quantize_artifact(artifact_dir, out_dir, QuantizeConfig(**options))
    click.echo(str(out))
