"""Click options and help texts shared by several commands: the provider, and the help of --speaker
and --decoder/--dvae (declared on the configs of `reference`, `synth` and `warm`).

The commands expose the knobs ChatTTS users know with ChatTTS's InferCodeParams defaults, declared
once on `chattts_defaults.CodeKnobs` (the base of their configs); one definition keeps their names
and defaults identical, which the parity checks between them rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

PROVIDER_HELP = "onnxruntime provider: cpu, cuda (an error when no usable GPU) or auto (CUDA if usable, else CPU)."
SPEAKER_HELP = "ChatTTS speaker string, a file holding one, or 'random' (sampled with --seed). Default: none."
DECODER_HELP = "Mel from GPT hidden states (Decoder) or from the codes (DVAE)."
def provider_option(f: F) -> F:
    """Add --provider cpu|cuda|auto (resolved by chattts_forge.runtime.providers)."""
    # A plain string checked by the runtime (not click.Choice): a bad value is the project's one-line
    # `error:` like every other bad input, not click's usage block.
    return click.option("--provider", default="cpu", show_default=True, help=PROVIDER_HELP)(f)
