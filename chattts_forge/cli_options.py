"""Click options shared by several commands: ChatTTS sampling knobs (`reference`, `synth`) and the provider.

Both commands expose the knobs ChatTTS users know with ChatTTS's InferCodeParams defaults
(`chattts_forge.chattts_defaults`); one definition keeps their names and defaults identical, which
the parity checks between them rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from chattts_forge.chattts_defaults import (
    CODE_REPETITION_PENALTY,
    CODE_TEMPERATURE,
    MIN_NEW_TOKEN,
    TOP_K,
    TOP_P,
)

F = TypeVar("F", bound=Callable[..., Any])

_SAMPLING_OPTIONS = (
    click.option(
        "--speaker",
        default=None,
        help="ChatTTS speaker string, a file holding one, or 'random' (sampled with --seed). Default: none.",
    ),
    click.option(
        "--temperature", type=float, default=CODE_TEMPERATURE, show_default=True, help="Code sampling temperature."
    ),
    click.option("--top-p", "top_p", type=float, default=TOP_P, show_default=True, help="Top-p (keeps >= 3 tokens)."),
    click.option("--top-k", "top_k", type=int, default=TOP_K, show_default=True, help="Top-k (keeps >= 3 tokens)."),
    click.option(
        "--repetition-penalty",
        type=float,
        default=CODE_REPETITION_PENALTY,
        show_default=True,
        help="ChatTTS's windowed penalty.",
    ),
    click.option(
        "--min-new-token", type=int, default=MIN_NEW_TOKEN, show_default=True, help="EOS is masked before this."
    ),
    click.option(
        "--decoder/--dvae",
        "use_decoder",
        default=True,
        show_default=True,
        help="Mel from GPT hidden states (Decoder) or from the codes (DVAE).",
    ),
)


def sampling_options(f: F) -> F:
    """Add --speaker, --temperature, --top-p, --top-k, --repetition-penalty, --min-new-token and
    --decoder/--dvae (click applies decorators bottom-up, hence the reversed order)."""
    for option in reversed(_SAMPLING_OPTIONS):
        f = option(f)
    return f


def provider_option(f: F) -> F:
    """Add --provider cpu|cuda|auto (resolved by chattts_forge.runtime.providers)."""
    # A plain string checked by the runtime (not click.Choice): a bad value is the project's one-line
    # `error:` like every other bad input, not click's usage block.
    return click.option(
        "--provider",
        default="cpu",
        show_default=True,
        help="onnxruntime provider: cpu, cuda (an error when no usable GPU) or auto (CUDA if usable, else CPU).",
    )(f)
