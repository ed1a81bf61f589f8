"""WAV output, written atomically (temp file + rename): float32 mono (`synth`'s default, soundfile) or
16-bit PCM mono (`synth --sample-format pcm16`, the server's `wav`: what OpenAI's speech API returns).

16-bit samples are `to_int16(x)` = round(x * 32768), clipped: a decoder that divides by 32768 gets
every sample within half a step of the float waveform.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np
import soundfile as sf

from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import atomic_write_bytes


class SampleFormat(Choice):
    """A WAV's samples: float32 (exact) or 16-bit PCM (the server's `wav`)."""

    FLOAT32 = "float32"
    PCM16 = "pcm16"


SAMPLE_FORMATS = SampleFormat.values()
UNKNOWN_SIZE = 0xFFFFFFFF  # a streamed WAV's RIFF and data sizes (OpenAI's streamed header)


def to_int16(wav: np.ndarray) -> np.ndarray:
    """float samples -> int16 (round(x * 32768), clipped to [-32768, 32767])."""
    return np.clip(np.rint(np.asarray(wav, dtype=np.float64) * 32768.0), -32768, 32767).astype("<i2")


def pcm16_wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """The 44-byte header of a 16-bit PCM mono WAV (format 1); `data_bytes` None: a stream of unknown
    length, both sizes 0xFFFFFFFF as OpenAI streams them."""
    data = UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16)
            + b"data" + struct.pack("<I", data))


def wav_bytes(wav: np.ndarray, sample_rate: int, sample_format: str = "float32") -> bytes:
    """A whole mono WAV: float32 (format 3, soundfile) or 16-bit PCM with its true sizes."""
    if sample_format == "pcm16":
        pcm = to_int16(np.asarray(wav).reshape(-1)).tobytes()
        return pcm16_wav_header(sample_rate, len(pcm)) + pcm
    check_sample_format(sample_format)
    buf = io.BytesIO()
    sf.write(buf, np.asarray(wav, dtype=np.float32).reshape(-1), sample_rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def check_sample_format(sample_format: str) -> str:
    if sample_format not in SAMPLE_FORMATS:
        raise BadInput(f"sample format must be one of {', '.join(SAMPLE_FORMATS)}, got {sample_format!r}")
    return sample_format


def write_wav(path: str | os.PathLike[str], wav: np.ndarray, sample_rate: int = 24000,
              sample_format: str = "float32") -> Path:
    """Write a mono WAV (float32, or 16-bit PCM); the file appears complete or not at all."""
    path = Path(path)
    try:
        atomic_write_bytes(path, wav_bytes(wav, sample_rate, sample_format))
    except OSError as e:
        raise ForgeError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def read_wav(path: str | os.PathLike[str], sample_rate: int = 24000, what: str = "recording",
             max_samples: int | None = None) -> np.ndarray:
    """A mono recording at `sample_rate` as float32 samples in [-1, 1] (any format soundfile reads).

    No resampling: a file at another rate, or with several channels, is a one-line ForgeError; so is
    one longer than `max_samples` frames (checked from its header, before the samples are read)."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"{what} {path} does not exist")
    try:
        if max_samples is not None:
            frames = sf.info(str(path)).frames
            if frames > max_samples:
                raise ForgeError(f"{what} {path} has {frames} samples, more than the {max_samples} this model "
                                 "can encode; cut it shorter")
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, sf.LibsndfileError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise BadInput(f"{what} {path} is not a readable audio file: {first}") from None
    if rate != sample_rate:
        raise ForgeError(f"{what} {path} is sampled at {rate} Hz; resample it to {sample_rate} Hz first")
    if data.shape[1] != 1:
        raise BadInput(f"{what} {path} has {data.shape[1]} channels; give a mono recording")
    return data[:, 0]
