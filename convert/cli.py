"""`chattts-forge convert`: checkpoint -> ONNX artifact folders (library: `convert.export.convert_checkpoint`)."""

from __future__ import annotations

import click

from chattts_forge.convert.export import PRECISIONS


@click.command("convert")
@click.option(
    "--checkpoint",
    "checkpoint",
    required=True,
    help="ChatTTS checkpoint: asset folder, snapshot root, HF cache, or 'hf' (default HF cache).",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False),
    help="Output folder; artifacts go to OUT/fp32 and OUT/fp16.",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default="all",
    show_default=True,
    help="Which artifact folders to write.",
)
@click.option(
    "--threads", type=int, default=2, show_default=True, help="CPU threads for torch and onnxruntime."
)
@click.option(
    "--fast-gpt/--no-fast-gpt",
    default=True,
    show_default=True,
    help="Also write gpt_fast.onnx (fused ops, in-place KV cache) into fp32/; the runtime prefers it on CPU.",
)
def convert(checkpoint: str, out: str, precision: str, threads: int, fast_gpt: bool) -> None:
    """Export every ChatTTS component to ONNX (FP32, FP16) with parity checked at export.

    Each graph is run by onnxruntime against ChatTTS's own PyTorch code on several shapes; a
    graph outside tolerance fails the conversion and nothing is written.
    """
    from chattts_forge.convert.export import convert_checkpoint

    dirs = convert_checkpoint(checkpoint, out, precision=precision, threads=threads, fast_gpt=fast_gpt)
    for variant, folder in dirs.items():
        click.echo(f"{variant}: {folder}")
