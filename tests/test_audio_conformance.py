"""Issue 34: the server's audio in other people's decoders.

Every response_format, whole (`stream: false`) and streamed (the default, read chunk by chunk), is
fetched through the official `openai` client from a real running server and decoded by
python-soundfile from memory (every format but aac: libsndfile has no AAC decoder), the standard
library's `wave` (wav), Debian's ffmpeg, PyAV (aac) and Chromium's Web Audio `decodeAudioData`
(headless). Each decoded waveform is compared with the server's PCM reply to the same request (whole
with whole, streamed with streamed):

- lossless formats (wav, pcm, flac): sample-exact 16-bit samples;
- lossy ones (mp3, opus, aac): the same length within one codec frame (`CODEC_FRAME`), aligned (the
  best alignment within `MAX_LAG` samples: the decoder removed the codec's delay) and at least
  `MIN_SNR_DB` there (tiny-model audio is noise-like, the hardest case for a speech codec). aac
  (ADTS) cannot signal its encoder delay: every decoder returns `PRIMING` samples first, which are
  cut before the comparison (so its length is the waveform's plus the priming, plus less than a frame).

The ChatTTS-native endpoint's wav, `synth`'s files (float32 and 16-bit) and the compat API's
waveforms go through soundfile and `wave` too: 16-bit `synth` files equal the server's PCM.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import struct
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from browser import dump_dom
from click.testing import CliRunner

pytest.importorskip("openai", reason="the conformance suite needs the openai client (dev extra)")
httpx = pytest.importorskip("httpx", reason="the conformance suite needs httpx (dev extra)")
from test_serve import Running, running  # noqa: E402

from chattts_forge.cli import main  # noqa: E402
from chattts_forge.runtime.serve.formats import AAC_FRAME, BUFFERED_WHEN_STREAMED, FORMATS, LOSSLESS  # noqa: E402

SR = 24000
TEXT = "Hello there, how are you today?"
# Fixed-length requests (min = max new tokens), refinement off: the suite is about the containers.
KNOBS = {"seed": 4, "refine": False, "max_new_token": 60, "min_new_token": 60}
MODES = ("whole", "streamed")
# samples at 24 kHz: an MPEG-2 layer III frame, 20 ms of Opus, an AAC-LC frame
CODEC_FRAME = {"mp3": 576, "opus": 480, "aac": AAC_FRAME}
PRIMING = {"aac": AAC_FRAME}  # ADTS has no field for the encoder's delay: decoders return it
MAX_LAG = 2
MIN_SNR_DB = {"mp3": 10.0, "opus": 6.0, "aac": 10.0}  # measured on tiny-model audio: mp3 ~17, opus ~12, aac ~17 dB
CHROMIUM_FORMATS = ("wav", "flac", "mp3", "opus", "aac")  # raw pcm has no container a browser can decode
SOUNDFILE_FORMATS = tuple(f for f in FORMATS if f != "aac")  # libsndfile has no AAC decoder (ffmpeg, PyAV read it)


@pytest.fixture(scope="module")
def server(tiny_artifacts: dict[str, Path]) -> Iterator[Running]:
    with running(tiny_artifacts["fp32"], max_batch=4, max_queue=16) as srv:
        yield srv


@pytest.fixture(scope="module")
def replies(server: Running) -> dict[tuple[str, str], bytes]:
    """{(format, mode): the reply's bytes} through the openai client."""
    client = server.client()
    out = {}
    for fmt in FORMATS:
        r = client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy", response_format=fmt,
                                       extra_body={**KNOBS, "stream": False})
        out[fmt, "whole"] = r.content
        with client.audio.speech.with_streaming_response.create(model="tts-1", input=TEXT, voice="alloy",
                                                                response_format=fmt, extra_body=KNOBS) as s:
            assert s.headers["x-forge-cached"] == "false"
            out[fmt, "streamed"] = b"".join(s.iter_bytes())
    return out


def pcm_of(replies: dict[tuple[str, str], bytes], mode: str) -> np.ndarray:
    return np.frombuffer(replies["pcm", mode], "<i2")


def assert_matches(fmt: str, got: np.ndarray, ref16: np.ndarray, decoder: str) -> None:
    """`got`: int16 samples (lossless) or float samples in [-1, 1] (lossy) against the PCM reply."""
    if fmt in LOSSLESS:
        assert got.dtype == np.int16, decoder
        np.testing.assert_array_equal(got, ref16, err_msg=f"{fmt} through {decoder}")
        return
    ref = ref16.astype(np.float64) / 32768
    got = np.asarray(got, dtype=np.float64)
    if fmt in PRIMING:  # the priming comes first; then the waveform and less than a frame of padding
        assert PRIMING[fmt] + len(ref) <= len(got) < PRIMING[fmt] + len(ref) + CODEC_FRAME[fmt], (decoder, fmt,
                                                                                                 len(got), len(ref))
        got = got[PRIMING[fmt]:]
    assert abs(len(got) - len(ref)) <= CODEC_FRAME[fmt], (decoder, fmt, len(got), len(ref))
    lag, snr = best_alignment(ref, got, CODEC_FRAME[fmt])
    assert abs(lag) <= MAX_LAG, (decoder, fmt, "not aligned", lag)
    assert snr >= MIN_SNR_DB[fmt], (decoder, fmt, snr)
    assert best_alignment(ref[::-1].copy(), got, CODEC_FRAME[fmt])[1] < 3.0  # the SNR tells audio apart


def best_alignment(ref: np.ndarray, got: np.ndarray, max_lag: int) -> tuple[int, float]:
    """(lag, SNR in dB) of the alignment of `got` on `ref` with the least error; `got[k + lag]` ~ `ref[k]`."""
    best = (0, -np.inf)
    for lag in range(-max_lag, max_lag + 1):
        a, b = ref[max(0, -lag):], got[max(0, lag):]
        m = min(len(a), len(b))
        err = float(np.sum((a[:m] - b[:m]) ** 2))
        snr = float(10 * np.log10(np.sum(a[:m] ** 2) / max(err, 1e-20)))
        if snr > best[1]:
            best = (lag, snr)
    return best


# ---- the bytes themselves -------------------------------------------------------------------------


def test_wav_is_openai_16_bit_pcm_with_true_sizes_whole_and_unknown_sizes_streamed(replies) -> None:
    for mode in MODES:
        data = replies["wav", mode]
        riff, data_size = struct.unpack_from("<I", data, 4)[0], struct.unpack_from("<I", data, 40)[0]
        assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
        # PCM (1), mono, 24 kHz, 48,000 bytes/s, 2-byte frames, 16 bits: OpenAI's header
        assert struct.unpack_from("<IHHIIHH", data, 16) == (16, 1, 1, SR, 2 * SR, 2, 16)
        if mode == "whole":
            assert (riff, data_size) == (len(data) - 8, len(data) - 44)
        else:
            assert (riff, data_size) == (0xFFFFFFFF, 0xFFFFFFFF)
        assert data[44:] == replies["pcm", mode]


def test_buffered_formats_stream_the_bytes_of_a_whole_file(replies, server: Running) -> None:
    """flac and mp3 cannot carry their length in a live stream: a streamed reply is the whole file of the
    streamed waveform (its STREAMINFO counts the samples; its LAME tag holds delay and padding)."""
    for fmt in BUFFERED_WHEN_STREAMED:
        data = replies[fmt, "streamed"]
        info = sf.info(io.BytesIO(data))
        assert info.frames == len(pcm_of(replies, "streamed")), fmt
    assert replies["flac", "streamed"][:4] == b"fLaC"


# ---- python-soundfile, from memory ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", SOUNDFILE_FORMATS)
def test_soundfile_reads_every_format_from_memory(replies, fmt: str, mode: str) -> None:
    data = io.BytesIO(replies[fmt, mode])
    if fmt == "pcm":
        got, rate = sf.read(data, dtype="int16", format="RAW", subtype="PCM_16", samplerate=SR, channels=1)
    else:
        got, rate = sf.read(data, dtype="int16" if fmt in LOSSLESS else "float32")
    assert rate == SR and got.ndim == 1
    assert_matches(fmt, got, pcm_of(replies, mode), "soundfile")


# ---- the standard library's wave ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_stdlib_wave_reads_wav(replies, mode: str) -> None:
    with wave.open(io.BytesIO(replies["wav", mode]), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getcomptype()) == (1, 2, SR, "NONE")
        got = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert_matches("wav", got, pcm_of(replies, mode), "wave")


# ---- ffmpeg ----------------------------------------------------------------------------------------


def ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("ffmpeg is not installed (.ci/run installs it)")
        pytest.skip("no ffmpeg on this machine (apt-get install -y ffmpeg)")
    return path


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_ffmpeg_decodes_every_format_from_a_pipe(replies, fmt: str, mode: str) -> None:
    lossless = fmt in LOSSLESS
    given = ["-f", "s16le", "-ar", str(SR), "-ac", "1"] if fmt == "pcm" else []
    want = ["-f", "s16le" if lossless else "f32le", "-ac", "1", "-ar", str(SR)]
    proc = subprocess.run([ffmpeg(), "-v", "error", "-nostdin", *given, "-i", "pipe:0", *want, "pipe:1"],
                          input=replies[fmt, mode], capture_output=True, timeout=120)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr.decode()[-1000:]
    got = np.frombuffer(proc.stdout, "<i2" if lossless else "<f4")
    assert_matches(fmt, got, pcm_of(replies, mode), "ffmpeg")


# ---- PyAV (aac: soundfile cannot read it) ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_pyav_decodes_aac(replies, mode: str) -> None:
    av = pytest.importorskip("av", reason="aac needs PyAV (serve extra)")
    data = replies["aac", mode]
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name == "aac"  # ffmpeg's name for the ADTS demuxer
        ctx = container.streams.audio[0].codec_context
        assert (ctx.name, ctx.profile, ctx.sample_rate, ctx.layout.name) == ("aac", "LC", SR, "mono")
        got = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert_matches("aac", got, pcm_of(replies, mode), "PyAV")


# ---- Chromium's Web Audio decodeAudioData -----------------------------------------------------------

_PAGE = """<!doctype html><html><body><script>
const replies = %s;
function b64(buffer) {
  const u = new Uint8Array(buffer); let s = "";
  for (let i = 0; i < u.length; i += 0x8000) s += String.fromCharCode.apply(null, u.subarray(i, i + 0x8000));
  return btoa(s);
}
Promise.all(Object.entries(replies).map(async ([name, data]) => {
  const out = document.createElement("pre"); out.id = "decoded-" + name;
  try {  // a 24 kHz context: decodeAudioData resamples to the context's rate, so none happens here
    const buffer = await new OfflineAudioContext(1, 1, 24000).decodeAudioData(
      Uint8Array.from(atob(data), c => c.charCodeAt(0)).buffer);
    out.textContent = buffer.sampleRate + " " + buffer.numberOfChannels + " " + b64(buffer.getChannelData(0).buffer);
  } catch (e) { out.textContent = "error " + e; }
  document.body.appendChild(out);
}));
</script></body></html>"""


@pytest.fixture(scope="module")
def chromium_decoded(replies, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{"fmt-mode": "RATE CHANNELS BASE64-FLOAT32" or "error ..."} from one headless Chromium page."""
    tmp = tmp_path_factory.mktemp("chromium")
    blobs = {f"{fmt}-{mode}": base64.b64encode(replies[fmt, mode]).decode() for fmt in CHROMIUM_FORMATS
             for mode in MODES}
    page = tmp / "decode.html"
    page.write_text(_PAGE % json.dumps(blobs), encoding="utf-8")
    found: dict[str, str] = {}
    for attempt in range(3):  # the decodes run off the page's thread: a loaded machine may need another look
        dom = dump_dom(page, tmp / f"profile-{attempt}")
        found = dict(re.findall(r'<pre id="decoded-([a-z0-9-]+)">([^<]*)</pre>', dom))
        if len(found) == len(blobs):
            break
    assert set(found) == set(blobs), f"Chromium decoded {sorted(found)} of {sorted(blobs)}"
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", CHROMIUM_FORMATS)
def test_chromium_decode_audio_data(replies, chromium_decoded, fmt: str, mode: str) -> None:
    text = chromium_decoded[f"{fmt}-{mode}"]
    assert not text.startswith("error"), text
    rate, channels, data = text.split(" ")
    assert (int(rate), int(channels)) == (SR, 1)
    floats = np.frombuffer(base64.b64decode(data), "<f4")
    # Web Audio gives floats: Chromium decodes a 16-bit sample s to s / 32768 below zero and s / 32767
    # above (seen on samples >= 16384, where the two differ by one step)
    f64 = floats.astype(np.float64)
    got = np.rint(np.where(f64 > 0, f64 * 32767, f64 * 32768)).astype(np.int16) if fmt in LOSSLESS else floats
    assert_matches(fmt, got, pcm_of(replies, mode), "Chromium decodeAudioData")


# ---- the native endpoint, synth and the compat API through soundfile and wave ------------------------


def test_native_endpoint_wav_through_soundfile_and_wave(server: Running, replies) -> None:
    body = {"text": TEXT, "voice": "alloy", "skip_refine_text": True,
            "params_infer_code": {"manual_seed": KNOBS["seed"], "max_new_token": 60, "min_new_token": 60}}
    for mode, stream in (("whole", False), ("streamed", True)):
        r = httpx.post(server.url + "/v1/chattts/speech", json={**body, "stream": stream}, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"].startswith("audio/wav")  # its default format
        assert r.content == replies["wav", mode]  # the same request as the OpenAI one: the same bytes
        with wave.open(io.BytesIO(r.content), "rb") as w:
            assert_matches("wav", np.frombuffer(w.readframes(w.getnframes()), "<i2"), pcm_of(replies, mode), "wave")
        assert_matches("wav", sf.read(io.BytesIO(r.content), dtype="int16")[0], pcm_of(replies, mode), "soundfile")


def test_native_endpoint_aac_is_the_openai_reply(server: Running, replies) -> None:
    body = {"text": TEXT, "voice": "alloy", "skip_refine_text": True, "response_format": "aac",
            "params_infer_code": {"manual_seed": KNOBS["seed"], "max_new_token": 60, "min_new_token": 60}}
    for mode, stream in (("whole", False), ("streamed", True)):
        r = httpx.post(server.url + "/v1/chattts/speech", json={**body, "stream": stream}, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"] == "audio/aac", r.text[:300]
        assert r.content == replies["aac", mode]  # the same waveform, the same (deterministic) encode


def _synth(tmp_path: Path, artifact: Path, out: str, *extra: str) -> Path:
    path = tmp_path / out
    res = CliRunner().invoke(main, ["synth", "--artifact", str(artifact), "--text", TEXT, "--out", str(path),
                                    "--threads", "1", "--seed", str(KNOBS["seed"]), "--no-refine",
                                    "--max-new-token", "60", "--min-new-token", "60", *extra])
    assert res.exit_code == 0, res.output
    return path


def test_synth_and_compat_outputs_through_soundfile_and_wave(tiny_artifacts, server: Running, replies,
                                                             tmp_path: Path) -> None:
    """`synth --sample-format pcm16` writes the server's PCM (whole and streamed) in a WAV both readers
    read; the default float32 file is exact in soundfile and refused by `wave` (it reads PCM only); the
    compat API's waveform is synth's (less ChatTTS's silent samples) and reads back the same way."""
    import chattts_forge.compat as ChatTTS  # noqa: N812 - ChatTTS's own spelling

    artifact = tiny_artifacts["fp32"]
    alloy = httpx.get(server.url + "/v1/voices").json()["voices"]["alloy"]
    speaker = tmp_path / "alloy.txt"
    speaker.write_text(alloy, encoding="utf-8")
    for mode, stream in (("whole", []), ("streamed", ["--stream"])):
        path = _synth(tmp_path, artifact, f"{mode}.wav", "--sample-format", "pcm16", "--speaker", str(speaker),
                      *stream)
        with wave.open(str(path), "rb") as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, SR)
            assert_matches("wav", np.frombuffer(w.readframes(w.getnframes()), "<i2"), pcm_of(replies, mode), "wave")
        assert_matches("wav", sf.read(path, dtype="int16")[0], pcm_of(replies, mode), "soundfile")
        if mode == "whole":
            assert path.read_bytes() == replies["wav", "whole"]  # byte for byte the server's whole wav
    floats = _synth(tmp_path, artifact, "float.wav", "--speaker", str(speaker))
    samples, rate = sf.read(floats, dtype="float32")
    assert rate == SR and sf.info(str(floats)).subtype == "FLOAT"
    np.testing.assert_array_equal(np.clip(np.rint(samples.astype(np.float64) * 32768), -32768, 32767),
                                  pcm_of(replies, "whole"))
    with pytest.raises(wave.Error, match="unknown format: 3"):
        wave.open(str(floats), "rb")

    chat = ChatTTS.Chat()
    chat.load(source="custom", custom_path=artifact, device="cpu", threads=1)
    # synth speaks "?" as a sentence end; ChatTTS code does too once it registers the spoken form
    from chattts_forge.runtime.spoken import registered

    assert chat.normalizer.register("en", registered("en"))
    params = ChatTTS.Chat.InferCodeParams(spk_emb=alloy, manual_seed=KNOBS["seed"], max_new_token=60,
                                          min_new_token=60)
    [compat] = chat.infer([TEXT], skip_refine_text=True, params_infer_code=params)
    np.testing.assert_array_equal(compat, samples[np.abs(samples) > 1e-5])  # ChatTTS drops |x| <= 1e-5
    from chattts_forge.runtime import write_wav

    written = write_wav(tmp_path / "compat.wav", compat, SR, sample_format="pcm16")
    with wave.open(str(written), "rb") as w:
        via_wave = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    np.testing.assert_array_equal(via_wave, sf.read(written, dtype="int16")[0])
    np.testing.assert_array_equal(via_wave, np.clip(np.rint(compat.astype(np.float64) * 32768), -32768, 32767))
