"""Reference synthesis: ChatTTS's own `Chat.infer`, with the knobs ChatTTS users know.

Library use::

    from chattts_forge.torch_ref.chat import load_chat
    from chattts_forge.torch_ref.reference import reference_synthesize, write_wav
    chat = load_chat("ckpt/asset")
    res = reference_synthesize(chat, "你好，世界。", seed=0, refine=False)
    write_wav("out.wav", res.wav, res.sample_rate)
    res.codes      # int64 [steps, num_vq]: the audio codes ChatTTS generated (all parts, in order)
    res.hiddens    # float32 [steps, hidden] (Decoder input), empty when decoded with the DVAE

The audio is exactly what `Chat.infer` returns: it splits the text into sentences, may use the
first sentence as a speaker sample for the rest (ChatTTS does so when there are several and no
sample was given), decodes each batch and drops samples with |x| <= 1e-5. Codes and hidden states
are recorded from `Chat._infer_code` without changing it.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import os
import time
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge import chattts_defaults
from chattts_forge.chattts_defaults import CodeKnobs
from chattts_forge.cli_options import DECODER_HELP, SPEAKER_HELP
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_write_bytes, atomic_write_text
from chattts_forge.log import get_logger
from chattts_forge.options import option
from chattts_forge.torch_ref.chat import load_chat, quiet_chattts

if TYPE_CHECKING:
    import ChatTTS

log = get_logger(__name__)


@dataclass
class ReferenceResult:
    wav: np.ndarray  # float32 [samples], mono
    codes: np.ndarray  # int64 [steps, num_vq]
    hiddens: np.ndarray  # float32 [steps, hidden]; [0, hidden] when decoded with the DVAE
    sample_rate: int
    speaker: str | None  # the speaker string used (sampled when "random" was asked)
    texts: list[str] = field(default_factory=list)  # what the code generator got, per batch row
    parts: list[np.ndarray] = field(default_factory=list)  # codes per generated text part


def sample_speaker(chat: ChatTTS.Chat, seed: int | None) -> str:
    """ChatTTS's `sample_random_speaker` (torch RNG), seeded for reproducibility when `seed` is set."""
    # torch: the PyTorch side only; 1.9 s to import
    import torch

    if seed is None:
        return chat.sample_random_speaker()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return chat.sample_random_speaker()


def check_speaker(chat: ChatTTS.Chat, speaker: str) -> str:
    """The speaker string (or the one in the file it names) if ChatTTS can decode it to a vector
    of the model's width, else ForgeError."""
    # ChatTTS: the PyTorch reference only; 7.9 s to import
    from ChatTTS.model.speaker import Speaker

    speaker = speaker.strip()
    if len(speaker) < 256 and Path(speaker).is_file():
        speaker = Path(speaker).read_text(encoding="utf-8").strip()

    try:
        vec = Speaker._decode(speaker.strip())
    except (lzma.LZMAError, ValueError, TypeError, UnicodeError) as e:
        raise BadInput(f"--speaker is not a ChatTTS speaker string ({type(e).__name__}: {e})") from None
    hidden = int(chat.config.gpt.hidden_size)
    if vec.size != hidden:
        raise BadInput(f"--speaker encodes {vec.size} values, this checkpoint needs {hidden}")
    if not np.all(np.isfinite(vec)):
        raise BadInput("--speaker contains non-finite values")
    return speaker.strip()


@dataclass(frozen=True)
class ReferenceParams(CodeKnobs):
    """The knobs of a reference synthesis (defaults = ChatTTS's InferCodeParams).

    `seed` seeds torch (speaker sampling, refinement) and is ChatTTS's `manual_seed` for both the text
    refiner and the code generator. `speaker` is a ChatTTS speaker string (or a file holding one),
    "random" (sampled with `seed`) or None (ChatTTS's empty speaker). The refiner runs with ChatTTS's
    RefineTextParams (only its token budget, `refine_max_new_token`, is exposed). `split_text` is
    `Chat.infer`'s: split a str into sentences (and use the first as a speaker sample)."""

    # each option of `chattts-forge reference` that is a knob is declared on its field (the code knobs
    # on CodeKnobs'); the rest are ReferenceConfig's
    seed: int | None = option(None, "--seed", "Seed torch and ChatTTS's manual_seed (reproducible).", kind=int)
    speaker: str | None = option(None, "--speaker", SPEAKER_HELP)
    # the code knobs (temperature, top_p, top_k, repetition_penalty, max/min_new_token, prompt): CodeKnobs
    max_new_token: int = option(chattts_defaults.CODE_MAX_NEW_TOKEN, "--max-new-token", "Most code steps per part.",
                                kind=int, show_default=True, kw_only=True)
    refine: bool = option(True, "--refine/--no-refine", "Refine the text with the GPT first.", show_default=True)
    use_decoder: bool = option(True, "--decoder/--dvae", DECODER_HELP, show_default=True)
    refine_max_new_token: int = chattts_defaults.REFINE_MAX_NEW_TOKEN  # no CLI option
    split_text: bool = option(
        True, "--split/--no-split",
        "Chat.infer's split_text: speak sentence by sentence (the first one sets the voice of the rest).",
        show_default=True)
    show_progress: bool = False  # `reference --progress/--no-progress` (default: when stderr is a tty)

    def check(self) -> None:
        """BadInput naming the option of the first knob out of range."""
        self.check_knobs()


def reference_synthesize(
    chat: ChatTTS.Chat, text: str | list[str], params: ReferenceParams | None = None, **knobs: Any
) -> ReferenceResult:
    """Synthesize `text` with ChatTTS's `Chat.infer` with `params` (`knobs`: fields of
    `ReferenceParams` that replace its, e.g. `reference_synthesize(chat, text, seed=0, refine=False)`)."""
    # torch: the PyTorch side only; 1.9 s to import
    import torch

    p = replace(params or ReferenceParams(), **knobs)
    texts = [text] if isinstance(text, str) else list(text)
    if not texts or any(not t or not t.strip() for t in texts):
        raise BadInput("empty text")
    p.check()
    with quiet_chattts():
        for t in texts:
            if not chat.normalizer(t, True, True, None).strip():
                raise ForgeError(f"text {t!r} normalises to nothing ChatTTS can read")
    speaker = p.speaker
    if speaker is not None and speaker.strip().lower() == "random":
        speaker = sample_speaker(chat, p.seed)
    elif speaker is not None:
        speaker = check_speaker(chat, speaker)
    params_code, params_refine = _chattts_params(p, speaker)
    with _recorded_codes(chat) as batches:
        with quiet_chattts(), torch.random.fork_rng(devices=[]):
            if p.seed is not None:
                torch.manual_seed(p.seed)
            wavs = chat.infer(
                text if isinstance(text, str) else texts,  # a str is split into sentences by ChatTTS
                split_text=p.split_text,
                skip_refine_text=not p.refine,
                use_decoder=p.use_decoder,
                params_refine_text=params_refine,
                params_infer_code=params_code,
            )
    wav = np.concatenate([np.asarray(w, dtype=np.float32).reshape(-1) for w in wavs]) if wavs else np.zeros(0)
    num_vq = int(chat.config.gpt.num_vq)
    hidden = int(chat.config.gpt.hidden_size)
    parts = [c for _, ids, _ in batches for c in ids]
    hid = [h for _, _, hs in batches for h in hs]
    codes = np.concatenate(parts) if parts else np.zeros((0, num_vq), dtype=np.int64)
    hiddens = np.concatenate(hid) if hid else np.zeros((0, hidden), dtype=np.float32)
    if wav.size == 0:
        raise ForgeError(f"ChatTTS produced no audio ({len(codes)} code steps; all samples were silent)")
    return ReferenceResult(
        wav=wav.astype(np.float32),
        codes=codes,
        hiddens=hiddens.astype(np.float32),
        sample_rate=int(chat.config.vocos.feature_extractor.init_args.sample_rate),
        speaker=speaker,
        texts=[t for rows, _, _ in batches for t in rows],
        parts=parts,
    )


def _chattts_params(p: ReferenceParams, speaker: str | None) -> tuple[Any, Any]:
    """ChatTTS's (InferCodeParams, RefineTextParams) for `p`."""
    # ChatTTS: the PyTorch reference only; 7.9 s to import
    from ChatTTS.core import Chat

    params_code = Chat.InferCodeParams(
        prompt=p.prompt,
        spk_emb=speaker,
        temperature=float(p.temperature),
        top_P=float(p.top_p),
        top_K=int(p.top_k),
        repetition_penalty=float(p.repetition_penalty),
        max_new_token=int(p.max_new_token),
        min_new_token=int(p.min_new_token),
        show_tqdm=p.show_progress,
        manual_seed=p.seed,
    )
    params_refine = Chat.RefineTextParams(
        max_new_token=p.refine_max_new_token, show_tqdm=p.show_progress, manual_seed=p.seed
    )
    return params_code, params_refine


@contextlib.contextmanager
def _recorded_codes(chat: ChatTTS.Chat) -> Iterator[list[tuple[list[str], list[np.ndarray], list[np.ndarray]]]]:
    """(texts, codes per row, hidden states per row) of every batch `Chat._infer_code` generates
    while the block runs, recorded without changing what it yields."""
    batches: list[tuple[list[str], list[np.ndarray], list[np.ndarray]]] = []
    orig = chat._infer_code

    def recording(text: Any, stream: bool, device: Any, return_hidden: bool, params: Any) -> Iterator[Any]:
        rows = list(text) if isinstance(text, list) else None
        for result in orig(text, stream, device, return_hidden, params):
            # A str call is infer's speaker-sample pass over the first sentence, not output audio.
            if rows is not None:
                batches.append(
                    (
                        rows,
                        [i.detach().cpu().numpy().astype(np.int64) for i in result.ids],
                        [h.detach().float().cpu().numpy() for h in result.hiddens],
                    )
                )
            yield result

    chat._infer_code = recording  # type: ignore[method-assign]
    try:
        yield batches
    finally:
        del chat._infer_code  # back to the class method


@dataclass(frozen=True)
class ReferenceConfig:
    """One `chattts-forge reference` run: the checkpoint, the text, where the files go, the torch device
    (each its option, declared on its field; the knobs' options are ReferenceParams')."""

    checkpoint: Path = option(
        MISSING, "--checkpoint",
        "ChatTTS checkpoint: asset folder, snapshot root containing asset/, or a Hugging Face cache.", kind="path")
    text: str = option(MISSING, "--text", "Text to speak (ChatTTS splits it into sentences unless --no-split).")
    out: Path = option(MISSING, "--out", "Output WAV (float32, mono).", kind="path")
    params: ReferenceParams = field(default_factory=ReferenceParams)
    speaker_out: Path | None = option(
        None, "--speaker-out", "Write the speaker string used (useful with --speaker random).", kind="path")
    codes_out: Path | None = option(
        None, "--codes-out", "Save the generated audio codes as an int64 .npy array [steps, 4].", kind="path")
    device: str = option("cpu", "--device", "torch device (cpu, cuda, cuda:1, ...).", show_default=True)


def reference_to_files(cfg: ReferenceConfig) -> ReferenceResult:
    """`chattts-forge reference`: load the checkpoint, synthesize, write the WAV (and codes, speaker)."""
    if not cfg.text.strip():
        raise BadInput("--text is empty")
    if cfg.out.is_dir():
        raise BadInput(f"--out {cfg.out} is a folder; give a .wav file path")
    if cfg.speaker_out is not None and cfg.params.speaker is None:
        raise BadInput("--speaker-out needs --speaker (a string or 'random')")
    device = cfg.device.strip()
    if device.startswith("cuda"):
        # torch: the PyTorch side only; 1.9 s to import
        import torch

        if not torch.cuda.is_available():
            raise BadInput(f"--device {device}: CUDA is not available to torch on this machine")
    elif device != "cpu":
        raise BadInput(f"--device {device}: use cpu or cuda[:N]")
    t0 = time.perf_counter()
    chat = load_chat(cfg.checkpoint, device=device)
    t1 = time.perf_counter()
    res = reference_synthesize(chat, cfg.text, cfg.params)
    t2 = time.perf_counter()
    write_wav(cfg.out, res.wav, res.sample_rate)
    log.info("wrote %s: %.2f s of audio at %d Hz, %d code steps (load %.1f s, synthesis %.1f s)", cfg.out,
             res.wav.size / res.sample_rate, res.sample_rate, len(res.codes), t1 - t0, t2 - t1)
    if cfg.codes_out is not None:
        write_codes(cfg.codes_out, res.codes)
        log.info("wrote codes %s: shape %s", cfg.codes_out, tuple(res.codes.shape))
    if cfg.speaker_out is not None:
        assert res.speaker is not None
        atomic_write_text(cfg.speaker_out, res.speaker + "\n")
        log.info("wrote speaker string %s", cfg.speaker_out)
    return res


def write_wav(path: str | os.PathLike[str], wav: np.ndarray, sample_rate: int) -> Path:
    """float32 mono WAV via soundfile, written atomically."""
    # soundfile: only when a WAV is written; 12 ms to import
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.asarray(wav, dtype=np.float32), sample_rate, format="WAV", subtype="FLOAT")
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def write_codes(path: str | os.PathLike[str], codes: np.ndarray) -> Path:
    """The codes as a .npy int64 array [steps, num_vq], written atomically."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(codes, dtype=np.int64))
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
