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
