"""`chattts-forge synth` and `warm`: click commands that map their options onto a `SynthConfig` /
`WarmConfig` and call the library (`chattts_forge.runtime.synth`), which does the work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chattts_forge.chattts_defaults import CODE_MAX_NEW_TOKEN, CODE_PROMPT
from chattts_forge.cli_options import provider_option, sampling_options
from chattts_forge.errors import ForgeError
from chattts_forge.options import declared_options
from chattts_forge.runtime.stream_decode import STREAM_LOOKAHEAD_HELP, parse_stream_lookahead
from chattts_forge.runtime.synth import WarmConfig


class StreamLookaheadParam(click.ParamType):
    """`--stream-lookahead exact|N` (synth, bench): "exact" or a whole number of mel frames >= 1."""

    name = "exact|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        try:
            return parse_stream_lookahead(value, "--stream-lookahead")
        except ForgeError as e:
            self.fail(str(e), param, ctx)


@click.command("synth")
@click.option(
    "--artifact",
    "artifact",
    required=True,
    type=click.Path(path_type=Path),
    help="Artifact folder, or a published version folder (artifacts/<model>/<version>) whose routing.json "
    "sends each text to its length bucket's variant.",
)
@click.option("--variant", default=None, help="With a version folder: send every text to this published variant.")
@click.option(
    "--autotune/--no-autotune",
    default=None,
    help="With a version folder: rank each bucket's gate-passing variants on this machine at first load "
    "(a few seconds, cached under $XDG_CACHE_HOME/chattts-forge/autotune), or take the build's ranking. "
    "Default: on, unless CHATTTS_FORGE_AUTOTUNE=0.",
)
@click.option(
    "--cache",
    "cache_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Phrase cache (chattts-forge warm): cached texts skip the code stage and the Decoder.",
)
@click.option("--text", "text", default=None, help="Text to speak (one utterance).")
@click.option(
    "--batch-file",
    type=click.Path(path_type=Path),
    default=None,
    help="UTF-8 file, one text per line, synthesized as one batch (shared GPT steps).",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    help="Output WAV. With several texts: OUT_000.wav, OUT_001.wav, ... beside it, or DIR/000.wav ... "
    "when OUT is a folder (existing, or ending in '/').",
)
@click.option("--sample-format", type=click.Choice(["float32", "pcm16"]), default="float32", show_default=True,
              help="WAV samples: float32 (exact), or 16-bit PCM as the server's wav (round(x * 32768)).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of sampling and refinement (and of --speaker random); the default is warm's and serve's.")
@click.option(
    "--speaker-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the speaker string used (--speaker's, else the spk_smp string made from --speaker-audio).",
)
@click.option(
    "--speaker-audio",
    type=click.Path(path_type=Path),
    default=None,
    help="Clone the voice of a recording (mono, 24 kHz, any format soundfile reads): ChatTTS's "
    "sample_audio_speaker, run by the artifact's dvae_encoder.onnx, gives the spk_smp prompt.",
)
@click.option(
    "--speaker-text", default=None, help="Transcript of --speaker-audio (ChatTTS's txt_smp; recommended)."
)
@sampling_options
@click.option("--max-new-token", type=int, default=CODE_MAX_NEW_TOKEN, show_default=True, help="Most code steps.")
@click.option("--prompt", default=CODE_PROMPT, show_default=True, help="Code prompt (speed/oral/laugh/break tags).")
@click.option(
    "--refine/--no-refine", default=True, show_default=True, help="Refine the text with the GPT's text head first."
)
@click.option(
    "--codes-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Save the audio codes as an int64 .npy array [steps, 4] (numbered like --out for several texts).",
)
@click.option("--text-normalization/--no-text-normalization", default=True, show_default=True,
              help="Speak numbers, money, dates and symbols as words and cut a long text into segments "
                   "(`chattts-forge normalize` shows the result); off: ChatTTS's own front end exactly.")
@click.option("--stream", is_flag=True, help="Decode while generating (every --stream-batch steps).")
@click.option("--stream-batch", type=int, default=24, show_default=True, help="Steps between stream chunks.")
@click.option(
    "--stream-lookahead",
    type=StreamLookaheadParam(),
    default=None,
    help=STREAM_LOOKAHEAD_HELP,
)
@click.option(
    "--split-sentences", is_flag=True, help="Split each text into sentences like ChatTTS and join the audio."
)
@click.option(
    "--batch-size", type=int, default=8, show_default=True, help="Texts of --batch-file generated together."
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "fast", "plain"]),
    default="auto",
    show_default=True,
    help="GPT step: fast (gpt_fast.onnx, in-place KV cache), plain (gpt.onnx), auto (fast if present).",
)
@provider_option
@click.option("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all cores).")
@click.option(
    "--public-key",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="PEM public key: the published folder's model.sig (and a version folder's) must verify with it.",
)
@click.option(
    "--verify",
    "verify",
    type=click.Choice(["sha256", "full", "size", "none"]),
    default="sha256",
    show_default=True,
    help="How the artifact's files are checked before use: sha256 (each hashed once, then cached), full "
    "(hashed on every load), size (sizes only: the opt-out), none.",
)
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
    from chattts_forge.runtime.synth import SynthConfig, synthesize_to_files

    synthesize_to_files(SynthConfig(**options))


@click.command("normalize")
@click.option("--text", "text", default=None, help="The text (as a client would send it).")
@click.option("--file", "file", type=click.Path(path_type=Path), default=None,
              help="A UTF-8 file whose whole content is one text (newlines end sentences).")
@click.option("--artifact", type=click.Path(path_type=Path), default=None,
              help="Apply this artifact's homophone map too (an artifact folder or a published version folder); "
                   "without it, no homophone is replaced.")
@click.option("--lang", type=click.Choice(["zh", "en"]), default=None, help="The text's language (default: detected).")
@click.option("--text-normalization/--no-text-normalization", default=True, show_default=True,
              help="Off: ChatTTS's own front end exactly (digits, currency signs and ? are deleted).")
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
    from chattts_forge.runtime.synth import NormalizeConfig, spoken_segments

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
    from chattts_forge.runtime.synth import warm_phrase_cache

    warm_phrase_cache(WarmConfig(**options))
