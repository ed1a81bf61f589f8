"""WAV output: float32 mono via soundfile, written atomically (temp file + rename)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import soundfile as sf

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes


def wav_bytes(wav: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.asarray(wav, dtype=np.float32).reshape(-1), sample_rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def write_wav(path: str | os.PathLike[str], wav: np.ndarray, sample_rate: int = 24000) -> Path:
    """Write a float32 mono WAV; the file appears complete or not at all."""
    path = Path(path)
    try:
        atomic_write_bytes(path, wav_bytes(wav, sample_rate))
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
        raise ForgeError(f"{what} {path} does not exist")
    try:
        if max_samples is not None:
            frames = sf.info(str(path)).frames
            if frames > max_samples:
                raise ForgeError(f"{what} {path} has {frames} samples, more than the {max_samples} this model "
                                 "can encode; cut it shorter")
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, sf.LibsndfileError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ForgeError(f"{what} {path} is not a readable audio file: {first}") from None
    if rate != sample_rate:
        raise ForgeError(f"{what} {path} is sampled at {rate} Hz; resample it to {sample_rate} Hz first")
    if data.shape[1] != 1:
        raise ForgeError(f"{what} {path} has {data.shape[1]} channels; give a mono recording")
    return data[:, 0]
