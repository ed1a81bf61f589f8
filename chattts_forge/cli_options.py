"""Click options shared by several commands: ChatTTS sampling knobs (`reference`, `synth`, `warm`), and the
help of those every runtime command spells (the provider, the speaker, Decoder or DVAE).

The commands expose the knobs ChatTTS users know with ChatTTS's InferCodeParams defaults, declared
once on `chattts_defaults.CodeKnobs` (the base of their configs); one definition keeps their names
and defaults identical, which the parity checks between them rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from chattts_forge.chattts_defaults import CodeKnobs
from chattts_forge.options import declared_options

F = TypeVar("F", bound=Callable[..., Any])

PROVIDER_HELP = "onnxruntime provider: cpu, cuda (an error when no usable GPU) or auto (CUDA if usable, else CPU)."
SPEAKER_HELP = "ChatTTS speaker string, a file holding one, or 'random' (sampled with --seed). Default: none."
DECODER_HELP = "Mel from GPT hidden states (Decoder) or from the codes (DVAE)."
_SPEAKER_OPTION = click.option("--speaker", default=None, help=SPEAKER_HELP)
_DECODER_OPTION = click.option("--decoder/--dvae", "use_decoder", default=True, show_default=True, help=DECODER_HELP)


def sampling_options(f: F) -> F:
    """Add --speaker, --temperature, --top-p, --top-k, --repetition-penalty, --min-new-token and
    --decoder/--dvae (click applies decorators bottom-up, hence the reversed order)."""
    return _SPEAKER_OPTION(declared_options(CodeKnobs)(_DECODER_OPTION(f)))
