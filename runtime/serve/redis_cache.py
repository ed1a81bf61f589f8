"""A phrase cache shared by replicas, in Redis (`serve --cache-redis redis://HOST:PORT/DB`).

Seed 004's production setup: every replica looks a miss up in one Redis before synthesizing it and
stores what it synthesized, so a phrase is synthesized once per fleet. The key is the file cache's
entry key (runtime.phrase_cache.entry_key: sha256 of the artifact's payload hash, the normalised
text before refinement and every knob: speaker, speed prompt, sampling, token budget, seed,
Decoder/DVAE, refinement and its knobs), under the prefix `chattts-forge:phrase:`; only requests a
cache can reproduce (seeded, refinement included) use it. A hit is the audio the same request
synthesizes without Redis.

A value is checked like a file-cache entry before it is served: `MAGIC | header length | header
JSON (key, payload, text, n_mels, frames, steps, num_vq) | float32 mel | int16 codes | sha256 of
everything before`. A value that fails any check (damaged, truncated, another key's, another model's
shape) is deleted and counted as a miss, never served and never an error of the request. Redis being
down is logged and counted; the request is synthesized as usual.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge.errors import ForgeError, IntegrityError, Unavailable
from chattts_forge.log import get_logger
from chattts_forge.runtime.phrase_cache import cache_knobs, entry_key, payload_sha256, unseeded

if TYPE_CHECKING:
    from chattts_forge.runtime.pipeline import Pipeline, SynthParams

log = get_logger(__name__)

KEY_PREFIX = "chattts-forge:phrase:"
MAGIC = b"CHATTTS-FORGE-REDIS-PHRASE/1"
_LEN = struct.Struct("<I")


def encode_value(key: str, payload: str, text: str, mel: np.ndarray, codes: np.ndarray) -> bytes:
    mel = np.ascontiguousarray(mel, dtype="<f4")
    codes16 = np.ascontiguousarray(codes, dtype="<i2")
    header = json.dumps({"key": key, "payload_sha256": payload, "text": text, "n_mels": int(mel.shape[0]),
                         "frames": int(mel.shape[1]), "steps": int(codes16.shape[0]),
                         "num_vq": int(codes16.shape[1]) if codes16.ndim == 2 else 0},
                        sort_keys=True, ensure_ascii=False).encode("utf-8")
    body = MAGIC + _LEN.pack(len(header)) + header + mel.tobytes() + codes16.tobytes()
    return body + hashlib.sha256(body).digest()


def decode_value(blob: bytes, key: str, n_mels: int) -> np.ndarray:
    """The mel of a value, after every check (ForgeError naming what failed)."""
    if len(blob) < len(MAGIC) + _LEN.size + 32 or not blob.startswith(MAGIC):
        raise IntegrityError("not a chattts-forge phrase value (bad magic or truncated)")
    body, digest = blob[:-32], blob[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise IntegrityError("damaged value (sha256 mismatch)")
    (head_len,) = _LEN.unpack_from(body, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        header = json.loads(body[start : start + head_len].decode("utf-8"))
        frames, steps, vq = int(header["frames"]), int(header["steps"]), int(header["num_vq"])
        stored_mels = int(header["n_mels"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise IntegrityError(f"unreadable header ({e})") from None
    if header.get("key") != key:
        raise ForgeError("the value belongs to another key")
    if stored_mels != n_mels:
        raise ForgeError(f"mel of {stored_mels} bands, this model has {n_mels}")
    data = body[start + head_len :]
    if len(data) != 4 * n_mels * frames + 2 * steps * vq:
        raise IntegrityError("value length does not match its header")
    return np.frombuffer(data, dtype="<f4", count=n_mels * frames).reshape(n_mels, frames).astype(np.float32)


class RedisPhraseCache:
    """Look-ups and stores of phrase mels in Redis (see the module docstring). Thread-safe."""

    def __init__(self, url: str, ttl_s: int | None = None) -> None:
        try:
            import redis
        except ModuleNotFoundError:
            raise ForgeError("--cache-redis needs the redis package: pip install 'chattts-forge[serve]'") from None
        self.url = url
        self.ttl_s = ttl_s
        try:
            self.client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
            self.client.ping()
        except (redis.RedisError, ValueError) as e:
            raise Unavailable(f"--cache-redis {url}: cannot reach Redis ({e})") from None
        self._payloads: dict[str, str] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = self.rejected = self.errors = 0

    def _key(self, pipe: Pipeline, text: str, params: SynthParams) -> str | None:
        if unseeded(params) is not None:
            return None  # not reproducible: never cached
        path = str(pipe.artifact.path)
        with self._lock:
            if path not in self._payloads:
                self._payloads[path] = payload_sha256(path)
            payload = self._payloads[path]
        return entry_key(payload, text, cache_knobs(params, pipe.num_vq))

    def lookup(self, pipe: Pipeline, text: str, params: SynthParams) -> np.ndarray | None:
        """The phrase's waveform (Vocos on the stored mel), or None: a miss, a rejected value or Redis down."""
        import redis

        key = self._key(pipe, text, params)
        if key is None:
            return None
        try:
            blob = self.client.get(KEY_PREFIX + key)
        except redis.RedisError as e:
            self.errors += 1
            log.warning("redis phrase cache %s: look-up failed (%s); synthesizing", self.url, e)
            return None
        if blob is None:
            self.misses += 1
            return None
        try:
            mel = decode_value(blob, key, pipe.dims.n_mels)
        except ForgeError as e:
            self.rejected += 1
            log.warning("redis phrase cache %s: value of %r refused (%s); deleted, synthesizing", self.url, text, e)
            try:
                self.client.delete(KEY_PREFIX + key)
            except redis.RedisError:
                pass
            return None
        self.hits += 1
        return pipe.vocos(mel) if mel.shape[1] else np.zeros(0, np.float32)

    def store(self, pipe: Pipeline, text: str, params: SynthParams, mel: np.ndarray, codes: np.ndarray) -> bool:
        import redis

        key = self._key(pipe, text, params)
        if key is None:
            return False
        value = encode_value(key, self._payloads[str(pipe.artifact.path)], text, mel, codes)
        try:
            self.client.set(KEY_PREFIX + key, value, ex=self.ttl_s)
        except redis.RedisError as e:
            self.errors += 1
            log.warning("redis phrase cache %s: store failed (%s)", self.url, e)
            return False
        return True

    def stats(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "rejected": self.rejected, "errors": self.errors}
