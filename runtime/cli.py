"""`chattts-forge synth` and `warm`: click commands that map their options onto a `SynthConfig` /
`WarmConfig` and call the library (`chattts_forge.runtime.synth`), which does the work."""

from __future__ import annotations

from typing import Any

import click

from chattts_forge.options import declared_options
from chattts_forge.runtime.synth import (
    NormalizeConfig,
    SynthConfig,
    WarmConfig,
    spoken_segments,
    synthesize_to_files,
    warm_phrase_cache,
)


@click.command("synth")
@declared_options(SynthConfig)  # every option, declared once on its field (runtime/synth.py)
def synth(**options: Any) -> None:
    """Synthesize speech from an ONNX artifact (no torch), as ChatTTS would.

    Defaults are ChatTTS's InferCodeParams / RefineTextParams, seed 0. The WAV is mono, 24 kHz, float32
    (--sample-format pcm16: 16-bit PCM, the server's `wav`, which Python's `wave` and every player read).
    Text is normalised like ChatTTS: characters it cannot speak are dropped with a warning; text
    left with nothing speakable, empty text or input longer than the model's 4096 positions
    (prompt + --max-new-token) is an error. Several texts (--batch-file) share the GPT steps in
    groups of --batch-size; each gets the audio it would get alone.

    \b
    Examples:
      chattts-forge synth --artifact build/artifacts/fp32 --text "你好。" --out a.wav
      chattts-forge synth --artifact A --text "Hi." --seed 0 --no-refine --temperature 1e-9 \\
          --codes-out codes.npy --out a.wav
      chattts-forge synth --artifact A --batch-file lines.txt --out out/ --stream
      chattts-forge synth --artifact A --text "Hi." --speaker-audio me.wav --speaker-text "what I said" --out a.wav
      chattts-forge synth --artifact artifacts/M/v1 --text "请稍等" \\
          --cache artifacts/M/v1/phrase_cache.bin --out a.wav
    """
    synthesize_to_files(SynthConfig(**options))


@click.command("normalize")
@declared_options(NormalizeConfig)  # declared once on its fields (runtime/synth.py)
def normalize(**options: Any) -> None:
    """Print exactly the text the model receives: one segment per line on stdout, nothing else.

    Numbers, money, dates, times, phone numbers, units, operators, e-mails and URLs become words in
    the language around them (wetext); ? and ! end sentences, ; and : become pauses; ChatTTS's
    control tags ([uv_break], [laugh], [speed_5], ...) pass through. A long text is cut at sentence
    ends, then clause marks, then spaces into segments of at most ~20 s of speech. What cannot be
    spoken is removed and listed on stderr.

    \b
    Examples:
      chattts-forge normalize --text "转人工请按 0"
      chattts-forge normalize --file letter.txt --artifact artifacts/M/v1
    """
    segments, removed = spoken_segments(NormalizeConfig(**options))
    for seg in segments:
        click.echo(seg)
    if removed:
        click.echo("removed (cannot be spoken): " + " ".join(removed), err=True)


@click.command("warm")
@declared_options(WarmConfig)  # every option, declared once on its field (runtime/synth.py)
def warm(**options: Any) -> None:
    """Pre-synthesize a phrase list into a phrase cache (for `synth --cache`, `Pipeline(cache=...)`).

    Each phrase's mel is stored, keyed by its normalised text, the whole request (speaker, prompt,
    sampling, token budget, seed, refinement and its knobs, Decoder/DVAE) and the artifact's payload
    hash. The defaults are synth's and serve's, so their default requests are served from it; a
    request with other knobs is synthesized as usual. Blank and duplicate lines are skipped with a
    warning naming the line; a line with nothing speakable is an error naming the line.

    \b
    Example:
      chattts-forge warm --artifact artifacts/M/v1 --phrases phrases.txt --out phrases.cache --seed 0
    """
    warm_phrase_cache(WarmConfig(**options))
