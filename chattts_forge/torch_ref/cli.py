"""`chattts-forge reference`: synthesize with ChatTTS's own PyTorch code (the parity oracle).

The command maps its options onto a `ReferenceConfig` for `torch_ref.reference.reference_to_files`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from chattts_forge.chattts_defaults import CODE_MAX_NEW_TOKEN
from chattts_forge.cli_options import sampling_options

# The options that are `ReferenceParams` fields (the rest say where the files go and which device runs).
KNOBS = ("seed", "speaker", "temperature", "top_p", "top_k", "repetition_penalty", "max_new_token", "min_new_token",
         "refine", "split_text", "use_decoder")


@click.command("reference")
@click.option(
    "--checkpoint",
    "checkpoint",
    required=True,
    type=click.Path(path_type=Path),
    help="ChatTTS checkpoint: asset folder, snapshot root containing asset/, or a Hugging Face cache.",
)
@click.option("--text", "text", required=True, help="Text to speak (ChatTTS splits it into sentences unless --no-split).")
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path), help="Output WAV (float32, mono)."
)
@click.option("--seed", type=int, default=None, help="Seed torch and ChatTTS's manual_seed (reproducible).")
@click.option(
    "--speaker-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the speaker string used (useful with --speaker random).",
)
@sampling_options
@click.option(
    "--max-new-token", type=int, default=CODE_MAX_NEW_TOKEN, show_default=True, help="Most code steps per part."
)
@click.option(
    "--refine/--no-refine", default=True, show_default=True, help="Refine the text with the GPT first."
)
@click.option(
    "--split/--no-split",
    "split_text",
    default=True,
    show_default=True,
    help="Chat.infer's split_text: speak sentence by sentence (the first one sets the voice of the rest).",
)
@click.option(
    "--codes-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Save the generated audio codes as an int64 .npy array [steps, 4].",
)
@click.option("--device", default="cpu", show_default=True, help="torch device (cpu, cuda, cuda:1, ...).")
@click.option(
    "--progress/--no-progress", default=None, help="ChatTTS's progress bars (default: when stderr is a tty)."
)
def reference(**options: Any) -> None:
    """Synthesize TEXT with ChatTTS's own PyTorch `Chat.infer` from a checkpoint.

    This is the reference every ONNX artifact is checked against. Defaults are ChatTTS's own
    (InferCodeParams); a synthetic `tiny` checkpoint loads with its own dimensions.

    \b
    Example:
      chattts-forge reference --checkpoint ckpt/ --text "你好。" --seed 0 --no-refine \\
          --temperature 1e-9 --codes-out codes.npy --out ref.wav
    """
    from chattts_forge.torch_ref.reference import ReferenceConfig, ReferenceParams, reference_to_files

    progress = options.pop("progress")
    knobs = {name: options.pop(name) for name in KNOBS}
    params = ReferenceParams(**knobs, show_progress=sys.stderr.isatty() if progress is None else progress)
    reference_to_files(ReferenceConfig(params=params, **options))
