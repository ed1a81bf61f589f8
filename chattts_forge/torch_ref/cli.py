"""`chattts-forge reference`: synthesize with ChatTTS's own PyTorch code (the parity oracle).

Its options are declared once, on the fields of `ReferenceConfig` (where the files go, the device) and
`ReferenceParams` (the knobs) in torch_ref/reference.py, for `reference_to_files`; `--progress` is
written here (the terminal decides its default).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from chattts_forge.options import declared_fields, declared_options
from chattts_forge.torch_ref.reference import ReferenceConfig, ReferenceParams, reference_to_files

# The options that are `ReferenceParams` fields (the rest say where the files go and which device runs).
KNOBS = tuple(f.name for f in declared_fields(ReferenceParams))


@click.command("reference")
@declared_options(ReferenceConfig)
@declared_options(ReferenceParams)
@click.option(
    "--progress/--no-progress", default=None, help="ChatTTS's progress bars (default: when stderr is a tty)."
)
def reference(progress: bool | None, **options: Any) -> None:
    """Synthesize TEXT with ChatTTS's own PyTorch `Chat.infer` from a checkpoint.

    This is the reference every ONNX artifact is checked against. Defaults are ChatTTS's own
    (InferCodeParams); a synthetic `tiny` checkpoint loads with its own dimensions.

    \b
    Example:
      chattts-forge reference --checkpoint ckpt/ --text "你好。" --seed 0 --no-refine \\
          --temperature 1e-9 --codes-out codes.npy --out ref.wav
    """
    knobs = {name: options.pop(name) for name in KNOBS}
    params = ReferenceParams(**knobs, show_progress=sys.stderr.isatty() if progress is None else progress)
    reference_to_files(ReferenceConfig(params=params, **options))
