"""ChatTTS's speakers, ported: speaker strings (`spk_emb`) and speaker sample prompts (`spk_smp`).

Our own numpy port of ChatTTS 0.2.5's `Speaker` (the tests compare them against ChatTTS itself):

- `decode_speaker` / `encode_speaker` / `speaker_vector` / `apply_speaker` / `sample_random_speaker`
  <- `Speaker._decode` / `_encode` / `apply` / `sample_random`.
- `encode_prompt` / `decode_prompt` <- `Speaker.encode_prompt` / `decode_prompt` (`spk_smp` strings).

Strings a caller hands us are bounded before they are decompressed (`max_encoded_chars`,
`bounded_lzma_decompress`).
"""

from __future__ import annotations

import lzma

import numpy as np
import pybase16384 as b14

from chattts_forge.errors import BadInput, ForgeError

_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]

# Bounds of the speaker strings a caller may hand us (decoded before any model check). ChatTTS's
# speaker vector is hidden_size float16 values (768: 1.5 KB); a spk_smp prompt is [num_vq, T] uint16
# codes with T below the model's positions (4 x 4096: 32 KB). Without a model at hand the defaults
# below hold every real ChatTTS size with room to spare.
DEFAULT_MAX_SPEAKER_VALUES = 1 << 14
DEFAULT_MAX_PROMPT_CODES = 1 << 16


def max_encoded_chars(raw_bytes: int) -> int:
    """The longest base16384 string of an LZMA2 stream holding `raw_bytes` bytes: LZMA2 stores
    incompressible data with 3 bytes of header per 64 KiB chunk; base16384 carries 14 bits a
    character (+ a tail marker). Twice that bounds every honest string; anything longer is refused
    before it is decoded."""
    compressed = raw_bytes + 3 * (raw_bytes // 65536 + 1) + 16
    return 2 * (compressed * 8 // 14 + 8)


def _check_speaker_text(value: object, what: str, limit_chars: int) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > limit_chars:
        raise ForgeError(f"{what} is {len(value)} characters long; no ChatTTS string for this model exceeds "
                         f"{limit_chars}")
    return value


def bounded_lzma_decompress(data: bytes, limit: int, what: str) -> bytes:
    """Decompress a raw LZMA2 stream, producing at most `limit` bytes: a stream that holds more is
    refused when the limit is reached, before anything beyond it is allocated (a 33 KB string can
    otherwise expand to hundreds of MB)."""
    # The dictionary never needs to exceed the output it may produce (raw LZMA2 has no header to read it
    # from; ChatTTS's preset-9 encoder uses 64 MiB, but references cannot reach before the output's start).
    filters = [{"id": lzma.FILTER_LZMA2, "dict_size": max(lzma_dict_min(), limit)}]
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=filters)
    out = dec.decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise ForgeError(f"{what} decompresses to more than {limit} bytes, more than this model takes")
    return out


def lzma_dict_min() -> int:
    return 4096  # liblzma's LZMA_DICT_SIZE_MIN


def decode_speaker(spk_emb: str, max_values: int = DEFAULT_MAX_SPEAKER_VALUES) -> np.ndarray:
    """A ChatTTS speaker string -> float16 vector (`Speaker._decode`), at most `max_values` values
    (the string length is checked before decoding, the decompression stops at the limit)."""
    limit = 2 * max_values
    _check_speaker_text(spk_emb, "speaker string", max_encoded_chars(limit))
    try:
        raw = bounded_lzma_decompress(b14.decode_from_string(spk_emb), limit, "speaker string")
    except (lzma.LZMAError, ValueError, TypeError, UnicodeError, EOFError) as e:
        raise BadInput(f"not a ChatTTS speaker string ({e})") from None
    if len(raw) % 2:
        raise BadInput("not a ChatTTS speaker string (odd byte count)")
    return np.frombuffer(raw, dtype=np.float16).copy()


def encode_speaker(vec: np.ndarray) -> str:
    """float16 vector -> ChatTTS speaker string (`Speaker._encode`)."""
    data = np.asarray(vec, dtype=np.float16).tobytes()
    return b14.encode_to_string(lzma.compress(data, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))


def sample_random_speaker(speaker_stats: np.ndarray, rng: np.random.Generator) -> str:
    """A random speaker like `Speaker.sample_random`: randn * std + mean in float16."""
    std, mean = np.asarray(speaker_stats, dtype=np.float16)
    noise = rng.standard_normal(std.shape[0]).astype(np.float16)
    return encode_speaker(noise * std + mean)


def speaker_vector(spk_emb: str, hidden_size: int) -> np.ndarray:
    """The L2-normalised float32 row ChatTTS injects (normalised in float16, as `Speaker.apply`)."""
    # Bounded by the default (32 KB), not by hidden_size: a speaker of another model's width still decodes,
    # so the message below can say which width it has.
    v = decode_speaker(spk_emb, max_values=max(hidden_size, DEFAULT_MAX_SPEAKER_VALUES))
    if v.shape[0] != hidden_size:
        raise ForgeError(f"speaker embedding has {v.shape[0]} values, the model's hidden size is {hidden_size}")
    norm = np.float16(np.sqrt(np.sum(np.square(v.astype(np.float32)), dtype=np.float32)))
    norm = max(norm, np.float16(1e-12))
    return (v / norm).astype(np.float16).astype(np.float32)


def apply_speaker(emb: np.ndarray, input_ids: np.ndarray, spk_emb_id: int, vec: np.ndarray) -> np.ndarray:
    """Replace the embedding rows of `[spk_emb]` positions by `vec` (in place, also returned)."""
    emb[input_ids[..., 0] == spk_emb_id] = vec
    return emb


def encode_prompt(codes: np.ndarray) -> str:
    """Audio codes [num_vq, T] -> a speaker sample string (`spk_smp`, `Speaker.encode_prompt`):
    base16384 of the uint16 shape, then the LZMA2-compressed little-endian uint16 codes."""
    arr = np.asarray(codes)
    if arr.ndim != 2:
        raise BadInput(f"speaker sample codes must be 2-D [num_vq, T], got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
        raise ForgeError("speaker sample codes must fit in uint16")
    head = np.array(arr.shape, dtype="<u2").tobytes()
    body = lzma.compress(arr.astype("<u2").tobytes(), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    return b14.encode_to_string(head + body)


def decode_prompt(prompt: str, max_codes: int = DEFAULT_MAX_PROMPT_CODES) -> np.ndarray:
    """An audio-sample speaker string (`spk_smp`) -> int codes [num_vq, T] (`Speaker.decode_prompt`).

    At most `max_codes` codes (num_vq x T): the string's length is checked before it is decoded, its
    shape header before anything is decompressed, and the decompression produces exactly the bytes
    the header announces or is refused."""
    _check_speaker_text(prompt, "speaker sample string", max_encoded_chars(2 * max_codes) + 8)
    try:
        dec = b14.decode_from_string(prompt)
        if len(dec) < 4:
            raise ValueError("shorter than its shape header")
        rows, cols = (int(x) for x in np.frombuffer(dec[:4], dtype="<u2"))
        want = rows * cols
        if want > max_codes:
            raise BadInput(f"not a ChatTTS speaker sample string for this model: its header announces "
                             f"{rows} x {cols} codes, more than the {max_codes} it takes")
        raw = bounded_lzma_decompress(dec[4:], 2 * want, "speaker sample string")
        if len(raw) != 2 * want:
            raise ValueError(f"holds {len(raw) // 2} codes, its header announces {rows} x {cols}")
        return np.frombuffer(raw, dtype="<u2").astype(np.int64).reshape(rows, cols)
    except (lzma.LZMAError, ValueError, TypeError, UnicodeError, EOFError) as e:
        raise BadInput(f"not a ChatTTS speaker sample string ({e})") from None
