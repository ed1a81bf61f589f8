"""The torch-free scorers against the code they reproduce (the export side: needs torch/torchaudio).

- the legacy-format weights reader against ``torch.load``;
- the numpy GE2E encoder against resemblyzer's own ``VoiceEncoder`` (its torch LSTM and its
  ``embed_utterance``), on the same preprocessed waveform; resemblyzer's module imports librosa
  and webrtcvad at the top, which are not installed: they are stood in for by torchaudio's mel
  (an independent implementation of the same librosa-style filterbank) and an unused stub;
- the librosa-equivalent mel of evaluate/melspec.py against torchaudio's;
- DNSMOS orchestration (windows, calibration polynomials, P.808 features) against speechmos'
  own ``DNSMOS`` class, librosa again stood in for by torchaudio.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

torch = pytest.importorskip("torch")
torchaudio = pytest.importorskip("torchaudio")

from chattts_forge.evaluate import melspec, speaker  # noqa: E402
from chattts_forge.evaluate.naturalness import Dnsmos, find_models  # noqa: E402


def _torchaudio_mel(y, sr, n_fft, hop_length, n_mels):
    mel = torchaudio.transforms.MelSpectrogram(
        sample_rate=sr, n_fft=n_fft, hop_length=hop_length, n_mels=n_mels, norm="slaney", mel_scale="slaney",
        center=True, pad_mode="constant", power=2.0,
    )
    return mel(torch.from_numpy(np.asarray(y, dtype=np.float32))).numpy()


def _power_to_db(s, ref=np.max, amin=1e-10, top_db=80.0):
    db = 10 * np.log10(np.maximum(amin, s)) - 10 * np.log10(np.maximum(amin, ref(s)))
    return np.maximum(db, db.max() - top_db)


@pytest.fixture()
def stand_in_librosa(monkeypatch):
    fake = types.ModuleType("librosa")
    fake.feature = types.SimpleNamespace(melspectrogram=_torchaudio_mel)
    fake.power_to_db = _power_to_db
    monkeypatch.setitem(sys.modules, "librosa", fake)
    monkeypatch.setitem(sys.modules, "webrtcvad", types.ModuleType("webrtcvad"))
    monkeypatch.setitem(sys.modules, "requests", types.SimpleNamespace(session=None))
    for name in [m for m in sys.modules if m.startswith(("resemblyzer", "speechmos"))]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture(scope="module")
def clip(data_dir: Path) -> np.ndarray:
    audio, _ = sf.read(data_dir / "speech" / "voices" / "rms" / "007.wav", dtype="float32")
    return audio


def test_reader_equals_torch_load() -> None:
    path = speaker.find_weights()
    ours = speaker.read_torch_legacy_state(path)
    theirs = torch.load(path, map_location="cpu", weights_only=False)["model_state"]
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        np.testing.assert_array_equal(ours[name], tensor.numpy(), err_msg=name)


def test_mel_equals_torchaudio(clip: np.ndarray) -> None:
    ours = melspec.mel_power(clip, 16000, 400, 160, 40)
    theirs = _torchaudio_mel(clip, 16000, 400, 160, 40)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6 * theirs.max())


def test_numpy_encoder_equals_resemblyzers_torch_model(stand_in_librosa, clip: np.ndarray) -> None:
    from resemblyzer.voice_encoder import VoiceEncoder

    theirs = VoiceEncoder(device="cpu", verbose=False)
    ours = speaker.SpeakerEncoder.load()
    wav = speaker.preprocess(clip, 16000)
    mels = speaker.partial_mels(wav)
    with torch.no_grad():
        partials_theirs = theirs(torch.from_numpy(mels)).numpy()
    np.testing.assert_allclose(ours.embed_mels(mels), partials_theirs, atol=2e-5)
    e_ours, e_theirs = ours.embed_preprocessed(wav), theirs.embed_utterance(wav)
    np.testing.assert_allclose(e_ours, e_theirs, atol=2e-5)
    short = wav[:12000]  # one padded partial
    np.testing.assert_allclose(ours.embed_preprocessed(short), theirs.embed_utterance(short), atol=2e-5)


# torchaudio warns that 120 bands over 161 bins leave some empty: true, and the same in librosa.
@pytest.mark.filterwarnings("ignore:At least one mel filterbank has all zero values")
def test_dnsmos_equals_speechmos(stand_in_librosa, clip: np.ndarray) -> None:
    from speechmos import dnsmos as speechmos_dnsmos

    p835, p808 = find_models()
    theirs = speechmos_dnsmos.DNSMOS(str(p835), str(p808))(clip, 16000, False)
    ours = Dnsmos.load(threads=1).score(clip, 16000)
    assert ours["sig"] == pytest.approx(theirs["sig_mos"], abs=1e-4)
    assert ours["bak"] == pytest.approx(theirs["bak_mos"], abs=1e-4)
    assert ours["ovrl"] == pytest.approx(theirs["ovrl_mos"], abs=1e-4)
    # P.808's 321-point mel: librosa >= 0.10 places the bins at k * 16000 / 321 (ours), torchaudio
    # (standing in for librosa here) and librosa < 0.10 at k * 8000 / 160; a 0.3% shift of the
    # filterbank moves the figure by about 0.01.
    assert ours["p808"] == pytest.approx(theirs["p808_mos"], abs=0.03)
