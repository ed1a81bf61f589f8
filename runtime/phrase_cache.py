"""A warm phrase cache: pre-synthesized mels of frequent phrases, so a hit costs only the vocoder.

A service's frequent phrases ("你好，很高兴为您服务", "请稍等", "Please hold on a moment") are
synthesized once, offline (`chattts-forge warm`, `phrase_cache_build.build_phrase_cache`), and their Decoder output
(the mel, float32 [n_mels, 2T]) and codes are stored. At run time (`Pipeline(..., cache=...)`,
`synth --cache FILE`, `serve`) a text whose normalised form, knobs and artifact match an entry skips
refinement, the code stage (GPT steps, heads, sampling) and the Decoder: Vocos turns the stored mel
into the same waveform a miss computes (the miss runs Vocos on the very same mel).

The cache is transparent: it never changes a knob of a request. A hit returns the audio the same
request synthesizes without the cache; a request whose knobs differ is a miss, synthesized as usual.

Why the mel: it is exactly what the vocoder needs (a hit is one Vocos run), it is 2T x n_mels
floats (at full size 800 bytes a code step, against 3 KB of GPT hidden states or ~96 KB of 24 kHz
float32 audio), and it keeps the cache independent of the waveform length arithmetic.

An entry's key is the sha256 of (the artifact's payload hash, the normalised text before refinement,
the knobs): the code prompt ([speed_N] and the other tags; the server's OpenAI `speed` is applied
to the speed-1 waveform after, so not a knob), speaker string, speaker/text prompt samples, temperature(s),
top-p, top-k, repetition penalty, max/min new tokens, ensure-non-empty, seed, Decoder-or-DVAE, and
refinement: `false` (off), or every knob of it (prompt, sampling, token budget, seed). The whole
request is recorded: an entry also holds the text the code stage spoke (`spoken`, the refined text,
where it is not the entry's text). One cache
holds one set of knobs (recorded in its header) and may hold entries of several artifacts (the
variants a routing table sends phrases to). What is refused or not served:

- a cache built for other artifacts: `check_artifact` (payload hash not among the cache's);
- a request with other knobs (seed, speaker, sampling, prompt, refinement or its knobs,
  Decoder/DVAE) or no seed is never served from the cache: `PipelineCache.servable` says so (logging the first knob that
  differs once) and the request is a miss, synthesized as usual, never an error;
- a damaged or tampered file: the trailing sha256 of the file is checked on open and each entry's
  own sha256 when it is read, naming the file.

File format (one file, deterministic bytes: same artifact, phrases and knobs -> same file)::

    MAGIC (28 bytes) | header length (8 bytes, little-endian) | header JSON (UTF-8, sorted keys) |
    entry data (per entry: float32 mel [n_mels, frames] then int16 codes [steps, num_vq], C order) |
    sha256 of everything before (32 bytes)

Header: ``{"schema", "knobs", "artifacts": [{"variant", "payload_sha256"}], "entries": [{"key",
"text", "spoken" (optional), "payload_sha256", "variant", "offset", "n_mels", "frames", "steps",
"num_vq", "sha256"}]}``. Schema 2 (schema 1 recorded refinement as a flag and was never refined).

In memory, entries are read through a memory map into an LRU of decoded mels bounded by
`max_bytes` (default 64 MiB), so a large cache costs only the entries in use.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge.artifact import ARTIFACT_JSON, VOCODER, ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError, IntegrityError, NotFound
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger
from chattts_forge.runtime.spoken import identity_key, normalizer_identity

if TYPE_CHECKING:
    from chattts_forge.runtime.pipeline import Pipeline, RefineTextParams, Row, SynthParams

log = get_logger(__name__)

CACHE_SCHEMA = "chattts-forge/phrase-cache/2"
MAGIC = b"CHATTTS-FORGE-PHRASE-CACHE/1"
_LEN = struct.Struct("<Q")
_DIGEST = 32
DEFAULT_MAX_BYTES = 64 << 20
# Files an artifact's payload hash covers besides artifact.json (which records every graph's sha256).
PAYLOAD_SUPPORT_KEYS = ("tokenizer", "speaker_stats", "homophones")


def payload_sha256(artifact_dir: str | os.PathLike[str]) -> str:
    """The artifact's payload hash: sha256 over artifact.json (every graph's sha256 and size is in it)
    and the support files the runtime reads (tokenizer, speaker statistics, homophones)."""
    root = Path(artifact_dir)
    meta = ArtifactMeta.load(root)  # one-line ForgeError for a missing or broken artifact.json
    h = hashlib.sha256(ARTIFACT_JSON.encode() + b"\0" + hashlib.sha256((root / ARTIFACT_JSON).read_bytes()).digest())
    for key in PAYLOAD_SUPPORT_KEYS:
        p = meta.support_path(root, key)
        if p.is_file():
            h.update(f"\n{key}\0{sha256_file(p)}".encode())
    return h.hexdigest()


def _sha(value: str | None) -> str | None:
    return None if value is None else hashlib.sha256(value.encode("utf-8")).hexdigest()


_REFINE_KNOBS = ("prompt", "top_p", "top_k", "temperature", "repetition_penalty", "max_new_token", "min_new_token",
                 "ensure_non_empty", "seed")


def refine_knobs(refine: RefineTextParams | None) -> dict[str, Any] | bool:
    """Every knob of a refinement (False: no refinement, as schema 1 wrote it), JSON-ready."""
    if refine is None:
        return False
    return {name: getattr(refine, name) for name in _REFINE_KNOBS}


def cache_knobs(params: SynthParams, num_vq: int) -> dict[str, Any]:
    """What, besides the text and the artifact, decides a phrase's audio (JSON-ready, canonical)."""
    code = params.code
    temps = code.temperature
    temps = [float(t) for t in temps] if isinstance(temps, (list, tuple)) else [float(temps)] * num_vq
    return {
        "prompt": code.prompt,
        "speaker_sha256": _sha(code.spk_emb),
        "spk_smp_sha256": _sha(code.spk_smp),
        "txt_smp_sha256": _sha(code.txt_smp),
        "temperature": temps,
        "top_p": code.top_p,
        "top_k": code.top_k,
        "repetition_penalty": code.repetition_penalty,
        "max_new_token": code.max_new_token,
        "min_new_token": code.min_new_token,
        "ensure_non_empty": code.ensure_non_empty,
        "seed": code.seed,
        "use_decoder": params.use_decoder,
        "refine": refine_knobs(params.refine),
        # the normalizer that made the spoken text (its identity: a new one makes new entries)
        "text_normalization": identity_key(normalizer_identity() if params.text_normalization else None),
    }


def entry_key(payload: str, text: str, knobs: dict[str, Any]) -> str:
    ident = {"payload_sha256": payload, "text": text, "knobs": knobs}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def replay_params(knobs: dict[str, Any], num_vq: int) -> SynthParams:
    """The SynthParams of a request that a cache built with `knobs` serves (e.g. to replay its phrases
    under load). Refused with a one-line ForgeError: knobs that name a speaker or a sample only by
    hash (they cannot be rebuilt from the header), or knobs this runtime cannot rebuild."""
    # a cycle at the top: runtime.pipeline leads back to this module
    from chattts_forge.runtime.pipeline import InferCodeParams, RefineTextParams, SynthParams

    for name in ("speaker_sha256", "spk_smp_sha256", "txt_smp_sha256"):
        if knobs.get(name) is not None:
            raise BadInput(f"the cache's requests used a {name.removesuffix('_sha256')} known only by its hash: "
                             "they cannot be replayed from the cache's header")
    try:
        temps = [float(t) for t in knobs["temperature"]]
        code = InferCodeParams(
            prompt=knobs["prompt"], temperature=temps[0] if len(set(temps)) == 1 else temps, top_p=knobs["top_p"],
            top_k=knobs["top_k"], repetition_penalty=knobs["repetition_penalty"],
            max_new_token=int(knobs["max_new_token"]), min_new_token=int(knobs["min_new_token"]),
            ensure_non_empty=bool(knobs["ensure_non_empty"]), seed=knobs["seed"],
        )
        refine = knobs["refine"]
        refine = None if refine is False else RefineTextParams(**{name: refine[name] for name in _REFINE_KNOBS})
        params = SynthParams(code=code, refine=refine, use_decoder=bool(knobs["use_decoder"]),
                             text_normalization=knobs.get("text_normalization", "off") != "off")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BadInput(f"the cache's knobs cannot be replayed ({type(e).__name__}: {e})") from None
    if cache_knobs(params, num_vq) != knobs:  # e.g. a knob a newer writer added
        raise BadInput("the cache's knobs cannot be replayed: they hold a knob this runtime does not rebuild")
    return params


def unseeded(params: SynthParams) -> str | None:
    """Why a request is not reproducible (so never cached), or None: its sampling or refinement has no seed."""
    if params.code.seed is None:
        return "the request has no seed"
    if params.refine is not None and params.refine.seed is None:
        return "the request's refinement has no seed"
    return None


def check_cacheable(params: SynthParams) -> None:
    """Only a reproducible request can be cached: seeded (its refinement too)."""
    reason = unseeded(params)
    if reason is not None:
        raise BadInput(f"a phrase cache needs a seed ({reason}: unseeded sampling gives different audio every time)")


@dataclass(frozen=True)
class CachedPhrase:
    """What the vocoder needs for one phrase (and its codes, for the Result)."""

    mel: np.ndarray  # float32 [n_mels, frames]
    codes: np.ndarray  # int64 [steps, num_vq]
    spoken: str | None = None  # the text the code stage saw (refined), when known

    @property
    def nbytes(self) -> int:
        return int(self.mel.nbytes + self.codes.nbytes)


# ---- writing -----------------------------------------------------------------------------------


def encode_cache(knobs: dict[str, Any], artifacts: dict[str, str], phrases: Sequence[tuple[str, str, str, CachedPhrase]]) -> bytes:
    """The file's bytes. `artifacts`: {variant: payload}; `phrases`: (text, variant, payload, phrase);
    an entry's `spoken` is its phrase's, recorded where it is not the text itself."""
    entries, blobs, offset = [], [], 0
    for text, variant, payload, phrase in phrases:
        mel = np.ascontiguousarray(phrase.mel, dtype="<f4")
        codes = np.asarray(phrase.codes)
        if codes.size and (codes.min() < np.iinfo(np.int16).min or codes.max() > np.iinfo(np.int16).max):
            raise ForgeError(f"codes of phrase {text!r} do not fit int16")
        codes16 = np.ascontiguousarray(codes, dtype="<i2")
        blob = mel.tobytes() + codes16.tobytes()
        entry = {
            "key": entry_key(payload, text, knobs), "text": text, "variant": variant, "payload_sha256": payload,
            "offset": offset, "n_mels": int(mel.shape[0]), "frames": int(mel.shape[1]),
            "steps": int(codes16.shape[0]), "num_vq": int(codes16.shape[1]) if codes16.ndim == 2 else 0,
            "sha256": hashlib.sha256(blob).hexdigest(),
        }
        if phrase.spoken is not None and phrase.spoken != text:  # refined: what the code stage spoke
            entry["spoken"] = phrase.spoken
        entries.append(entry)
        blobs.append(blob)
        offset += len(blob)
    header = {
        "schema": CACHE_SCHEMA,
        "knobs": knobs,
        "artifacts": [{"variant": v, "payload_sha256": p} for v, p in sorted(artifacts.items())],
        "entries": entries,
    }
    head = json.dumps(header, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    body = MAGIC + _LEN.pack(len(head)) + head + b"".join(blobs)
    return body + hashlib.sha256(body).digest()


def write_cache(path: str | os.PathLike[str], knobs: dict[str, Any], artifacts: dict[str, str],
                phrases: Sequence[tuple[str, str, str, CachedPhrase]]) -> Path:
    """Write a cache file atomically (temp + rename)."""
    path = Path(path)
    atomic_write_bytes(path, encode_cache(knobs, artifacts, phrases))
    return path


# ---- reading -----------------------------------------------------------------------------------


_HEX64 = frozenset("0123456789abcdef")
_ENTRY_COUNTS = ("offset", "n_mels", "frames", "steps", "num_vq")


def _is_sha(x: object) -> bool:
    return isinstance(x, str) and len(x) == 64 and set(x) <= _HEX64


def _read_header(buf: Any, size: int, path: Path) -> tuple[dict[str, Any], int]:
    """(header, start of the entry data) of a mapped cache file whose trailer checked out: the header's
    length, JSON and every field the reader uses validated by type and range, so a crafted file with a
    valid trailer is a one-line ForgeError, never an exception from deep inside a read."""
    where = f"phrase cache {path}"
    (head_len,) = _LEN.unpack_from(buf, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    data_end = size - _DIGEST
    if head_len > data_end - start:
        raise ForgeError(f"{where}: header length {head_len} runs past the end of the file")
    try:
        header = json.loads(bytes(buf[start : start + head_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BadInput(f"{where}: unreadable header ({str(e)[:200]})") from None
    if not isinstance(header, dict) or header.get("schema") != CACHE_SCHEMA:
        got = header.get("schema") if isinstance(header, dict) else None
        raise ForgeError(f"{where}: schema {str(got)[:80]!r} is not {CACHE_SCHEMA!r}")
    check_cache_header(header, data_end - (start + head_len), where)
    return header, start + head_len


def check_cache_header(header: dict[str, Any], data_bytes: int, where: str) -> None:
    """knobs: an object; artifacts: [{variant, payload_sha256}]; entries: [{key, text, variant,
    payload_sha256, sha256, offset, n_mels, frames, steps, num_vq}] with whole counts >= 0 whose
    bytes lie inside the `data_bytes` of entry data."""
    if not isinstance(header.get("knobs"), dict):
        raise BadInput(f"{where}: header 'knobs' must be an object")
    artifacts, entries = header.get("artifacts"), header.get("entries")
    if not isinstance(artifacts, list) or not isinstance(entries, list):
        raise BadInput(f"{where}: header 'artifacts' and 'entries' must be lists")
    for i, a in enumerate(artifacts):
        if not isinstance(a, dict) or not isinstance(a.get("variant"), str) or not _is_sha(a.get("payload_sha256")):
            raise BadInput(f"{where}: artifacts[{i}] must be {{variant, payload_sha256}}")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ForgeError(f"{where}: entries[{i}] is not an object")
        if not all(isinstance(e.get(k), str) for k in ("key", "text", "variant")):
            raise BadInput(f"{where}: entries[{i}] needs 'key', 'text' and 'variant' strings")
        if not isinstance(e.get("spoken", ""), str):
            raise BadInput(f"{where}: entries[{i}] 'spoken' must be a string")
        if not (_is_sha(e.get("payload_sha256")) and _is_sha(e.get("sha256"))):
            raise BadInput(f"{where}: entries[{i}] payload_sha256/sha256 must be 64 hex digits")
        counts = [e.get(k) for k in _ENTRY_COUNTS]
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
            raise BadInput(f"{where}: entries[{i}] {'/'.join(_ENTRY_COUNTS)} must be whole numbers >= 0")
        offset, n_mels, frames, steps, num_vq = counts
        if offset + 4 * n_mels * frames + 2 * steps * num_vq > data_bytes:
            raise ForgeError(f"{where}: entries[{i}] ({e['text'][:40]!r}) lies outside the file's entry data")


class PhraseCache:
    """A cache file opened for serving: checked on open, entries read into a byte-bounded LRU."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = Path(path)
        if max_bytes < 0:
            raise BadInput(f"phrase cache byte limit must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        if not self.path.is_file():
            raise NotFound(f"phrase cache {self.path} does not exist")
        if not os.access(self.path, os.R_OK):
            raise ForgeError(f"phrase cache {self.path} is not readable")
        size = self.path.stat().st_size
        if size < len(MAGIC) + _LEN.size + _DIGEST:
            raise BadInput(f"phrase cache {self.path} is truncated or not a phrase cache ({size} bytes)")
        with open(self.path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise BadInput(f"phrase cache {self.path} is not a chattts-forge phrase cache (bad magic)")
            f.seek(0)
            remaining = size - _DIGEST
            h = hashlib.sha256()
            while remaining:
                chunk = f.read(min(1 << 20, remaining))
                h.update(chunk)
                remaining -= len(chunk)
            if h.digest() != f.read(_DIGEST):
                raise IntegrityError(f"phrase cache {self.path} is damaged or was changed (its sha256 does not match); "
                                 "rebuild it with chattts-forge warm")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            header, self._data_start = _read_header(self._map, size, self.path)
        except BaseException:
            self._map.close()
            raise
        self.knobs: dict[str, Any] = header["knobs"]
        self.artifacts: dict[str, str] = {a["variant"]: a["payload_sha256"] for a in header["artifacts"]}
        self.entries: dict[str, dict[str, Any]] = {e["key"]: e for e in header["entries"]}
        self._lru: OrderedDict[str, CachedPhrase] = OrderedDict()
        self._lock = threading.Lock()  # get() may be called from several serving threads
        self.lru_bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self.entries)

    def texts(self, payload: str | None = None) -> list[str]:
        return [e["text"] for e in self.entries.values() if payload is None or e["payload_sha256"] == payload]

    def check_artifact(self, payload: str, where: str | os.PathLike[str]) -> None:
        """ForgeError unless this cache was built for the artifact with that payload hash."""
        self.check_any({payload}, where)

    def check_any(self, payloads: set[str], where: str | os.PathLike[str]) -> None:
        """ForgeError unless this cache was built for one of the artifacts with those payload hashes
        (`where`: the artifact or version folder they are the variants of)."""
        if not payloads & set(self.artifacts.values()):
            made_for = ", ".join(f"{v} {p[:12]}" for v, p in sorted(self.artifacts.items())) or "nothing"
            theirs = ", ".join(sorted(p[:12] for p in payloads))
            raise ForgeError(f"phrase cache {self.path} was built for other artifacts ({made_for}), not {where} "
                             f"(payload {theirs}); rebuild it with chattts-forge warm")

    def knob_difference(self, knobs: dict[str, Any]) -> str | None:
        """The first knob that differs from the ones the cache was built with ("name: cache X, request
        Y"), or None when the request's knobs are the cache's."""
        for name in sorted(set(self.knobs) | set(knobs)):
            if self.knobs.get(name) != knobs.get(name):
                return f"{name}: cache {self.knobs.get(name)!r}, request {knobs.get(name)!r}"
        return None

    def check_knobs(self, knobs: dict[str, Any]) -> None:
        """ForgeError naming the first knob that differs from the ones the cache was built with."""
        for name in sorted(set(self.knobs) | set(knobs)):
            if self.knobs.get(name) != knobs.get(name):
                raise ForgeError(f"phrase cache {self.path} was built with {name}={self.knobs.get(name)!r}, this "
                                 f"request has {name}={knobs.get(name)!r}; it is not served for other knobs")

    def get(self, payload: str, text: str, knobs: dict[str, Any]) -> CachedPhrase | None:
        """The phrase of (artifact payload, normalised text, knobs), or None (a miss). Thread-safe."""
        key = entry_key(payload, text, knobs)
        with self._lock:
            return self._get(key)

    def _get(self, key: str) -> CachedPhrase | None:
        hit = self._lru.get(key)
        if hit is not None:
            self._lru.move_to_end(key)
            self.hits += 1
            return hit
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        phrase = self._read(entry)
        self.hits += 1
        if phrase.nbytes <= self.max_bytes:
            self._lru[key] = phrase
            self.lru_bytes += phrase.nbytes
            while self.lru_bytes > self.max_bytes:
                _, old = self._lru.popitem(last=False)
                self.lru_bytes -= old.nbytes
        return phrase

    def _read(self, entry: dict[str, Any]) -> CachedPhrase:
        mel_bytes = 4 * entry["n_mels"] * entry["frames"]
        code_bytes = 2 * entry["steps"] * entry["num_vq"]
        a = self._data_start + entry["offset"]
        blob = self._map[a : a + mel_bytes + code_bytes]
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            raise IntegrityError(f"phrase cache {self.path}: the entry of {entry['text']!r} is damaged (sha256 mismatch)")
        mel = np.frombuffer(blob, dtype="<f4", count=entry["n_mels"] * entry["frames"]).reshape(entry["n_mels"], entry["frames"])
        codes = np.frombuffer(blob, dtype="<i2", offset=mel_bytes).reshape(entry["steps"], entry["num_vq"])
        return CachedPhrase(mel=mel.astype(np.float32), codes=codes.astype(np.int64),
                            spoken=entry.get("spoken", entry["text"]))

    def evict(self) -> int:
        """Drop every decoded entry held in memory (a server short of memory); the bytes freed."""
        freed = self.lru_bytes
        self._lru.clear()
        self.lru_bytes = 0
        return freed

    def close(self) -> None:
        self._map.close()


class PipelineCache:
    """A `PhraseCache` attached to one `Pipeline` (its artifact checked once): what `Pipeline(cache=)` holds.

    `entries_of`: serve the entries of another artifact folder through this pipeline (a server whose
    host routes a bucket to another variant than the build did, serving the build's route's entries):
    only when the two artifacts' vocoders are the same files, so a hit is the waveform that artifact
    serves for the entry; ForgeError otherwise, as for a cache without that artifact's entries.
    """

    def __init__(self, cache: PhraseCache, pipe: Pipeline, entries_of: str | os.PathLike[str] | None = None) -> None:
        self.cache = cache
        source = pipe.artifact.path if entries_of is None else Path(entries_of)
        if entries_of is not None:
            check_same_vocoder(pipe.artifact.path, source)
        self.payload = payload_sha256(source)
        cache.check_artifact(self.payload, source)
        self._told: set[str] = set()  # reasons a request was not served, logged once each

    def servable(self, pipe: Pipeline, params: SynthParams) -> dict[str, Any] | None:
        """The request's knobs when the cache can serve it, None when it cannot (unseeded, or other
        knobs than the cache's): such a request is a miss, synthesized as usual (logged once per
        reason), never an error."""
        reason = unseeded(params)
        knobs = cache_knobs(params, pipe.num_vq)
        if reason is None:
            diff = self.cache.knob_difference(knobs)
            reason = None if diff is None else f"its knobs differ from the cache's ({diff})"
        if reason is None:
            return knobs
        kind = reason.split(" (")[1].split(":")[0] if " (" in reason else reason  # the knob, not its value
        if kind not in self._told:  # once per knob: a server sees every seed, the set must stay small
            self._told.add(kind)
            log.info("phrase cache %s not used: %s; synthesized as usual (logged once per knob)",
                     self.cache.path, reason)
        self.cache.misses += 1
        return None

    def synthesize_rows(self, pipe: Pipeline, norm: Sequence[str], params: SynthParams,
                        owner: Sequence[int] | None = None) -> list[Row]:
        """A `Row` per normalised text (before refinement): hits from the cache (Vocos only), misses
        refined (if asked) and synthesized together as one batch, as `Pipeline.synthesize` does
        without a cache. A hit's hiddens are empty [0, hidden]: the code stage did not run. A request
        the cache cannot serve (`servable`) is synthesized whole. `owner`: as `refine_texts`'s."""
        knobs = self.servable(pipe, params)
        found = [self.cache.get(self.payload, t, knobs) for t in norm] if knobs is not None else [None] * len(norm)
        missing = [r for r, f in enumerate(found) if f is None]
        spoken = pipe.refine_texts([norm[r] for r in missing], params,
                                   None if owner is None else [owner[r] for r in missing])
        synthesized = pipe.synthesize_rows(spoken, params) if missing else []
        out: list[Row] = []
        done = iter(zip(synthesized, spoken, strict=True))
        for phrase in found:
            if phrase is None:
                row, text = next(done)
                out.append(row._replace(text=text))
            else:
                out.append(self._row(pipe, phrase))
        if knobs is not None:
            log.debug("phrase cache %s: %d hit(s), %d miss(es)", self.cache.path, len(norm) - len(missing),
                      len(missing))
        return out

    def lookup(self, pipe: Pipeline, norm: str, params: SynthParams) -> Row | None:
        """One normalised text (before refinement) served from the cache (Vocos only), or None on a
        miss: what a service does before refining a miss and handing it to the scheduler.
        Thread-safe (Vocos runs outside the cache's lock)."""
        knobs = self.servable(pipe, params)
        if knobs is None:
            return None
        phrase = self.cache.get(self.payload, norm, knobs)
        return None if phrase is None else self._row(pipe, phrase)

    @staticmethod
    def _row(pipe: Pipeline, phrase: CachedPhrase) -> Row:
        """A hit's Row: the stored codes, no hidden states (the code stage did not run), Vocos on the mel."""
        # a cycle at the top: runtime.pipeline leads back to this module
        from chattts_forge.runtime.pipeline import Row

        wav = pipe.vocos(phrase.mel) if phrase.mel.shape[1] else np.zeros(0, np.float32)
        return Row(phrase.codes, np.zeros((0, pipe.dims.hidden_size), dtype=np.float32), wav, cached=True,
                   text=phrase.spoken)


def check_same_vocoder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
    """ForgeError unless artifacts `a` and `b` record the same vocoder graph and weights (sha256)."""
    def vocoder(folder: str | os.PathLike[str]) -> tuple[Any, Any]:
        record = ArtifactMeta.load(folder).components.get(VOCODER) or {}
        return record.get("sha256"), (record.get("external_data") or {}).get("sha256")

    va, vb = vocoder(a), vocoder(b)
    if va[0] is None or va != vb:
        raise ForgeError(f"{b} and {a} do not share their vocoder: the entries of one are not the other's audio")


def open_cache(cache: PhraseCache | str | os.PathLike[str], pipe: Pipeline) -> PipelineCache:
    """`Pipeline(cache=...)`: a path or an open PhraseCache, checked against the pipeline's artifact."""
    return PipelineCache(cache if isinstance(cache, PhraseCache) else PhraseCache(cache), pipe)
