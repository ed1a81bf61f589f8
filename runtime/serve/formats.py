"""Audio response formats of the server: whole files and chunk-by-chunk streams (soundfile/libsndfile).

What OpenAI's speech API returns, in the forms other people's decoders read whole (docs/serving.md
"Audio formats" lists the decoders checked):

| format | whole (`stream: false`, cache hits) | streamed (the default) | content type |
| --- | --- | --- | --- |
| wav  | 16-bit PCM mono WAV, true RIFF/data sizes | the same header with sizes 0xFFFFFFFF (OpenAI's), then samples as they become final | audio/wav |
| pcm  | raw 16-bit signed little-endian mono samples | the same, chunk by chunk | audio/pcm |
| flac | 16-bit FLAC, STREAMINFO with the sample count and MD5 | buffered: the whole file, sent when the stream ends | audio/flac |
| mp3  | MPEG layer III with its LAME tag (encoder delay and padding) | buffered: the whole file, sent when the stream ends | audio/mpeg |
| opus | Opus in Ogg | Ogg pages as they are written (the last page's granule position ends the audio) | audio/ogg |

Why flac and mp3 are buffered: a format whose header must hold the length cannot be streamed
exactly. A live FLAC stream's STREAMINFO says "0 samples" (libsndfile then reports INT64_MAX frames
and python-soundfile's `read` fails); a live MP3 stream has no valid LAME tag, so decoders neither
trim the encoder delay nor the padding (~1,100 samples late; with the zeroed VBR tag libsndfile
drops the tail). A buffered reply carries the streamed waveform (the same samples as the other
formats' streams) in the bytes a whole file of it has.

16-bit formats quantize with `to_int16` (round(x * 32768), clipped): a decoder that divides by 32768
gets every sample within half a step of the float waveform, and the samples are the same whether a
response is whole or streamed. wav, pcm and flac are lossless over what they carry; mp3 and opus are
lossy (their decoded audio matches only to the codec's tolerance).
"""

from __future__ import annotations

import io

import numpy as np

from chattts_forge.errors import ForgeError
from chattts_forge.runtime.audio import pcm16_wav_header, to_int16, wav_bytes

# format -> (content type, libsndfile major format, subtype, feeds int16)
_FORMATS: dict[str, tuple[str, str | None, str | None, bool]] = {
    "wav": ("audio/wav", None, None, True),
    "pcm": ("audio/pcm", None, None, True),
    "flac": ("audio/flac", "FLAC", "PCM_16", True),
    "mp3": ("audio/mpeg", "MP3", "MPEG_LAYER_III", False),
    "opus": ("audio/ogg", "OGG", "OPUS", False),
}
FORMATS = tuple(_FORMATS)
LOSSLESS = ("wav", "pcm", "flac")
BUFFERED_WHEN_STREAMED = ("flac", "mp3")  # their headers hold the length (module docstring)


def check_format(name: object) -> str:
    if not isinstance(name, str) or name not in _FORMATS:
        raise ForgeError(f"response_format must be one of {', '.join(FORMATS)}, got {name!r}")
    return name


def content_type(fmt: str) -> str:
    return _FORMATS[fmt][0]


def encode_whole(wav: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole waveform in `fmt` (wav: the bytes `synth --sample-format pcm16` writes)."""
    import soundfile as sf

    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    if fmt == "wav":
        return wav_bytes(wav, sample_rate, "pcm16")
    if fmt == "pcm":
        return to_int16(wav).tobytes()
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
        if fmt == "opus":
            import soundfile as sf

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
        out = self._head()
        if self._file is not None and self._sink is not None:
            self._file.close()
            self._file = None
            out += self._sink.take()
        return out
