"""Issue 49: the server's `aac` (OpenAI's: AAC-LC in ADTS, audio/aac), the encoder itself.

runtime/serve/formats.py encodes it with PyAV (ffmpeg's native aac encoder). Checked here without a
server, on a speech-like synthetic waveform: every ADTS header (MPEG-4 AAC-LC, 24 kHz, mono) and the
frames tiling the bytes; a streamed encode (any chunking) giving the whole encode's bytes, in whole
frames as it goes; PyAV's and ffmpeg's decodes being the waveform after the 1,024 samples of priming
ADTS cannot signal (length, alignment, SNR); a missing PyAV as a one-line error and a 400. The
server's replies in every decoder (ffmpeg, PyAV, Chromium, the openai client) are
tests/test_audio_conformance.py's and tests/test_serve.py's.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys

import numpy as np
import pytest

av = pytest.importorskip("av", reason="aac needs PyAV (serve extra)")

from chattts_forge.errors import ForgeError  # noqa: E402
from chattts_forge.runtime.pipeline import SynthParams  # noqa: E402
from chattts_forge.runtime.serve.formats import (  # noqa: E402
    AAC_BIT_RATE,
    AAC_FRAME,
    StreamEncoder,
    check_encoder,
    content_type,
    encode_whole,
)
from chattts_forge.runtime.serve.requests import BadRequest, parse_openai  # noqa: E402

SR = 24000
MIN_SNR_DB = 12.0  # a voiced, harmonic waveform at 64 kbit/s; measured ~22 dB (PyAV and ffmpeg alike)


def speechlike(n: int, seed: int = 0) -> np.ndarray:
    """A voiced-speech stand-in: harmonics of a gliding 120-220 Hz pitch under a syllable-rate
    envelope, a little noise (a pure tone would be too easy for a codec, white noise too hard)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    f0 = 170 + 50 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    return (0.15 * envelope * voiced + 0.01 * rng.standard_normal(n)).astype(np.float32)


def adts_frames(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(MPEG version bit, profile, sampling index, channels, frame length) of each ADTS frame; the
    frames must tile `data` exactly."""
    out, pos = [], 0
    while pos < len(data):
        h = data[pos:pos + 7]
        assert len(h) == 7 and h[0] == 0xFF and h[1] & 0xF0 == 0xF0, f"no ADTS sync word at byte {pos}"
        assert h[1] & 0x06 == 0 and h[1] & 0x01 == 1, "layer 0, no CRC"
        length = ((h[3] & 0x03) << 11) | (h[4] << 3) | (h[5] >> 5)
        out.append(((h[1] >> 3) & 1, h[2] >> 6, (h[2] >> 2) & 0x0F, ((h[2] & 1) << 2) | (h[3] >> 6), length))
        assert length > 7, length
        pos += length
    assert pos == len(data), "the last frame runs past the bytes"
    return out


def pyav_decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    assert all(f.sample_rate == SR and f.layout.name == "mono" for f in frames)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float64)


def ffmpeg_decode(data: bytes) -> np.ndarray:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.skip("no ffmpeg on this machine (apt-get install -y ffmpeg)")
    proc = subprocess.run([ffmpeg, "-v", "error", "-nostdin", "-i", "pipe:0", "-f", "f32le", "-ac", "1", "-ar",
                           str(SR), "pipe:1"], input=data, capture_output=True, timeout=120)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr.decode()[-1000:]
    return np.frombuffer(proc.stdout, "<f4").astype(np.float64)


def best_lag(ref: np.ndarray, got: np.ndarray, lags: range) -> tuple[int, float]:
    """(lag, SNR in dB) of the alignment `got[lag + k]` ~ `ref[k]` with the least error."""
    best = (0, -np.inf)
    for lag in lags:
        b = got[lag:lag + len(ref)]
        a = ref[:len(b)].astype(np.float64)
        snr = float(10 * np.log10(np.sum(a**2) / max(float(np.sum((a - b) ** 2)), 1e-20)))
        if snr > best[1]:
            best = (lag, snr)
    return best


def test_aac_is_aac_lc_mono_24k_in_adts_frames() -> None:
    wav = speechlike(3 * SR)
    data = encode_whole(wav, SR, "aac")
    assert content_type("aac") == "audio/aac"
    frames = adts_frames(data)
    # MPEG-4 (version bit 0), profile 1 (object type 2 - 1: AAC-LC), sampling index 6 (24 kHz), mono
    assert {f[:4] for f in frames} == {(0, 1, 6, 1)}
    # one frame per 1,024 samples: the priming, the waveform, its last partial frame
    assert len(frames) == -(-(len(wav) + AAC_FRAME) // AAC_FRAME)
    # ffmpeg's encoder aims at the bit rate on average (its payload, the 7-byte headers aside)
    payload_bps = (len(data) - 7 * len(frames)) * 8 / (len(frames) * AAC_FRAME / SR)
    assert 0.5 * AAC_BIT_RATE < payload_bps < 1.5 * AAC_BIT_RATE, payload_bps


@pytest.mark.parametrize("cuts", [[], [1], [0, 0, 1023, 1024, 1025], [7, 5000, 5000, 12345, 40000], "random"])
def test_aac_streamed_is_the_whole_encode_byte_for_byte_in_whole_frames(cuts: list[int] | str) -> None:
    wav = speechlike(2 * SR + 317, seed=1)
    if cuts == "random":
        cuts = sorted(np.random.default_rng(2).integers(0, len(wav), 40).tolist())
    enc = StreamEncoder("aac", SR)
    parts = [enc.write(chunk) for chunk in np.split(wav, cuts)]
    last = enc.close()
    assert b"".join(parts) + last == encode_whole(wav, SR, "aac")
    for part in parts:
        adts_frames(part)  # each write hands out whole frames: a client can decode what it has
    if len(cuts) > 1:  # streamed truly: frames go out before the end; close() gives the lookahead's rest
        assert sum(map(len, parts)) > len(last)


@pytest.mark.parametrize("decode", [pyav_decode, ffmpeg_decode], ids=["pyav", "ffmpeg"])
def test_aac_decodes_to_the_waveform_after_the_priming(decode) -> None:
    for n in (1, 1023, 1024, 1025, SR + 317):
        got = decode(encode_whole(speechlike(n, seed=n), SR, "aac"))
        # decoders keep the 1,024 priming samples (ADTS has no field for them) and the last frame's padding
        assert n + AAC_FRAME <= len(got) < n + 2 * AAC_FRAME and len(got) % AAC_FRAME == 0, (n, len(got))
    wav = speechlike(3 * SR + 317, seed=3)
    got = decode(encode_whole(wav, SR, "aac"))
    lag, snr = best_lag(wav, got, range(0, 2 * AAC_FRAME))
    assert abs(lag - AAC_FRAME) <= 2 and snr >= MIN_SNR_DB, (lag, snr)
    # the priming is near silence: what comes first is not an extra copy of the start
    assert np.sqrt(np.mean(got[:AAC_FRAME // 2] ** 2)) < 0.05 * np.sqrt(np.mean(wav.astype(np.float64) ** 2))
    assert best_lag(wav[::-1].copy(), got, range(AAC_FRAME - 2, AAC_FRAME + 3))[1] < 3.0  # SNR tells audio apart


def test_streamed_aac_decodes_as_the_whole_encode() -> None:
    wav = speechlike(SR, seed=4)
    enc = StreamEncoder("aac", SR)
    data = b"".join(enc.write(c) for c in np.array_split(wav, 9)) + enc.close()
    np.testing.assert_array_equal(pyav_decode(data), pyav_decode(encode_whole(wav, SR, "aac")))


def test_without_pyav_aac_is_a_one_line_error_and_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now raises ModuleNotFoundError
    for call in (lambda: check_encoder("aac"), lambda: encode_whole(np.zeros(10, np.float32), SR, "aac"),
                 lambda: StreamEncoder("aac", SR)):
        with pytest.raises(ForgeError, match=r"^response_format aac needs PyAV \(av\): pip install "
                                             r"'chattts-forge\[serve\]'$"):
            call()
    check_encoder("opus")  # the other formats need no PyAV
    body = {"model": "tts-1", "input": "Hi.", "response_format": "aac"}
    with pytest.raises(BadRequest, match="needs PyAV") as e:
        parse_openai(body, SynthParams(), 4096)
    assert e.value.param == "response_format"
    monkeypatch.setitem(sys.modules, "av", av)
    assert parse_openai(body, SynthParams(), 4096).response_format == "aac"
