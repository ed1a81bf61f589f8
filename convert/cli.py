"""`chattts-forge convert`: checkpoint -> ONNX artifact folders (library: `convert.export.convert_checkpoint`;
the options are `ConvertConfig`'s declared fields)."""

from __future__ import annotations

from typing import Any

import click

from chattts_forge.convert.export import ConvertConfig
from chattts_forge.options import declared_options


@click.command("convert")
@declared_options(ConvertConfig)
def convert(**options: Any) -> None:
    """Export every ChatTTS component to ONNX (FP32, FP16) with parity checked at export.

    Each graph is run by onnxruntime against ChatTTS's own PyTorch code on several shapes; a
    graph outside tolerance fails the conversion and nothing is written.
    """
    dirs = ConvertConfig(**options).run()
    for variant, folder in dirs.items():
        click.echo(f"{variant}: {folder}")
