"""The library behind `chattts-forge synth` and `warm`: a `SynthConfig` / `WarmConfig` (one field per
command-line option, ChatTTS's defaults) in, WAV files / a phrase cache out.

    from chattts_forge.runtime.synth import SynthConfig, synthesize_to_files
    synthesize_to_files(SynthConfig(artifact=Path("build/artifacts/fp32"), out=Path("a.wav"), text="你好。",
                                    seed=0, refine=False))

The command line maps its options onto these configs (runtime/cli.py); every check and log line is
here, so a library caller gets the same one-line errors and the same files.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import soundfile as sf

from chattts_forge import chattts_defaults
from chattts_forge.chattts_defaults import CodeKnobs
from chattts_forge.choices import plain
from chattts_forge.cli_options import DECODER_HELP, PROVIDER_HELP, SPEAKER_HELP
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import atomic_write_bytes, atomic_write_text, fsync_dir, fsync_file
from chattts_forge.integrity import VerifyMode, check_verify_mode
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.options import option, parse_declared_choices
from chattts_forge.runtime.audio import (
    SampleFormat,
    check_sample_format,
    pcm16_wav_header,
    read_wav,
    to_int16,
    write_wav,
)
from chattts_forge.runtime.chattts_speaker import (
    DEFAULT_MAX_SPEAKER_VALUES,
    max_encoded_chars,
    speaker_vector,
)
from chattts_forge.runtime.generation import GptEngine
from chattts_forge.runtime.params import Language
from chattts_forge.runtime.phrase_cache_build import build_phrase_cache
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, RefineTextParams, SynthParams
from chattts_forge.runtime.providers import Provider
from chattts_forge.runtime.router import ROUTING_NAME, Router
from chattts_forge.runtime.stream_decode import STREAM_LOOKAHEAD_HELP, parse_stream_lookahead
from chattts_forge.runtime.textfront import TextFront

log = get_logger(__name__)


def _max_new_token_option() -> Any:
    """synth's and warm's --max-new-token (CodeKnobs leaves it to each command)."""
    return option(
        chattts_defaults.CODE_MAX_NEW_TOKEN, "--max-new-token", "Most code steps.", kind=int, show_default=True,
        kw_only=True)


def _prompt_option() -> Any:
    """synth's and warm's --prompt (CodeKnobs leaves it to each command)."""
    return option(
        chattts_defaults.CODE_PROMPT, "--prompt", "Code prompt (speed/oral/laugh/break tags).", show_default=True,
        kw_only=True)


def _provider_option() -> Any:
    """synth's and warm's --provider: a Provider, spelled as a plain string on the command line (not a
    click.Choice) so that a bad value is the project's one-line error, as serve's and bench's are."""
    return option(Provider.CPU, "--provider", PROVIDER_HELP, show_default=True, parsed_as=Provider)


class StreamLookaheadParam(click.ParamType):
    """`--stream-lookahead exact|N` (synth, bench): "exact" or a whole number of mel frames >= 1."""

    name = "exact|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        try:
            return parse_stream_lookahead(value, "--stream-lookahead")
        except ForgeError as e:
            self.fail(str(e), param, ctx)

@dataclass(frozen=True)
class SynthConfig(CodeKnobs):
    """One `synth` run: what `chattts-forge synth --help` documents, one field per option.

    `seed` defaults to 0 (as `warm` and `serve`): a plain run gives the same audio every time, as
    ChatTTS does in a fresh process (torch's fixed initial seed), and a phrase cache warmed with the
    defaults serves it. `cache_path` never changes a knob: a text whose request the cache holds is
    served from it, any other is synthesized as usual."""

    artifact: Path = option(
        MISSING, "--artifact", "Artifact folder, or a published version folder (artifacts/<model>/<version>) whose "
        "routing.json sends each text to its length bucket's variant.", kind="path")
    out: Path = option(
        MISSING, "--out", "Output WAV. With several texts: OUT_000.wav, OUT_001.wav, ... beside it, or DIR/000.wav ... "
        "when OUT is a folder (existing, or ending in '/').", kind="path")
    text: str | None = option(None, "--text", "Text to speak (one utterance).")
    batch_file: Path | None = option(
        None, "--batch-file", "UTF-8 file, one text per line, synthesized as one batch (shared GPT steps).",
        kind="path")
    variant: str | None = option(None, "--variant", "With a version folder: send every text to this published variant.")
    autotune: bool | None = option(
        None, "--autotune/--no-autotune", "With a version folder: rank each bucket's gate-passing variants on this "
        "machine at first load (a few seconds, cached under $XDG_CACHE_HOME/chattts-forge/autotune), or take the "
        "build's ranking. Default: on, unless CHATTTS_FORGE_AUTOTUNE=0.")
    cache_path: Path | None = option(
        None, "--cache", "Phrase cache (chattts-forge warm): cached texts skip the code stage and the Decoder.",
        kind="path")
    seed: int | None = option(
        0, "--seed", "Seed of sampling and refinement (and of --speaker random); the default is warm's and serve's.",
        kind=int, show_default=True)
    speaker: str | None = option(None, "--speaker", SPEAKER_HELP)
    speaker_out: Path | None = option(
        None, "--speaker-out",
        "Write the speaker string used (--speaker's, else the spk_smp string made from --speaker-audio).", kind="path")
    speaker_audio: Path | None = option(
        None, "--speaker-audio", "Clone the voice of a recording (mono, 24 kHz, any format soundfile reads): ChatTTS's "
        "sample_audio_speaker, run by the artifact's dvae_encoder.onnx, gives the spk_smp prompt.", kind="path")
    speaker_text: str | None = option(
        None, "--speaker-text", "Transcript of --speaker-audio (ChatTTS's txt_smp; recommended).")
    # the code knobs (temperature, top_p, top_k, repetition_penalty, min_new_token): CodeKnobs; synth
    # spells its own --max-new-token and --prompt
    max_new_token: int = _max_new_token_option()
    prompt: str = _prompt_option()
    refine: bool = option(
        True, "--refine/--no-refine", "Refine the text with the GPT's text head first.", show_default=True)
    use_decoder: bool = option(True, "--decoder/--dvae", DECODER_HELP, show_default=True)
    codes_out: Path | None = option(
        None, "--codes-out",
        "Save the audio codes as an int64 .npy array [steps, 4] (numbered like --out for several texts).", kind="path")
    stream: bool = option(False, "--stream", "Decode while generating (every --stream-batch steps).", is_flag=True)
    stream_batch: int = option(
        chattts_defaults.STREAM_BATCH, "--stream-batch", "Steps between stream chunks.", kind=int, show_default=True)
    # "exact", mel frames, or None: the artifact's recorded one
    stream_lookahead: int | str | None = option(
        None, "--stream-lookahead", STREAM_LOOKAHEAD_HELP, kind=StreamLookaheadParam())
    split_sentences: bool = option(
        False, "--split-sentences", "Split each text into sentences like ChatTTS and join the audio.", is_flag=True)
    text_normalization: bool = option(
        True, "--text-normalization/--no-text-normalization", "Speak numbers, money, dates and symbols as words and "
        "cut a long text into segments (`chattts-forge normalize` shows the result); off: ChatTTS's own front end "
        "exactly.", show_default=True)
    batch_size: int = option(8, "--batch-size", "Texts of --batch-file generated together.", kind=int, show_default=True)
    engine: GptEngine = option(
        GptEngine.AUTO, "--engine",
        "GPT step: fast (gpt_fast.onnx, in-place KV cache), plain (gpt.onnx), auto (fast if present).",
        choices=GptEngine, show_default=True, noun="GPT engine")
    provider: Provider = _provider_option()
    threads: int | None = option(None, "--threads", "onnxruntime intra-op threads (default: all cores).", kind=int)
    public_key: Path | None = option(
        None, "--public-key",
        "PEM public key: the published folder's model.sig (and a version folder's) must verify with it.", kind="file")
    verify: VerifyMode = option(
        VerifyMode.SHA256, "--verify", "How the artifact's files are checked before use: sha256 (each hashed once, then "
        "cached), full (hashed on every load), size (sizes only: the opt-out), none.", choices=VerifyMode,
        show_default=True)
    sample_format: SampleFormat = option(
        SampleFormat.FLOAT32, "--sample-format",
        "WAV samples: float32 (exact), or 16-bit PCM as the server's wav (round(x * 32768)).",
        choices=SampleFormat, show_default=True)

    def __post_init__(self) -> None:
        # verify and sample format first: their own checks (verify's aliases, their messages)
        object.__setattr__(self, "verify", VerifyMode(check_verify_mode(self.verify)))
        object.__setattr__(self, "sample_format", SampleFormat(check_sample_format(self.sample_format)))
        parse_declared_choices(self)


@dataclass(frozen=True)
class WarmConfig(CodeKnobs):
    """One `warm` run: a phrase list pre-synthesized into a phrase cache (`chattts-forge warm --help`).
    Each field is declared as its option (chattts_forge.options): the command's click options and the
    build driver's warm step words come from here."""

    artifact: Path = option(
        MISSING, "--artifact", "Artifact folder, or a published version folder (each phrase goes to the variant its "
        "routing.json names).", kind="path")
    phrases: Path = option(MISSING, "--phrases", "UTF-8 phrase list, one per line.", kind="path")
    out: Path = option(MISSING, "--out", "Cache file to write.", kind="path")
    seed: int = option(0, "--seed", "Seed of sampling (and of --speaker random).", kind=int, show_default=True)
    speaker: str | None = option(None, "--speaker", SPEAKER_HELP)
    # the code knobs: CodeKnobs (warm spells its own --max-new-token and --prompt)
    max_new_token: int = _max_new_token_option()
    prompt: str = _prompt_option()
    use_decoder: bool = option(True, "--decoder/--dvae", DECODER_HELP, show_default=True)
    refine: bool = option(
        True, "--refine/--no-refine",
        "Refine each phrase with the GPT's text head first (synth's default; recorded in the cache).",
        show_default=True)
    engine: GptEngine = option(GptEngine.AUTO, "--engine", choices=GptEngine, show_default=True, noun="GPT engine")
    provider: Provider = _provider_option()
    threads: int | None = option(None, "--threads", "onnxruntime intra-op threads (default: all cores).", kind=int)

    def __post_init__(self) -> None:
        parse_declared_choices(self)


@dataclass(frozen=True)
class NormalizeConfig:
    """One `normalize` run: the text the model receives for `text` or `file` (`chattts-forge normalize --help`)."""

    text: str | None = option(None, "--text", "The text (as a client would send it).")
    file: Path | None = option(
        None, "--file", "A UTF-8 file whose whole content is one text (newlines end sentences).", kind="path")
    artifact: Path | None = option(
        None, "--artifact", "Apply this artifact's homophone map too (an artifact folder or a published version "
        "folder); without it, no homophone is replaced.", kind="path")
    lang: Language | None = option(None, "--lang", "The text's language (default: detected).", choices=Language,
                                   noun="language")
    text_normalization: bool = option(
        True, "--text-normalization/--no-text-normalization",
        "Off: ChatTTS's own front end exactly (digits, currency signs and ? are deleted).", show_default=True)

    def __post_init__(self) -> None:
        parse_declared_choices(self)


def spoken_segments(cfg: NormalizeConfig) -> tuple[list[str], str]:
    """(the segments the model receives for `cfg`'s text, the characters removed as unspeakable)."""
    if (cfg.text is None) == (cfg.file is None):
        raise BadInput("give exactly one of --text or --file")
    if cfg.file is not None:
        try:
            text = cfg.file.read_text(encoding="utf-8").lstrip("\ufeff")
        except FileNotFoundError:
            raise NotFound(f"--file {cfg.file} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"--file {cfg.file} is not a readable UTF-8 text file ({type(e).__name__})") from None
    else:
        text = cfg.text or ""
    params = SynthParams(lang=plain(cfg.lang), text_normalization=cfg.text_normalization)
    if cfg.artifact is None:
        front = TextFront.without_artifact()
    elif (cfg.artifact / ROUTING_NAME).is_file():
        front = Router(cfg.artifact, autotune=False).front
    else:
        front = TextFront.open(cfg.artifact)
    # what was removed is this command's own report on stderr: ChatTTS's warning would repeat it
    with quiet_logger("chattts_forge.runtime.chattts_text"):
        return front.segments(text, params)


def read_batch_file(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise NotFound(f"--batch-file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"--batch-file {path} is unreadable: {e}") from None
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise BadInput(f"--batch-file {path} has no text lines")
    return texts


def resolve_speaker(speaker: str | None, seed: int | None, pipe) -> str | None:
    if speaker is None:
        return None
    value = speaker.strip()
    if value.lower() == "random":
        return pipe.random_speaker(seed)
    p = Path(value)
    if len(value) < 256 and p.is_file():
        limit = 4 * max_encoded_chars(2 * DEFAULT_MAX_SPEAKER_VALUES)  # bytes of UTF-8: 3 a character + room
        if p.stat().st_size > limit:
            raise BadInput(f"--speaker file {p} has {p.stat().st_size} bytes; a speaker string is far shorter")
        try:
            value = p.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"--speaker file {p} is not a readable UTF-8 text file ({type(e).__name__})") from None

    speaker_vector(value, pipe.dims.hidden_size)  # validates: one-line ForgeError if malformed
    return value


def output_paths(out: Path, count: int, suffix: str) -> list[Path]:
    """One path per text: `out` itself for one text; `DIR/NNN.wav` when `out` is a folder (existing,
    or written with a trailing slash); else `STEM_NNN.wav` beside `out`."""
    if count == 1 and not (out.is_dir() or str(out).endswith(os.sep)):
        return [out]
    if out.is_dir() or str(out).endswith(os.sep):
        return [out / f"{i:03d}{suffix}" for i in range(count)]
    return [out.with_name(f"{out.stem}_{i:03d}{out.suffix or suffix}") for i in range(count)]


def write_codes(path: Path, codes: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, np.asarray(codes, dtype=np.int64))
    atomic_write_bytes(path, buf.getvalue())


class StreamingWav:
    """A mono WAV (float32, or 16-bit PCM) written chunk by chunk into a temp file, renamed into place on
    commit. 16-bit samples are quantized as the server's (`to_int16`), so both write the same samples."""

    def __init__(self, path: Path, sample_rate: int, sample_format: str = "float32") -> None:
        self.path = path
        self.sample_format = check_sample_format(sample_format)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        self.sample_rate = sample_rate
        if sample_format == "pcm16":  # the header's sizes are written on commit, once they are known
            self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed by commit/abort
            self.f.write(pcm16_wav_header(sample_rate, 0))
        else:
            self.f = sf.SoundFile(self.tmp, "w", samplerate=sample_rate, channels=1, format="WAV", subtype="FLOAT")
        self.samples = 0

    def write(self, chunk: np.ndarray) -> None:
        if len(chunk):
            if self.sample_format == "pcm16":
                self.f.write(to_int16(chunk).tobytes())
            else:
                self.f.write(np.asarray(chunk, dtype=np.float32))
            self.samples += len(chunk)

    def commit(self) -> None:
        if self.sample_format == "pcm16":
            self.f.seek(0)
            self.f.write(pcm16_wav_header(self.sample_rate, 2 * self.samples))
        self.f.close()
        fsync_file(self.tmp)
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def _check_texts(cfg: SynthConfig) -> list[str]:
    """The texts to speak, after the checks that need no artifact (one-line errors naming the option)."""
    if (cfg.text is None) == (cfg.batch_file is None):
        raise BadInput("give exactly one of --text or --batch-file")
    if cfg.text is not None and not cfg.text.strip():
        raise BadInput("--text is empty")
    texts = [cfg.text] if cfg.text is not None else read_batch_file(cfg.batch_file)  # type: ignore[arg-type]
    if cfg.batch_size < 1:
        raise BadInput(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.speaker_out is not None and cfg.speaker is None and cfg.speaker_audio is None:
        raise BadInput("--speaker-out needs --speaker (a string, a file or 'random') or --speaker-audio")
    if cfg.speaker_text is not None and cfg.speaker_audio is None:
        raise BadInput("--speaker-text is the transcript of --speaker-audio: give --speaker-audio too")
    return texts


def open_target(cfg: SynthConfig) -> tuple[Router | None, Pipeline | None]:
    """A version folder's Router (with the pipeline of `--variant`, else None: each variant opens on its
    first text), or one artifact's Pipeline."""
    if cfg.cache_path is not None and cfg.stream:
        raise BadInput("--cache serves whole waveforms; it cannot be combined with --stream")
    runtime = {"provider": cfg.provider, "threads": cfg.threads, "engine": cfg.engine, "verify": cfg.verify,
               "public_key": cfg.public_key}
    if (cfg.artifact / ROUTING_NAME).is_file():
        router = Router(cfg.artifact, variant=cfg.variant, cache=cfg.cache_path, autotune=cfg.autotune, **runtime)
        if cfg.stream and cfg.variant is None:
            raise BadInput("--stream through a routing table needs --variant (one variant streams)")
        return router, router.pipeline(cfg.variant) if cfg.variant is not None else None
    if cfg.variant is not None:
        raise BadInput(f"--variant needs a version folder with {ROUTING_NAME}; {cfg.artifact} has none")
    if cfg.autotune is not None:
        raise BadInput(f"--autotune/--no-autotune choose among a version folder's variants; {cfg.artifact} has no "
                         f"{ROUTING_NAME}")
    return None, Pipeline(cfg.artifact, cache=cfg.cache_path, **runtime)


def synth_params(cfg: SynthConfig, front: TextFront | Pipeline,
                 voice_pipe: Callable[[], Pipeline]) -> tuple[SynthParams, str | None]:
    """The runtime's `SynthParams` for `cfg`, and the speaker string it uses (for --speaker-out:
    --speaker's, else the spk_smp string made from --speaker-audio). `front` draws and checks speaker
    strings; `voice_pipe()` is the pipeline whose DVAE encoder reads --speaker-audio (opened only then)."""
    spk = resolve_speaker(cfg.speaker, cfg.seed, front)
    spk_smp = None
    if cfg.speaker_audio is not None:
        pipe = voice_pipe()
        spk_smp = pipe.sample_audio_speaker(read_wav(cfg.speaker_audio, pipe.sample_rate, "--speaker-audio",
                                                     max_samples=pipe.max_recording_samples()))
        log.info("speaker sample from %s (%d characters)", cfg.speaker_audio, len(spk_smp))
    params = SynthParams(
        code=InferCodeParams(
            prompt=cfg.prompt, spk_emb=spk, spk_smp=spk_smp, txt_smp=cfg.speaker_text, temperature=cfg.temperature,
            top_p=cfg.top_p, top_k=cfg.top_k, repetition_penalty=cfg.repetition_penalty,
            max_new_token=cfg.max_new_token, min_new_token=cfg.min_new_token, stream_batch=cfg.stream_batch,
            seed=cfg.seed,
        ),
        refine=RefineTextParams(seed=cfg.seed) if cfg.refine else None,
        use_decoder=cfg.use_decoder,
        split_sentences=cfg.split_sentences,
        text_normalization=cfg.text_normalization,
    )
    return params, spk if spk is not None else spk_smp


def synthesize_to_files(cfg: SynthConfig) -> None:
    """`chattts-forge synth`: speak `cfg`'s texts into WAV files (and codes, the speaker string)."""
    texts = _check_texts(cfg)
    t0 = time.perf_counter()
    router, pipe = open_target(cfg)
    if router is not None and pipe is None:  # routed: the variants open on their first text
        params, speaker_used = synth_params(cfg, router.front, lambda: router.pipeline(router.front_variant))
    else:
        assert pipe is not None
        params, speaker_used = synth_params(cfg, pipe, lambda: pipe)
    wav_paths = output_paths(cfg.out, len(texts), ".wav")
    code_paths = output_paths(cfg.codes_out, len(texts), ".npy") if cfg.codes_out is not None else None
    if pipe is not None and pipe.cache is None and cfg.text_normalization:
        # the GPT session is built now (onnxruntime lets go of the GIL) while the text grammars are read
        # beside it (TextFront's preload), instead of one after the other
        _ = pipe.gpt
    front = router.front if router is not None else pipe.text  # type: ignore[union-attr]
    for i, text in enumerate(texts):
        segments, removed = front.segments(text, params)
        log.info("text %d speaks as %d segment(s): %s", i, len(segments), " | ".join(segments))
        if removed:
            log.warning("text %d: removed, cannot be spoken: %s", i, " ".join(removed))
    t1 = time.perf_counter()
    if cfg.stream:
        assert pipe is not None  # a stream runs one variant (open_target refuses a routed one)
        _stream_to_files(cfg, pipe, texts, params, wav_paths, code_paths, t1)
    else:
        _synthesize_to_files(cfg, router or pipe, texts, params, wav_paths, code_paths, t1 - t0)  # type: ignore[arg-type]
    if cfg.speaker_out is not None:
        assert speaker_used is not None
        atomic_write_text(cfg.speaker_out, speaker_used + "\n")
        log.info("wrote speaker string %s", cfg.speaker_out)
    if router is not None and router.tune_pending:  # the audio is written: measure this host for later loads
        log.info("autotune: this host has no measurement of %s yet: timing its passing variants now, after the "
                 "audio (once per host; --no-autotune skips it)", cfg.artifact)
        router.tune_deferred()


def _stream_to_files(cfg: SynthConfig, pipe: Pipeline, texts: list[str], params: SynthParams,
                     wav_paths: list[Path], code_paths: list[Path] | None, t1: float) -> None:
    writers = [StreamingWav(p, pipe.sample_rate, cfg.sample_format) for p in wav_paths]
    first_audio = None
    chunks = 0
    codes: list[np.ndarray] = []
    batch_size = cfg.batch_size
    try:
        for start in range(0, len(texts), batch_size):
            group = writers[start : start + batch_size]
            done = lambda gen: codes.extend(gen.ids)  # noqa: E731
            for chunk in pipe.stream(
                texts[start : start + batch_size], params, on_done=done,
                lookahead_frames=pipe.resolve_lookahead(cfg.stream_lookahead)
            ):
                chunks += 1
                for w, c in zip(group, chunk, strict=True):
                    w.write(c)
                if first_audio is None and any(len(c) for c in chunk):
                    first_audio = time.perf_counter() - t1
        for w in writers:
            w.commit()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    t2 = time.perf_counter()
    total = sum(w.samples for w in writers)
    log.info(
        "streamed %d chunks, first audio after %.2f s; %.2f s of audio in %.2f s",
        chunks, first_audio or 0.0, total / pipe.sample_rate, t2 - t1,
    )
    for p, w in zip(wav_paths, writers, strict=True):
        log.info("wrote %s (%.2f s)", p, w.samples / pipe.sample_rate)
    if code_paths is not None:
        for p, c in zip(code_paths, codes, strict=True):
            write_codes(p, c)
            log.info("wrote codes %s: shape %s", p, tuple(c.shape))


def _synthesize_to_files(cfg: SynthConfig, target: Router | Pipeline, texts: list[str],
                         params: SynthParams, wav_paths: list[Path], code_paths: list[Path] | None,
                         load_s: float) -> None:
    t1 = time.perf_counter()
    results = []
    for start in range(0, len(texts), cfg.batch_size):
        results += target.synthesize(texts[start : start + cfg.batch_size], params, whole=True)
    t2 = time.perf_counter()
    if cfg.cache_path is not None:
        log.info("phrase cache %s: %d of %d text(s) served from it", cfg.cache_path, sum(r.cached for r in results),
                 len(results))
    steps = max(len(r.codes) for r in results)
    for i, r in enumerate(results):
        if len(r.wav) == 0:
            raise BadInput(f"text {i} produced no audio (the model ended at once); try --min-new-token")
        write_wav(wav_paths[i], r.wav, r.sample_rate, cfg.sample_format)
        log.info("wrote %s: %.2f s of audio, %d code steps", wav_paths[i], len(r.wav) / r.sample_rate, len(r.codes))
        if code_paths is not None:
            write_codes(code_paths[i], r.codes)
            log.info("wrote codes %s: shape %s", code_paths[i], tuple(r.codes.shape))
    audio_s = sum(len(r.wav) / r.sample_rate for r in results)
    log.info(
        "load %.2f s, synthesis %.2f s (%d steps, %.1f ms/step incl. decode), RTF %.2f",
        load_s, t2 - t1, steps, 1000 * (t2 - t1) / max(steps, 1), (t2 - t1) / max(audio_s, 1e-9),
    )
    opened = target.opened() if isinstance(target, Router) else {target.artifact.variant: target}
    signed = f"; model.sig verified with {cfg.public_key}" if cfg.public_key is not None else ""
    for variant, pipe in sorted(opened.items()):
        log.info("checked before loading %s: %s%s", variant, pipe.artifact.verification.summary(), signed)


def warm_phrase_cache(cfg: WarmConfig) -> dict[str, Any]:
    """`chattts-forge warm`: pre-synthesize `cfg.phrases` into the phrase cache `cfg.out`; its summary."""
    t0 = time.perf_counter()
    kwargs = {"provider": cfg.provider, "threads": cfg.threads, "engine": cfg.engine}
    artifact = cfg.artifact
    front = Router(artifact, autotune=False, **kwargs).front if (artifact / ROUTING_NAME).is_file() else Pipeline(artifact, **kwargs)
    spk = resolve_speaker(cfg.speaker, cfg.seed, front)
    params = SynthParams(
        code=InferCodeParams(
            prompt=cfg.prompt, spk_emb=spk, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            repetition_penalty=cfg.repetition_penalty, max_new_token=cfg.max_new_token,
            min_new_token=cfg.min_new_token, seed=cfg.seed,
        ),
        refine=RefineTextParams(seed=cfg.seed) if cfg.refine else None,  # synth's refinement, as synth does
        use_decoder=cfg.use_decoder,
    )
    summary = build_phrase_cache(artifact, cfg.phrases, cfg.out, params, **kwargs)
    per_variant = ", ".join(f"{v}: {n}" for v, n in summary["variants"].items())
    log.info("wrote phrase cache %s: %d phrases (%s), %.1f MB in %.1f s", summary["path"], summary["phrases"],
             per_variant, summary["bytes"] / 1e6, time.perf_counter() - t0)
    return summary
