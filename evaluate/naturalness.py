"""Naturalness: DNSMOS P.835 (SIG, BAK, OVRL) and P.808 MOS predictions, with ONNX Runtime.

The models are Microsoft's DNSMOS as the ``speechmos`` 0.0.1.1 wheel (MIT) ships them:
``dnsmos_models/sig_bak_ovr.onnx`` (P.835: speech signal quality SIG, background noise BAK, overall
OVRL) and ``dnsmos_models/model_v8.onnx`` (P.808 overall MOS). Install with
``pip install --no-deps speechmos==0.0.1.1``: its code imports librosa, and only its ONNX files are
used here.

Scoring follows DNSMOS's own procedure (speechmos' ``dnsmos.py``, Microsoft's ``dnsmos_local.py``):
the clip at 16 kHz is repeated end to end until it is at least 9.01 s long; every 9.01 s window
starting on a whole second is scored; the clip's figure is the mean over windows. P.835 takes the
raw samples; P.808 takes the 120-band mel of the window minus its last 10 ms (321-point window,
10 ms hop) in dB relative to the window's loudest bin, ``(dB + 40) / 40``. The P.835 raw outputs go
through the non-personalised polynomials (the DNSMOS figures published tables report;
the personalised model additionally penalises a competing talker, which TTS output never has).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError, NotFound
from chattts_forge.evaluate.asr import mono_at
from chattts_forge.evaluate.melspec import mel_power, power_to_db
from chattts_forge.fsutil import installed_file, recorded_installed_file

__all__ = ["Dnsmos", "find_models", "KEYS"]

MODELS_DISTRIBUTION = "speechmos"
P835_PATH_IN_WHEEL = "speechmos/dnsmos_models/sig_bak_ovr.onnx"
P808_PATH_IN_WHEEL = "speechmos/dnsmos_models/model_v8.onnx"
INSTALL_HINT = "pip install --no-deps speechmos==0.0.1.1"

SAMPLE_RATE = 16000
WINDOW_SECONDS = 9.01
WINDOW_SAMPLES = int(WINDOW_SECONDS * SAMPLE_RATE)  # 144160, the P.835 model's input length
P808_N_FFT = 321
P808_HOP = 160
P808_N_MELS = 120
KEYS = ("sig", "bak", "ovrl", "p808")

# Non-personalised P.835 calibration polynomials (highest power first), DNSMOS's own.
_POLY_SIG = np.poly1d([-0.08397278, 1.22083953, 0.0052439])
_POLY_BAK = np.poly1d([-0.13166888, 1.60915514, -0.39604546])
_POLY_OVRL = np.poly1d([-0.06766283, 1.11546468, 0.04602535])


def find_models() -> tuple[Path, Path]:
    """(P.835 sig_bak_ovr.onnx, P.808 model_v8.onnx) inside the installed speechmos distribution."""
    found = []
    for rel in (P835_PATH_IN_WHEEL, P808_PATH_IN_WHEEL):
        path = installed_file(MODELS_DISTRIBUTION, rel)
        if path is None:
            raise ForgeError(f"the DNSMOS models ({rel} of the speechmos wheel) are not installed; run: {INSTALL_HINT}")
        found.append(path)
    return found[0], found[1]


def p808_features(window: np.ndarray) -> np.ndarray:
    """(900, 120) P.808 input of one 9.01 s window: the dB mel of all but its last 10 ms."""
    mel = mel_power(window[:-P808_HOP], SAMPLE_RATE, P808_N_FFT, P808_HOP, P808_N_MELS)
    return ((power_to_db(mel) + 40.0) / 40.0).T.astype(np.float32)


def windows(audio16: np.ndarray) -> list[np.ndarray]:
    """The 9.01 s windows DNSMOS scores: the clip looped to >= 9.01 s, one window per whole second."""
    audio = np.asarray(audio16, dtype=np.float32).reshape(-1)
    while audio.shape[0] < WINDOW_SAMPLES:
        audio = np.concatenate([audio, audio])
    n_windows = int(np.floor(audio.shape[0] / SAMPLE_RATE) - WINDOW_SECONDS) + 1
    out = []
    for k in range(n_windows):
        seg = audio[k * SAMPLE_RATE : k * SAMPLE_RATE + WINDOW_SAMPLES]
        if seg.shape[0] == WINDOW_SAMPLES:
            out.append(seg)
    return out


class Dnsmos:
    """DNSMOS P.835 + P.808 on ONNX Runtime (CPU); `load()` finds the installed models."""

    def __init__(self, p835_path: Path, p808_path: Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.paths = (p835_path, p808_path)
        try:
            self.p835 = ort.InferenceSession(str(p835_path), opts, providers=["CPUExecutionProvider"])
            self.p808 = ort.InferenceSession(str(p808_path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for unreadable models
            raise ForgeError(f"cannot load the DNSMOS models {p835_path}, {p808_path}: {str(e).splitlines()[0]}") from None

    @classmethod
    def load(cls, threads: int | None = None, models_dir: str | os.PathLike[str] | None = None) -> Dnsmos:
        """The shipped models, or ``models_dir/sig_bak_ovr.onnx`` and ``models_dir/model_v8.onnx``."""
        if models_dir is None:
            p835, p808 = find_models()
        else:
            p835, p808 = Path(models_dir) / "sig_bak_ovr.onnx", Path(models_dir) / "model_v8.onnx"
            for p in (p835, p808):
                if not p.is_file():
                    raise NotFound(f"DNSMOS model {p} does not exist")
        return cls(p835, p808, threads)

    def describe(self) -> dict[str, Any]:
        return {
            "model": "DNSMOS P.835 (sig_bak_ovr.onnx, non-personalised) + P.808 (model_v8.onnx), speechmos 0.0.1.1",
            "p835": recorded_installed_file(self.paths[0], MODELS_DISTRIBUTION, P835_PATH_IN_WHEEL),
            "p808": recorded_installed_file(self.paths[1], MODELS_DISTRIBUTION, P808_PATH_IN_WHEEL),
        }

    def score(self, audio: np.ndarray, sample_rate: int) -> dict[str, float]:
        """{'sig', 'bak', 'ovrl', 'p808'} of a mono waveform at any rate (resampled to 16 kHz)."""
        segs = windows(mono_at(audio, sample_rate, SAMPLE_RATE, "score"))
        raw = self.p835.run(None, {"input_1": np.stack(segs)})[0]  # (n, 3): sig, bak, ovrl before calibration
        p808 = self.p808.run(None, {"input_1": np.stack([p808_features(s) for s in segs])})[0][:, 0]
        return {
            "sig": float(np.mean(_POLY_SIG(raw[:, 0]))),
            "bak": float(np.mean(_POLY_BAK(raw[:, 1]))),
            "ovrl": float(np.mean(_POLY_OVRL(raw[:, 2]))),
            "p808": float(np.mean(p808)),
        }
