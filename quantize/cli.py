"""`chattts-forge quantize`: dynamic INT8, static INT8 (QDQ), INT4 weight-only or auto (mixed) artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from chattts_forge.artifact import QuantizeMethod
from chattts_forge.options import declared_options
from chattts_forge.quantize.config import QuantizeCommandOptions, QuantizeConfig


def given_options(ctx: click.Context, options: dict[str, Any]) -> dict[str, Any]:
    """The options named on the command line (or in the environment), not left at their defaults:
    the method's config refuses those of another method, and takes its own defaults for the rest."""
    return {name: value for name, value in options.items()
            if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


@click.command("quantize")
@click.option("--artifact", "artifact_dir", required=True, type=click.Path(path_type=Path),
              help="FP32 artifact folder (output of `convert`).")
@click.option("--method", required=True, type=click.Choice(QuantizeMethod.values()))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Artifact folder to write.")
@declared_options(QuantizeCommandOptions)  # every other option, declared once on its field (config.py)
@click.pass_context
def quantize(ctx: click.Context, artifact_dir: Path, out_dir: Path, method: str, **options: Any) -> None:
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
    from chattts_forge.quantize import quantize_artifact

    out = quantize_artifact(artifact_dir, out_dir, QuantizeConfig(method, **given_options(ctx, options)))
    click.echo(str(out))
