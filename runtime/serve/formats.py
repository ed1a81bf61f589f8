"""Audio response formats of the server: whole files and chunk-by-chunk streams (soundfile/libsndfile;
aac through PyAV, which libsndfile cannot encode).

What OpenAI's speech API returns, in the forms other people's decoders read whole (docs/serving.md
"Audio formats" lists the decoders checked):

| format | whole (`stream: false`, cache hits) | streamed (the default) | content type |
| --- | --- | --- | --- |
| wav  | 16-bit PCM mono WAV, true RIFF/data sizes | the same header with sizes 0xFFFFFFFF (OpenAI's), then samples as they become final | audio/wav |
| pcm  | raw 16-bit signed little-endian mono samples | the same, chunk by chunk | audio/pcm |
| flac | 16-bit FLAC, STREAMINFO with the sample count and MD5 | buffered: the whole file, sent when the stream ends | audio/flac |
| mp3  | MPEG layer III with its LAME tag (encoder delay and padding) | buffered: the whole file, sent when the stream ends | audio/mpeg |
| opus | Opus in Ogg | Ogg pages as they are written (the last page's granule position ends the audio) | audio/ogg |
| aac  | AAC-LC in ADTS, 64 kbit/s | ADTS frames as the encoder emits them (the bytes of the whole file) | audio/aac |

Why flac and mp3 are buffered: a format whose header must hold the length cannot be streamed
exactly. A live FLAC stream's STREAMINFO says "0 samples" (libsndfile then reports INT64_MAX frames
and python-soundfile's `read` fails); a live MP3 stream has no valid LAME tag, so decoders neither
trim the encoder delay nor the padding (~1,100 samples late; with the zeroed VBR tag libsndfile
drops the tail). A buffered reply carries the streamed waveform (the same samples as the other
formats' streams) in the bytes a whole file of it has.

16-bit formats quantize with `to_int16` (round(x * 32768), clipped): a decoder that divides by 32768
gets every sample within half a step of the float waveform, and the samples are the same whether a
response is whole or streamed. wav, pcm and flac are lossless over what they carry; mp3, opus and aac
are lossy (their decoded audio matches only to the codec's tolerance).

aac (OpenAI's: AAC-LC in ADTS) is encoded by ffmpeg's native `aac` encoder through PyAV (the serve
extra), mono at the server's rate, 64 kbit/s (transparent enough for 24 kHz mono speech at ~8 KB/s).
ADTS is a run of self-delimiting frames with no length anywhere, so it streams truly: a streamed
encode of a waveform is byte for byte its whole encode (PyAV cuts the input into 1,024-sample frames
whatever the chunks; tests/test_serve_edges.py checks it). ADTS cannot signal the encoder's delay:
a decoder (ffmpeg, PyAV, Chromium) returns 1,024 samples of priming (near silence) first, then the
waveform, then up to one frame (1,023 samples) of padding: n + 1,024 <= decoded < n + 2,048.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import soundfile as sf

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.runtime.audio import pcm16_wav_header, to_int16, wav_bytes

# format -> (content type, libsndfile major format, subtype, feeds int16)
_FORMATS: dict[str, tuple[str, str | None, str | None, bool]] = {
    "wav": ("audio/wav", None, None, True),
    "pcm": ("audio/pcm", None, None, True),
    "flac": ("audio/flac", "FLAC", "PCM_16", True),
    "mp3": ("audio/mpeg", "MP3", "MPEG_LAYER_III", False),
    "opus": ("audio/ogg", "OGG", "OPUS", False),
    "aac": ("audio/aac", None, None, False),  # PyAV, not libsndfile (_AacEncoder)
}
FORMATS = tuple(_FORMATS)
LOSSLESS = ("wav", "pcm", "flac")
BUFFERED_WHEN_STREAMED = ("flac", "mp3")  # their headers hold the length (module docstring)
AAC_FRAME = 1024  # samples per AAC-LC frame, and the priming a decoder returns first (module docstring)
AAC_BIT_RATE = 64_000  # mono 24 kHz speech: near transparent, 8 KB/s (a sixth of 16-bit PCM's 48 KB/s)


def check_format(name: object) -> str:
    if not isinstance(name, str) or name not in _FORMATS:
        raise BadInput(f"response_format must be one of {', '.join(FORMATS)}, got {name!r}")
    return name


def check_encoder(fmt: str) -> None:
    """ForgeError (naming the extra to install) when `fmt`'s encoder cannot be imported."""
    if fmt == "aac":
        _av()


def content_type(fmt: str) -> str:
    return _FORMATS[fmt][0]


def encode_whole(wav: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole waveform in `fmt` (wav: the bytes `synth --sample-format pcm16` writes)."""
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    if fmt == "wav":
        return wav_bytes(wav, sample_rate, "pcm16")
    if fmt == "pcm":
        return to_int16(wav).tobytes()
    if fmt == "aac":
        enc = _AacEncoder(sample_rate)
        return enc.write(wav) + enc.close()
    _, major, subtype, ints = _FORMATS[fmt]
    buf = io.BytesIO()
    sf.write(buf, to_int16(wav) if ints else wav, sample_rate, format=major, subtype=subtype)
    return buf.getvalue()


class _Sink(io.RawIOBase):
    """A seekable in-memory file for libsndfile whose bytes are taken as they are written. Bytes the
    encoder rewrites after they were sent (a header's sizes, on close) keep the value sent: streamed
    containers say "length unknown", as live streams do."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0
        self.sent = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        data = bytes(data)
        end = self.pos + len(data)
        if end > len(self.buf):
            self.buf.extend(b"\0" * (end - len(self.buf)))
        self.buf[self.pos : end] = data
        self.pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else len(self.buf) + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = len(self.buf) if n is None or n < 0 else self.pos + n
        out = bytes(self.buf[self.pos : end])
        self.pos += len(out)
        return out

    def take(self) -> bytes:
        out = bytes(self.buf[self.sent :])
        self.sent = len(self.buf)
        return out


def _av() -> Any:
    try:
        import av
    except ModuleNotFoundError:
        raise ForgeError("response_format aac needs PyAV (av): pip install 'chattts-forge[serve]'") from None
    return av


class _AacEncoder:
    """AAC-LC in ADTS (ffmpeg's native encoder through PyAV): `write` returns the frames encoded so far,
    `close` the rest (the encoder's lookahead and the last, zero-padded frame)."""

    def __init__(self, sample_rate: int) -> None:
        av = _av()
        self._av = av
        self.sample_rate = sample_rate
        self._sink = _Sink()
        # flush_packets: each muxed frame reaches the sink at once, not when PyAV's 32 KiB buffer fills
        self._out = av.open(self._sink, "w", format="adts", container_options={"flush_packets": "1"})
        self._stream = self._out.add_stream("aac", rate=sample_rate, layout="mono")
        self._stream.bit_rate = AAC_BIT_RATE
        self._stream.codec_context.profile = "LC"
        self._pts = 0

    def _mux(self, frame: Any) -> bytes:
        for packet in self._stream.encode(frame):
            self._out.mux(packet)
        return self._sink.take()

    def write(self, chunk: np.ndarray) -> bytes:
        if not len(chunk):
            return b""
        # clipped as the 16-bit formats are; planar float is what the aac encoder takes
        planar = np.clip(chunk, -1.0, 1.0).astype(np.float32).reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(planar, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = self.sample_rate, self._pts
        self._pts += planar.shape[1]
        return self._mux(frame)

    def close(self) -> bytes:
        out = self._mux(None)
        self._out.close()
        return out + self._sink.take()


class StreamEncoder:
    """Encode a waveform chunk by chunk: `write(chunk)` and `close()` return the bytes to send now
    (for the buffered formats, nothing until `close()`, which returns the whole file)."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.fmt = check_format(fmt)
        self.sample_rate = sample_rate
        self._started = False
        self._file = None
        self._sink: _Sink | None = None
        self._held: list[np.ndarray] = []  # a buffered format's chunks
        self._aac = _AacEncoder(sample_rate) if fmt == "aac" else None
        if fmt == "opus":
            _, major, subtype, _ = _FORMATS[fmt]
            self._sink = _Sink()
            self._file = sf.SoundFile(self._sink, "w", samplerate=sample_rate, channels=1, format=major,
                                      subtype=subtype)

    def _head(self) -> bytes:
        head = pcm16_wav_header(self.sample_rate, None) if self.fmt == "wav" and not self._started else b""
        self._started = True
        return head

    def write(self, chunk: np.ndarray) -> bytes:
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self.fmt in BUFFERED_WHEN_STREAMED:
            self._held.append(chunk)
            return b""
        if self.fmt in ("wav", "pcm"):
            return self._head() + to_int16(chunk).tobytes()
        if self._aac is not None:
            return self._aac.write(chunk)
        assert self._file is not None and self._sink is not None
        if len(chunk):
            self._file.write(chunk)
            self._file.flush()
        return self._sink.take()

    def close(self) -> bytes:
        if self.fmt in BUFFERED_WHEN_STREAMED:
            wav = np.concatenate(self._held) if self._held else np.zeros(0, np.float32)
            self._held = []
            return encode_whole(wav, self.sample_rate, self.fmt)
        if self._aac is not None:
            out, self._aac = self._aac.close(), None
            return out
        out = self._head()
        if self._file is not None and self._sink is not None:
            self._file.close()
            self._file = None
            out += self._sink.take()
        return out
