"""The deterministic buffers of ChatTTS/Vocos checkpoints, computed as torch/torchaudio compute them.

These are not learned: a real checkpoint holds the values the modules computed at construction,
so a synthetic one must hold the same values (tests compare against torch to ~1e-6).
"""

from __future__ import annotations

import math

import numpy as np


def hann_window(n: int) -> np.ndarray:
    """torch.hann_window(n) (periodic): 0.5 - 0.5 cos(2 pi k / n), float32."""
    k = np.arange(n, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2.0 * math.pi * k / n)).astype(np.float32)


def _hz_to_mel_htk(f: np.ndarray | float) -> np.ndarray | float:
    return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)


def _mel_to_hz_htk(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """torchaudio.functional.melscale_fbanks(n_fft//2+1, 0, sr//2, n_mels, sr, norm=None, "htk").

    The buffer `mel_scale.fb` of torchaudio.transforms.MelSpectrogram, shape [n_fft//2+1, n_mels].
    """
    n_freqs = n_fft // 2 + 1
    f_max = float(sample_rate // 2)
    all_freqs = np.linspace(0.0, sample_rate // 2, n_freqs)
    m_pts = np.linspace(float(_hz_to_mel_htk(0.0)), float(_hz_to_mel_htk(f_max)), n_mels + 2)
    f_pts = _mel_to_hz_htk(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return np.maximum(0.0, np.minimum(down, up)).astype(np.float32)
