"""`chattts-forge synth`: speech from an ONNX artifact with the torch-free runtime."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import click
import numpy as np

from chattts_forge.cli_options import provider_option, sampling_options
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes, atomic_write_text, fsync_dir, fsync_file
from chattts_forge.log import get_logger

log = get_logger(__name__)


def _read_batch_file(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ForgeError(f"--batch-file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ForgeError(f"--batch-file {path} is unreadable: {e}") from None
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise ForgeError(f"--batch-file {path} has no text lines")
    return texts


def _resolve_speaker(speaker: str | None, seed: int | None, pipe) -> str | None:
    if speaker is None:
        return None
    value = speaker.strip()
    if value.lower() == "random":
        return pipe.random_speaker(seed)
    p = Path(value)
    if len(value) < 256 and p.is_file():
        from chattts_forge.runtime.frontend import DEFAULT_MAX_SPEAKER_VALUES, max_encoded_chars

        limit = 4 * max_encoded_chars(2 * DEFAULT_MAX_SPEAKER_VALUES)  # bytes of UTF-8: 3 a character + room
        if p.stat().st_size > limit:
            raise ForgeError(f"--speaker file {p} has {p.stat().st_size} bytes; a speaker string is far shorter")
        try:
            value = p.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ForgeError(f"--speaker file {p} is not a readable UTF-8 text file ({type(e).__name__})") from None
    from chattts_forge.runtime.frontend import speaker_vector

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


def _write_codes(path: Path, codes: np.ndarray) -> None:
    import io

    buf = io.BytesIO()
    np.save(buf, np.asarray(codes, dtype=np.int64))
    atomic_write_bytes(path, buf.getvalue())


class _StreamingWav:
    """A float32 WAV written chunk by chunk into a temp file, renamed into place on close."""

    def __init__(self, path: Path, sample_rate: int) -> None:
        import soundfile as sf

        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        self.f = sf.SoundFile(self.tmp, "w", samplerate=sample_rate, channels=1, format="WAV", subtype="FLOAT")
        self.samples = 0

    def write(self, chunk: np.ndarray) -> None:
        if len(chunk):
            self.f.write(np.asarray(chunk, dtype=np.float32))
            self.samples += len(chunk)

    def commit(self) -> None:
        self.f.close()
        fsync_file(self.tmp)
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def _knobs_from_cache(cache_path: Path, num_vq: int, given: dict[str, object]) -> dict[str, object]:
    """`synth --cache`: the knobs not given on the command line take the cache's (the ones `warm` used),
    so a plain `synth --cache` is served from it, as a request that sets nothing is by `serve`. Knobs
    given explicitly win (a request the cache cannot serve is then a miss, synthesized as usual)."""
    from click.core import ParameterSource

    from chattts_forge.runtime.phrase_cache import PhraseCache, replay_params

    cache = PhraseCache(cache_path)
    try:
        cached = replay_params(cache.knobs, num_vq)
    except ForgeError as e:  # e.g. a speaker known only by its hash: synth's own defaults stay
        log.info("phrase cache %s: its knobs are not synth's defaults here (%s)", cache_path, e)
        return given
    finally:
        cache.close()
    code = cached.code
    theirs = {"seed": code.seed, "temperature": code.temperature, "top_p": code.top_p, "top_k": code.top_k,
              "repetition_penalty": code.repetition_penalty, "max_new_token": code.max_new_token,
              "min_new_token": code.min_new_token, "prompt": code.prompt, "refine": False,
              "use_decoder": cached.use_decoder}
    ctx = click.get_current_context()
    out = dict(given)
    taken = []
    for name, value in theirs.items():
        if ctx.get_parameter_source(name) == ParameterSource.DEFAULT and out[name] != value:
            out[name] = value
            taken.append(f"{name}={value!r}")
    if taken:
        log.info("phrase cache %s: knobs not given take the cache's: %s", cache_path, ", ".join(taken))
    return out


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
@click.option("--seed", type=int, default=None, help="Seed of sampling (and of --speaker random).")
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
@click.option("--max-new-token", type=int, default=2048, show_default=True, help="Most code steps.")
@click.option("--prompt", default="[speed_5]", show_default=True, help="Code prompt (speed/oral/laugh/break tags).")
@click.option(
    "--refine/--no-refine", default=True, show_default=True, help="Refine the text with the GPT's text head first."
)
@click.option(
    "--codes-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Save the audio codes as an int64 .npy array [steps, 4] (numbered like --out for several texts).",
)
@click.option("--stream", is_flag=True, help="Decode while generating (every --stream-batch steps).")
@click.option("--stream-batch", type=int, default=24, show_default=True, help="Steps between stream chunks.")
@click.option(
    "--stream-lookahead",
    type=click.IntRange(min=0),
    default=None,
    help="Mel frames of right context to wait for before emitting audio (default: all the Decoder and "
    "Vocos need, so the stream equals the whole waveform; less starts sooner, inexact at chunk edges).",
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
def synth(
    artifact: Path,
    variant: str | None,
    autotune: bool | None,
    cache_path: Path | None,
    text: str | None,
    batch_file: Path | None,
    out: Path,
    seed: int | None,
    speaker: str | None,
    speaker_out: Path | None,
    speaker_audio: Path | None,
    speaker_text: str | None,
    temperature: float,
    top_p: float,
    top_k: int,
    repetition_penalty: float,
    max_new_token: int,
    min_new_token: int,
    prompt: str,
    refine: bool,
    use_decoder: bool,
    codes_out: Path | None,
    stream: bool,
    stream_batch: int,
    stream_lookahead: int | None,
    split_sentences: bool,
    batch_size: int,
    engine: str,
    provider: str,
    threads: int | None,
    public_key: Path | None,
    verify: str,
) -> None:
    """Synthesize speech from an ONNX artifact (no torch), as ChatTTS would.

    Defaults are ChatTTS's InferCodeParams / RefineTextParams. The WAV is float32, mono, 24 kHz.
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
      chattts-forge synth --artifact artifacts/M/v1 --text "请稍等" --seed 0 --no-refine \\
          --cache artifacts/M/v1/phrase_cache.bin --out a.wav
    """
    if (text is None) == (batch_file is None):
        raise ForgeError("give exactly one of --text or --batch-file")
    if text is not None and not text.strip():
        raise ForgeError("--text is empty")
    texts = [text] if text is not None else _read_batch_file(batch_file)
    if batch_size < 1:
        raise ForgeError(f"--batch-size must be >= 1, got {batch_size}")
    if speaker_out is not None and speaker is None and speaker_audio is None:
        raise ForgeError("--speaker-out needs --speaker (a string, a file or 'random') or --speaker-audio")
    if speaker_text is not None and speaker_audio is None:
        raise ForgeError("--speaker-text is the transcript of --speaker-audio: give --speaker-audio too")

    from chattts_forge.runtime.audio import write_wav
    from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, RefineTextParams, SynthParams
    from chattts_forge.runtime.router import ROUTING_NAME, Router

    if cache_path is not None and stream:
        raise ForgeError("--cache serves whole waveforms; it cannot be combined with --stream")
    t0 = time.perf_counter()
    router: Router | None = None
    if (artifact / ROUTING_NAME).is_file():
        router = Router(artifact, variant=variant, cache=cache_path, autotune=autotune, provider=provider,
                        threads=threads, engine=engine, verify=verify, public_key=public_key)
        if stream and variant is None:
            raise ForgeError("--stream through a routing table needs --variant (one variant streams)")
        pipe = router.pipeline(variant) if variant is not None else router.front
    else:
        if variant is not None:
            raise ForgeError(f"--variant needs a version folder with {ROUTING_NAME}; {artifact} has none")
        if autotune is not None:
            raise ForgeError(f"--autotune/--no-autotune choose among a version folder's variants; {artifact} has no "
                             f"{ROUTING_NAME}")
        pipe = Pipeline(artifact, provider=provider, threads=threads, engine=engine, cache=cache_path, verify=verify,
                        public_key=public_key)
    if cache_path is not None:
        knobs = _knobs_from_cache(cache_path, pipe.num_vq, {
            "seed": seed, "temperature": temperature, "top_p": top_p, "top_k": top_k,
            "repetition_penalty": repetition_penalty, "max_new_token": max_new_token, "min_new_token": min_new_token,
            "prompt": prompt, "refine": refine, "use_decoder": use_decoder})
        seed, temperature, top_p, top_k = knobs["seed"], knobs["temperature"], knobs["top_p"], knobs["top_k"]
        repetition_penalty, max_new_token = knobs["repetition_penalty"], knobs["max_new_token"]
        min_new_token, prompt, refine, use_decoder = (knobs["min_new_token"], knobs["prompt"], knobs["refine"],
                                                      knobs["use_decoder"])
    spk = _resolve_speaker(speaker, seed, pipe)
    spk_smp = None
    if speaker_audio is not None:
        from chattts_forge.runtime.audio import read_wav

        spk_smp = pipe.sample_audio_speaker(read_wav(speaker_audio, pipe.sample_rate, "--speaker-audio",
                                                 max_samples=pipe.max_recording_samples()))
        log.info("speaker sample from %s (%d characters)", speaker_audio, len(spk_smp))
    params = SynthParams(
        code=InferCodeParams(
            prompt=prompt,
            spk_emb=spk,
            spk_smp=spk_smp,
            txt_smp=speaker_text,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
            max_new_token=max_new_token,
            min_new_token=min_new_token,
            stream_batch=stream_batch,
            seed=seed,
        ),
        refine=RefineTextParams(seed=seed) if refine else None,
        use_decoder=use_decoder,
        split_sentences=split_sentences,
    )
    wav_paths = output_paths(out, len(texts), ".wav")
    code_paths = output_paths(codes_out, len(texts), ".npy") if codes_out is not None else None
    t1 = time.perf_counter()
    if stream:
        writers = [_StreamingWav(p, pipe.sample_rate) for p in wav_paths]
        first_audio = None
        chunks = 0
        codes: list[np.ndarray] = []
        try:
            for start in range(0, len(texts), batch_size):
                group = writers[start : start + batch_size]
                done = lambda gen: codes.extend(gen.ids)  # noqa: E731
                for chunk in pipe.stream(
                    texts[start : start + batch_size], params, on_done=done, lookahead_frames=stream_lookahead
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
                _write_codes(p, c)
                log.info("wrote codes %s: shape %s", p, tuple(c.shape))
    else:
        results = []
        for start in range(0, len(texts), batch_size):
            results += (router or pipe).synthesize(texts[start : start + batch_size], params)
        t2 = time.perf_counter()
        if cache_path is not None:
            log.info("phrase cache %s: %d of %d text(s) served from it", cache_path, sum(r.cached for r in results),
                     len(results))
        steps = max(len(r.codes) for r in results)
        for i, r in enumerate(results):
            if len(r.wav) == 0:
                raise ForgeError(f"text {i} produced no audio (the model ended at once); try --min-new-token")
            write_wav(wav_paths[i], r.wav, r.sample_rate)
            log.info("wrote %s: %.2f s of audio, %d code steps", wav_paths[i], len(r.wav) / r.sample_rate, len(r.codes))
            if code_paths is not None:
                _write_codes(code_paths[i], r.codes)
                log.info("wrote codes %s: shape %s", code_paths[i], tuple(r.codes.shape))
        audio_s = sum(len(r.wav) for r in results) / pipe.sample_rate
        log.info(
            "load %.2f s, synthesis %.2f s (%d steps, %.1f ms/step incl. decode), RTF %.2f",
            t1 - t0, t2 - t1, steps, 1000 * (t2 - t1) / max(steps, 1), (t2 - t1) / max(audio_s, 1e-9),
        )
        log.info("checked before loading: %s%s", pipe.artifact.verification.summary(),
                 f"; model.sig verified with {public_key}" if public_key is not None else "")
    if speaker_out is not None:
        used = spk if spk is not None else spk_smp  # --speaker's string, else --speaker-audio's spk_smp
        assert used is not None
        atomic_write_text(speaker_out, used + "\n")
        log.info("wrote speaker string %s", speaker_out)


@click.command("warm")
@click.option(
    "--artifact",
    required=True,
    type=click.Path(path_type=Path),
    help="Artifact folder, or a published version folder (each phrase goes to the variant its routing.json names).",
)
@click.option("--phrases", required=True, type=click.Path(path_type=Path), help="UTF-8 phrase list, one per line.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Cache file to write.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of sampling (and of --speaker random).")
@sampling_options
@click.option("--max-new-token", type=int, default=2048, show_default=True, help="Most code steps.")
@click.option("--prompt", default="[speed_5]", show_default=True, help="Code prompt (speed/oral/laugh/break tags).")
@click.option("--engine", type=click.Choice(["auto", "fast", "plain"]), default="auto", show_default=True)
@provider_option
@click.option("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all cores).")
def warm(
    artifact: Path,
    phrases: Path,
    out: Path,
    seed: int,
    speaker: str | None,
    temperature: float,
    top_p: float,
    top_k: int,
    repetition_penalty: float,
    min_new_token: int,
    use_decoder: bool,
    max_new_token: int,
    prompt: str,
    engine: str,
    provider: str,
    threads: int | None,
) -> None:
    """Pre-synthesize a phrase list into a phrase cache (for `synth --cache`, `Pipeline(cache=...)`).

    Each phrase's mel is stored, keyed by its normalised text, the knobs (speaker, prompt, sampling,
    seed, Decoder/DVAE) and the artifact's payload hash; a request served from the cache must use
    the same knobs and --no-refine. Blank and duplicate lines are skipped with a warning naming the
    line; a line with nothing speakable is an error naming the line.

    \b
    Example:
      chattts-forge warm --artifact artifacts/M/v1 --phrases phrases.txt --out phrases.cache --seed 0
    """
    from chattts_forge.runtime.phrase_cache import build_phrase_cache
    from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, SynthParams
    from chattts_forge.runtime.router import ROUTING_NAME, Router

    t0 = time.perf_counter()
    kwargs = {"provider": provider, "threads": threads, "engine": engine}
    front = Router(artifact, autotune=False, **kwargs).front if (artifact / ROUTING_NAME).is_file() else Pipeline(artifact, **kwargs)
    spk = _resolve_speaker(speaker, seed, front)
    params = SynthParams(
        code=InferCodeParams(
            prompt=prompt, spk_emb=spk, temperature=temperature, top_p=top_p, top_k=top_k,
            repetition_penalty=repetition_penalty, max_new_token=max_new_token, min_new_token=min_new_token, seed=seed,
        ),
        refine=None,
        use_decoder=use_decoder,
    )
    summary = build_phrase_cache(artifact, phrases, out, params, **kwargs)
    per_variant = ", ".join(f"{v}: {n}" for v, n in summary["variants"].items())
    log.info("wrote phrase cache %s: %d phrases (%s), %.1f MB in %.1f s", summary["path"], summary["phrases"],
             per_variant, summary["bytes"] / 1e6, time.perf_counter() - t0)
