"""Issue 49: runtime.tempo, OpenAI's `speed` as a time-scale change of the speed-1 waveform.

Real speech (a Flite clip of tests/data) for the durations; a harmonic tone for the pitch, whose f0
is known; irregular chunk sizes for stream == whole. No timing goals.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chattts_forge.errors import ForgeError
from chattts_forge.runtime.tempo import Stretcher, stage_factors, stretch

pytest.importorskip("av", reason="runtime.tempo needs PyAV (serve extra)")

SPEEDS = (0.25, 0.5, 2.0, 4.0)


@pytest.fixture(scope="module")
def speech(data_dir: Path) -> tuple[np.ndarray, int]:
    wav, sr = sf.read(data_dir / "speech" / "voices" / "slt" / "001.wav", dtype="float32")
    return wav, sr


def in_chunks(stretcher: Stretcher, wav: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    outs, pos, i = [], 0, 0
    while pos < len(wav):
        n = sizes[i % len(sizes)]
        outs.append(stretcher.push(wav[pos:pos + n]))
        pos, i = pos + n, i + 1
    outs.append(stretcher.flush())
    return np.concatenate(outs)


@pytest.mark.parametrize("speed", SPEEDS)
def test_duration_is_len_over_speed(speech: tuple[np.ndarray, int], speed: float) -> None:
    wav, sr = speech
    out = stretch(wav, speed, sr)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) / (len(wav) / speed) - 1) <= 0.03
    assert np.sqrt(np.mean(out ** 2)) > 0.3 * np.sqrt(np.mean(wav ** 2))  # speech, not silence padding


def dominant_f0(x: np.ndarray, sr: int, lo: float = 60.0, hi: float = 500.0) -> float:
    """The f0 (Hz) of a periodic signal: the lag of the autocorrelation's highest peak in [lo, hi] Hz."""
    x = x - x.mean()
    ac = np.correlate(x, x, mode="full")[len(x) - 1:]
    lags = np.arange(int(sr / hi), int(sr / lo) + 1)
    return sr / lags[np.argmax(ac[lags])]


@pytest.mark.parametrize("speed", SPEEDS)
def test_pitch_is_kept(speed: float) -> None:
    sr, f0 = 24000, 180.0
    t = np.arange(int(1.5 * sr)) / sr
    tone = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 6)).astype(np.float32) * 0.2
    out = stretch(tone, speed, sr)
    middle = out[len(out) // 4: len(out) // 4 + sr // 10]  # 100 ms away from the ends
    assert abs(dominant_f0(middle, sr) / f0 - 1) <= 0.03


@pytest.mark.parametrize("speed", (*SPEEDS, 0.75, 1.25, 3.0))
def test_stream_equals_whole(speech: tuple[np.ndarray, int], speed: float) -> None:
    wav, sr = speech
    whole = stretch(wav, speed, sr)
    streamed = in_chunks(Stretcher(speed, sr), wav, (1, 37, 4800, 24000))
    np.testing.assert_array_equal(streamed, whole)
    assert len(whole) == round(len(wav) / speed)


def test_speed_one_is_the_input() -> None:
    wav = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    assert stretch(wav, 1.0, 24000) is wav
    s = Stretcher(1.0, 24000)
    np.testing.assert_array_equal(in_chunks(s, wav, (1, 37, 4800)), wav)


def test_empty_input() -> None:
    s = Stretcher(2.0, 24000)
    assert len(s.push(np.zeros(0, np.float32))) == 0
    assert len(s.flush()) == 0


@pytest.mark.parametrize("speed", (0.2, 4.5, 0.0, -1.0, float("nan"), float("inf")))
def test_speed_out_of_range_is_refused(speed: float) -> None:
    with pytest.raises(ForgeError, match=r"speed must be a number in \[0.25, 4.0\]"):
        stretch(np.zeros(100, np.float32), speed, 24000)
    with pytest.raises(ForgeError, match="speed must be"):
        Stretcher(speed, 24000)


def test_stages_stay_in_atempo_blending_range() -> None:
    for speed in (0.25, 0.3, 0.5, 0.75, 1.25, 2.0, 3.0, 4.0):
        factors = stage_factors(speed)
        assert all(0.5 <= f <= 2.0 for f in factors)
        assert np.prod(factors) == pytest.approx(speed)


def test_missing_pyav_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ForgeError, match=r"chattts-forge\[serve\]"):
        Stretcher(2.0, 24000)
    assert stretch(np.zeros(10, np.float32), 1.0, 24000) is not None  # speed 1 needs nothing
