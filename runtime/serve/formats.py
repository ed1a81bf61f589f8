"""Audio response formats of the server: whole files and chunk-by-chunk streams (soundfile/libsndfile).

| format | what is sent | content type |
| --- | --- | --- |
| wav  | float32 mono WAV, as `synth` writes it (a stream's header has unknown sizes, 0xFFFFFFFF) | audio/wav |
| pcm  | raw 16-bit signed little-endian mono samples (OpenAI's `pcm`) | audio/pcm |
| flac | 16-bit FLAC (a stream's STREAMINFO has an unknown length, like any live FLAC) | audio/flac |
| mp3  | MPEG layer III | audio/mpeg |
| opus | Opus in Ogg | audio/ogg |

16-bit formats quantize with `to_int16` (round(x * 32768), clipped): a decoder that divides by 32768
gets every sample within half a step of the float waveform, and the bytes are the same whether a
response is whole or streamed. wav, pcm and flac are lossless over what they carry; mp3 and opus are
lossy (their decoded audio matches only to the codec's tolerance).
"""

from __future__ import annotations

import io
import struct

import numpy as np

from chattts_forge.errors import ForgeError

# format -> (content type, libsndfile major format, subtype, feeds int16)
_FORMATS: dict[str, tuple[str, str | None, str | None, bool]] = {
    "wav": ("audio/wav", None, None, False),
    "pcm": ("audio/pcm", None, None, True),
    "flac": ("audio/flac", "FLAC", "PCM_16", True),
    "mp3": ("audio/mpeg", "MP3", "MPEG_LAYER_III", False),
    "opus": ("audio/ogg", "OGG", "OPUS", False),
}
FORMATS = tuple(_FORMATS)
LOSSLESS = ("wav", "pcm", "flac")


def check_format(name: object) -> str:
    if not isinstance(name, str) or name not in _FORMATS:
        raise ForgeError(f"response_format must be one of {', '.join(FORMATS)}, got {name!r}")
    return name


def content_type(fmt: str) -> str:
    return _FORMATS[fmt][0]


def to_int16(wav: np.ndarray) -> np.ndarray:
    """float samples -> int16 (round(x * 32768), clipped to [-32768, 32767])."""
    return np.clip(np.rint(np.asarray(wav, dtype=np.float64) * 32768.0), -32768, 32767).astype("<i2")


def _wav_header(sample_rate: int, data_bytes: int) -> bytes:
    """A float32 mono WAV header (format 3, IEEE float); sizes 0xFFFFFFFF when unknown (a stream)."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + struct.pack("<IHHIIHH", 16, 3, 1, sample_rate,
            sample_rate * 4, 4, 32) + b"data" + struct.pack("<I", data_bytes))


def encode_whole(wav: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole waveform in `fmt` (wav: the bytes `synth` writes)."""
    import soundfile as sf

    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    if fmt == "wav":
        from chattts_forge.runtime.audio import wav_bytes

        return wav_bytes(wav, sample_rate)
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
    """Encode a waveform chunk by chunk: `write(chunk)` and `close()` return the bytes to send now."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.fmt = check_format(fmt)
        self.sample_rate = sample_rate
        self._started = False
        self._file = None
        self._sink: _Sink | None = None
        if fmt not in ("wav", "pcm"):
            import soundfile as sf

            _, major, subtype, _ = _FORMATS[fmt]
            self._sink = _Sink()
            self._file = sf.SoundFile(self._sink, "w", samplerate=sample_rate, channels=1, format=major,
                                      subtype=subtype)

    def write(self, chunk: np.ndarray) -> bytes:
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        head = b""
        if self.fmt == "wav" and not self._started:
            head = _wav_header(self.sample_rate, 0xFFFFFFFF)
        self._started = True
        if self.fmt == "wav":
            return head + chunk.astype("<f4").tobytes()
        if self.fmt == "pcm":
            return to_int16(chunk).tobytes()
        assert self._file is not None and self._sink is not None
        if len(chunk):
            self._file.write(to_int16(chunk) if _FORMATS[self.fmt][3] else chunk)
            self._file.flush()
        return self._sink.take()

    def close(self) -> bytes:
        out = b""
        if self.fmt == "wav" and not self._started:
            out = _wav_header(self.sample_rate, 0xFFFFFFFF)
        self._started = True
        if self._file is not None and self._sink is not None:
            self._file.close()
            self._file = None
            out += self._sink.take()
        return out
