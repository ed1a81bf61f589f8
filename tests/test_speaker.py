"""The numpy GE2E speaker encoder: its weights reader, preprocessing, partials and embeddings
(mechanics; the proof that it tells voices apart is test_speaker_speech.py, the parity with
resemblyzer's own torch model test_speaker_torch.py)."""

from __future__ import annotations

import pickle
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate import speaker
from chattts_forge.evaluate.asr import resample
from chattts_forge.evaluate.speaker import (
    SpeakerEncoder,
    partial_slices,
    pooled_reference,
    preprocess,
    similarity,
)


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    return SpeakerEncoder.load()


@pytest.fixture(scope="module")
def slt(data_dir: Path) -> np.ndarray:
    audio, sr = sf.read(data_dir / "speech" / "voices" / "slt" / "006.wav", dtype="float32")
    assert sr == 16000
    return audio


def test_weights_are_the_wheels_and_complete(encoder: SpeakerEncoder) -> None:
    assert encoder.path.name == "pretrained.pt" and encoder.path.parent.name == "resemblyzer"
    w = encoder.weights
    assert w["lstm.weight_ih_l0"].shape == (1024, 40) and w["linear.weight"].shape == (256, 256)
    assert all(v.dtype == np.float32 and np.all(np.isfinite(v)) for v in w.values())
    d = encoder.describe()
    assert len(d["weights_sha256"]) == 64 and "energy" in d["vad"]


def test_missing_weights_is_a_one_line_error(monkeypatch, tmp_path: Path) -> None:
    def no_dist(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "files", no_dist)  # what fsutil.installed_file reads
    with pytest.raises(ForgeError, match=r"pip install --no-deps resemblyzer==0\.1\.4") as e:
        SpeakerEncoder.load()
    assert "\n" not in str(e.value)
    with pytest.raises(ForgeError, match="do not exist"):
        SpeakerEncoder.load(tmp_path / "nope.pt")


def test_reader_refuses_other_files_and_foreign_globals(tmp_path: Path) -> None:
    (tmp_path / "junk.pt").write_bytes(b"not a pickle at all")
    with pytest.raises(ForgeError, match="not a readable torch checkpoint|not a legacy torch checkpoint"):
        speaker.read_torch_legacy_state(tmp_path / "junk.pt")
    # A pickle that names a global other than the few a state dict needs never runs it.
    evil = tmp_path / "evil.pt"
    with evil.open("wb") as f:
        for obj in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
            pickle.dump(obj, f)
        f.write(b"cos\nsystem\n(S'echo hacked'\ntR.")
    with pytest.raises(ForgeError, match="not allowed"):
        speaker.read_torch_legacy_state(evil)


def test_partials_follow_resemblyzers_rule() -> None:
    # 1.6 s windows every 77 frames; the last kept only when it covers >= 75% of its frames.
    assert partial_slices(8000) == [slice(0, 160)]  # shorter than one partial: still one
    two = partial_slices(int(16000 * 2.5))
    assert [s.start for s in two] == [0, 77] and all(s.stop - s.start == 160 for s in two)
    n = 16000 * 4
    starts = [s.start for s in partial_slices(n)]
    assert starts == list(range(0, starts[-1] + 1, 77))
    assert (n - starts[-1] * 160) / (160 * 160) >= 0.75


def test_preprocessing_raises_quiet_audio_and_cuts_long_silences(slt: np.ndarray) -> None:
    quiet = slt * 0.01
    out = preprocess(quiet, 16000)
    assert 20 * np.log10(np.sqrt(np.mean(out.astype(np.float64) ** 2))) == pytest.approx(-30.0, abs=1.5)
    loud = preprocess(slt, 16000)  # flite speaks louder than -30 dBFS: left as it is
    assert np.abs(loud).max() == pytest.approx(np.abs(slt).max(), rel=1e-6)
    gap = np.concatenate([slt, np.zeros(16000 * 3, dtype=np.float32), slt])
    trimmed = preprocess(gap, 16000)
    assert trimmed.shape[0] < gap.shape[0] - 16000 * 2.5  # most of the 3 s of silence is gone
    assert trimmed.shape[0] > 2 * slt.shape[0] * 0.8  # the speech is not


def test_silence_dilation_is_scipys_for_every_length_short_ones_included() -> None:
    """A clip of fewer VAD windows than the dilation element (an utterance that ended at once) keeps
    its length: the full-size build's auto variant crashed its evaluation on a 0.18 s clip."""
    from scipy.ndimage import binary_dilation

    rng = np.random.default_rng(0)
    width = speaker.VAD_MAX_SILENCE + 1
    for n in range(1, 3 * width):
        for _ in range(5):
            mask = rng.random(n) < 0.3
            assert np.array_equal(speaker._dilate(mask, width), binary_dilation(mask, np.ones(width))), n
    short = (np.sin(np.arange(2880) / 5.0) * 0.3).astype(np.float32)  # 6 windows of 30 ms
    assert preprocess(short, 16000).shape[0] == 2880


def test_bad_waveforms_are_clear_errors(encoder: SpeakerEncoder) -> None:
    with pytest.raises(ForgeError, match="empty"):
        encoder.embed(np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(ForgeError, match="NaN"):
        encoder.embed(np.array([0.0, np.nan] * 100, dtype=np.float32), 16000)
    with pytest.raises(ForgeError, match="sample rate"):
        encoder.embed(np.zeros(100, dtype=np.float32), 0)


def test_embeddings_are_unit_256_and_stable_under_rate_and_gain(encoder: SpeakerEncoder, slt: np.ndarray) -> None:
    e = encoder.embed(slt, 16000)
    assert e.shape == (256,) and e.dtype == np.float32
    assert np.linalg.norm(e) == pytest.approx(1.0, abs=1e-5) and e.min() >= 0  # ReLU before the norm
    at24k = encoder.embed(resample(slt, 16000, 24000), 24000)
    assert similarity(e, at24k) > 0.99
    # Quiet audio is raised to -30 dBFS (never lowered: resemblyzer's rule), so two quiet copies agree.
    assert similarity(encoder.embed(slt * 0.05, 16000), encoder.embed(slt * 0.01, 16000)) > 0.999
    stereo = np.stack([slt, slt], axis=1)
    assert similarity(e, encoder.embed(stereo, 16000)) > 0.999
    silence = encoder.embed(np.zeros(16000, dtype=np.float32), 16000)
    assert silence.shape == (256,) and np.all(np.isfinite(silence))


def test_embed_many_equals_embed_one_by_one(encoder: SpeakerEncoder, slt: np.ndarray) -> None:
    items = [(slt, 16000), (slt[:20000], 16000), (resample(slt[5000:], 16000, 24000), 24000)]
    many = encoder.embed_many(items, batch=2)
    assert many.shape == (3, 256)
    for row, item in zip(many, items, strict=True):
        np.testing.assert_allclose(row, encoder.embed(*item), atol=1e-5)
    assert encoder.embed_many([]).shape == (0, 256)


def test_similarity_and_pooling() -> None:
    a, b = np.array([1.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0])
    assert similarity(a, a) == pytest.approx(1.0)
    assert similarity(a, b) == pytest.approx(1 / np.sqrt(2))
    assert similarity(a, np.zeros(3)) == 0.0
    with pytest.raises(ForgeError, match="different sizes"):
        similarity(a, np.ones(4))
    pooled = pooled_reference([a, b / np.linalg.norm(b)])
    assert np.linalg.norm(pooled) == pytest.approx(1.0)
    assert similarity(pooled, a) > similarity(b, a)  # the mean lies between them
    with pytest.raises(ForgeError, match="at least one"):
        pooled_reference(np.zeros((0, 3)))


def test_scorers_never_import_torch_or_the_weight_wheels_code() -> None:
    """evaluate is torch-free: SIM and DNSMOS use only the wheels' files, never their modules."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys, numpy as np\n"
        "from chattts_forge.evaluate.speaker import SpeakerEncoder\n"
        "from chattts_forge.evaluate.naturalness import Dnsmos\n"
        "x = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)\n"
        "SpeakerEncoder.load().embed(x, 16000); Dnsmos.load(threads=1).score(x, 16000)\n"
        "bad = {'torch', 'torchaudio', 'librosa', 'resemblyzer', 'speechmos', 'webrtcvad'}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in bad)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
