"""DNSMOS mechanics: the models are the wheel's, the 9.01 s windows, the P.808 features, the
calibration, resampling and bad input (the proof on real speech is test_naturalness_speech.py,
the parity with speechmos' own code test_speaker_torch.py)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.asr import resample
from chattts_forge.evaluate.naturalness import WINDOW_SAMPLES, Dnsmos, p808_features, windows


@pytest.fixture(scope="module")
def dnsmos() -> Dnsmos:
    return Dnsmos.load(threads=2)


def test_models_come_from_the_speechmos_wheel(dnsmos: Dnsmos) -> None:
    p835, p808 = dnsmos.paths
    assert (p835.parent.name, p835.name) == ("dnsmos_models", "sig_bak_ovr.onnx")
    assert (p808.parent.name, p808.name) == ("dnsmos_models", "model_v8.onnx")
    assert dnsmos.p835.get_inputs()[0].shape[1] == WINDOW_SAMPLES
    assert dnsmos.p808.get_inputs()[0].shape[1:] == [900, 120]


def test_missing_models_are_one_line_errors(monkeypatch, tmp_path: Path) -> None:
    def no_dist(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "files", no_dist)  # what fsutil.installed_file reads
    with pytest.raises(ForgeError, match=r"pip install --no-deps speechmos==0\.0\.1\.1") as e:
        Dnsmos.load()
    assert "\n" not in str(e.value)
    with pytest.raises(ForgeError, match="does not exist"):
        Dnsmos.load(models_dir=tmp_path)


def test_windows_loop_short_clips_and_hop_one_second() -> None:
    ramp = np.arange(16000 * 4, dtype=np.float32)  # 4 s -> looped to 16 s -> 7 windows
    segs = windows(ramp)
    assert len(segs) == int(16 - 9.01) + 1 and all(s.shape == (WINDOW_SAMPLES,) for s in segs)
    assert segs[0][64000] == 0.0 and segs[1][0] == 16000.0  # the loop restarts; hops of 1 s
    assert len(windows(np.zeros(WINDOW_SAMPLES, dtype=np.float32))) == 1
    assert len(windows(np.zeros(16000 * 12, dtype=np.float32))) == 3


def test_p808_features_are_scaled_db_mels() -> None:
    rng = np.random.default_rng(0)
    feats = p808_features(rng.normal(0, 0.1, WINDOW_SAMPLES).astype(np.float32))
    assert feats.shape == (900, 120) and feats.dtype == np.float32
    # (dB re the loudest bin + 40) / 40, floored 80 dB down: within [-1, 1], the maximum exactly 1.
    assert feats.max() == pytest.approx(1.0) and feats.min() >= -1.0 - 1e-6


def test_scores_are_in_range_and_survive_resampling(dnsmos: Dnsmos, data_dir: Path) -> None:
    audio, sr = sf.read(data_dir / "speech" / "voices" / "kal16" / "006.wav", dtype="float32")
    s16 = dnsmos.score(audio, sr)
    assert set(s16) == {"sig", "bak", "ovrl", "p808"}
    assert all(1.0 <= v <= 5.0 for v in s16.values()), s16
    s24 = dnsmos.score(resample(audio, sr, 24000), 24000)
    for k in s16:
        assert s24[k] == pytest.approx(s16[k], abs=0.05), k


def test_bad_waveforms_are_clear_errors(dnsmos: Dnsmos) -> None:
    with pytest.raises(ForgeError, match="empty"):
        dnsmos.score(np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(ForgeError, match="NaN"):
        dnsmos.score(np.full(16000, np.inf, dtype=np.float32), 16000)
    with pytest.raises(ForgeError, match="sample rate"):
        dnsmos.score(np.zeros(16000, dtype=np.float32), -1)
