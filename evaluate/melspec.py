"""Mel power spectrograms as librosa computes them, in numpy (the scorers' weights were trained on them).

Both scorers of evaluate were trained on ``librosa.feature.melspectrogram`` features: the GE2E
speaker encoder (40 bands, 25 ms window, 10 ms hop, power mel, no log) and DNSMOS P.808 (120 bands,
321-point window, 10 ms hop, then dB). librosa is not a dependency (it pulls numba and a dozen more
packages), so this module reproduces its defaults exactly: a periodic Hann window, frames centred by
padding ``n_fft // 2`` zeros on each side (librosa >= 0.10's ``pad_mode="constant"``), power 2, and
the Slaney mel scale with Slaney area normalisation from 0 Hz to Nyquist.
"""

from __future__ import annotations

import numpy as np

__all__ = ["hz_to_mel", "mel_to_hz", "mel_filterbank", "power_spectrogram", "mel_power", "power_to_db"]

# Slaney's (Auditory Toolbox) mel scale, librosa's default (htk=False).
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _F_SP
    log_region = hz >= _MIN_LOG_HZ
    return np.where(log_region, _MIN_LOG_MEL + np.log(np.maximum(hz, 1e-12) / _MIN_LOG_HZ) / _LOGSTEP, mel)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = _F_SP * mel
    return np.where(mel >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL)), hz)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """(n_mels, 1 + n_fft // 2) triangular filters, Slaney-normalised (librosa.filters.mel defaults)."""
    fft_freqs = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    mel_points = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2.0), n_mels + 2))
    fdiff = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2 : n_mels + 2] - mel_points[:n_mels]))[:, None]
    return weights.astype(np.float32)


def power_spectrogram(audio: np.ndarray, n_fft: int, hop_length: int) -> np.ndarray:
    """(1 + n_fft // 2, frames) |STFT|^2 with a periodic Hann window, centred frames (zero padding)."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    padded = np.pad(audio, (n_fft // 2, n_fft // 2), mode="constant")
    n_frames = 1 + (padded.shape[0] - n_fft) // hop_length
    if n_frames < 1:
        return np.zeros((1 + n_fft // 2, 0), dtype=np.float32)
    window = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
    frames = np.lib.stride_tricks.as_strided(
        padded, shape=(n_frames, n_fft), strides=(padded.strides[0] * hop_length, padded.strides[0])
    )
    spectrum = np.fft.rfft(frames * window, axis=1)
    return (np.abs(spectrum) ** 2).T.astype(np.float32)


def mel_power(audio: np.ndarray, sample_rate: int, n_fft: int, hop_length: int, n_mels: int) -> np.ndarray:
    """(n_mels, frames) mel power spectrogram: librosa.feature.melspectrogram with these arguments."""
    return mel_filterbank(sample_rate, n_fft, n_mels) @ power_spectrogram(audio, n_fft, hop_length)


def power_to_db(power: np.ndarray, amin: float = 1e-10, top_db: float = 80.0) -> np.ndarray:
    """librosa.power_to_db(power, ref=np.max): dB relative to the loudest bin, floored top_db below it."""
    db = 10.0 * np.log10(np.maximum(amin, power))
    if db.size == 0:
        return db
    db -= 10.0 * np.log10(max(amin, float(np.max(power))))
    return np.maximum(db, db.max() - top_db)
