"""Fuzzing every parser of untrusted input (issue 23 part 8): seeded mutations of real documents.

Each parser gets a fixed number of inputs made from a valid document by a seeded RNG: byte flips,
truncations, inserted garbage, wrong types, huge numbers, deep nesting, absolute and `..` paths,
deleted keys. Every input must give a ForgeError (one line) or a result, never any other exception.
The count of inputs tried per parser is printed (`pytest -s` shows it). Deterministic: the seeds are
fixed, and the counts are bounded to keep the file to a few seconds.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chattts_forge.errors import ForgeError

ROUNDS = 160  # inputs per parser (JSON-level and byte-level mutations together)

_NASTY: list[Any] = [
    None, True, False, 0, -1, 1.5, 10**30, -(10**30), 1e308, float("nan"), "", "x", "/etc/passwd", "../../x",
    "a/../../b", "\0", [], {}, [1, "2", None], {"file": "../x"}, "ｆｐ３２", "0" * 64, "Z" * 4096,
]


# Deep nesting is spliced into the JSON text (a nested Python object would overflow the fuzzer itself).
_DEEP = "__deeply_nested__"
_DEEP_TEXT = {50: "[" * 50 + "0" + "]" * 50, 5000: "[" * 5000 + "0" + "]" * 5000}


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) into a JSON document, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def mutate_json(doc: Any, rng: random.Random) -> Any:
    """One to three structural mutations of a copy of `doc`."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(doc))
        kind = rng.random()
        if kind < 0.6:
            doc = _set(doc, path, copy.deepcopy(rng.choice(_NASTY)))
        elif kind < 0.7:
            doc = _set(doc, path, f"{_DEEP}{rng.choice([50, 5000])}")
        elif kind < 0.85 and path:
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            del parent[path[-1]]
        elif path:
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict):
                parent["../" + str(path[-1])] = parent.pop(path[-1])
    return doc


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte flips, a truncation or inserted garbage."""
    buf = bytearray(data)
    kind = rng.random()
    if kind < 0.4 and buf:
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind < 0.7:
        del buf[rng.randrange(len(buf) + 1):]
    else:
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(buf)


def _dump(doc: Any) -> bytes:
    text = json.dumps(doc)
    for depth, nested in _DEEP_TEXT.items():
        text = text.replace(f'"{_DEEP}{depth}"', nested)
    return text.encode()


class Fuzz:
    """Runs a parser over inputs and counts what each gave; anything but ForgeError is kept."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tried = self.ok = self.refused = 0
        self.crashes: list[str] = []

    def run(self, parse: Callable[[], Any], what: str) -> None:
        self.tried += 1
        try:
            parse()
        except ForgeError as e:
            self.refused += 1
            assert "\n" not in str(e), f"{self.name}: multi-line error for {what}: {e!r}"
        except Exception as e:  # noqa: BLE001 - the point of the test: nothing else may escape
            self.crashes.append(f"{what}: {type(e).__name__}: {str(e)[:200]}")
        else:
            self.ok += 1

    def check(self) -> None:
        print(f"fuzz {self.name}: {self.tried} inputs, {self.ok} accepted, {self.refused} refused (ForgeError)")
        assert not self.crashes, f"{self.name}: {len(self.crashes)} inputs escaped as other exceptions: {self.crashes[:3]}"
        assert self.refused > 0  # the mutations did reach the checks


def _fuzz_file(name: str, seed: int, doc: Any, write: Callable[[bytes], None], parse: Callable[[], Any],
               raw: bytes | None = None) -> None:
    rng = random.Random(seed)
    fuzz = Fuzz(name)
    base = raw if raw is not None else _dump(doc)
    for i in range(ROUNDS):
        data = _dump(mutate_json(doc, rng)) if i % 2 == 0 and doc is not None else mutate_bytes(base, rng)
        write(data)
        fuzz.run(parse, f"input {i}")
    fuzz.check()


# ---- the documents ---------------------------------------------------------------------------


def _artifact_doc() -> dict[str, Any]:
    from chattts_forge.checkpoint.layout import TINY

    sha = "ab" * 32
    return {
        "schema": "chattts-forge/artifact/1", "name": "chattts", "variant": "fp32", "dims": TINY.to_dict(),
        "components": {
            "gpt": {"file": "gpt.onnx", "precision": "fp32", "sha256": sha, "bytes": 10},
            "embed": {"file": "embed.onnx", "precision": "fp32", "sha256": sha, "bytes": 10,
                      "external_data": {"file": "embed.onnx.data", "bytes": 4096, "sha256": sha}},
        },
        "files": {"tokenizer": "tokenizer.json", "speaker_stats": "speaker_stats.npy"},
        "source": {"kind": "synthetic", "hashes": {"a": sha}}, "created_at": "2026-01-01T00:00:00Z",
    }


def test_fuzz_artifact_json(tmp_path: Path) -> None:
    from chattts_forge.artifact import ArtifactMeta

    folder = tmp_path / "art"
    folder.mkdir()

    def parse() -> None:
        meta = ArtifactMeta.load(folder)
        meta.require_dims()
        for name in list(meta.components):
            meta.component_path(folder, name)
            meta.external_data_path(folder, name)
        for key in ("tokenizer", "speaker_stats", "homophones"):
            meta.support_path(folder, key)

    _fuzz_file("artifact.json", 1, _artifact_doc(), (folder / "artifact.json").write_bytes, parse)


def _routing_doc() -> dict[str, Any]:
    from chattts_forge.runtime.router import ROUTING_SCHEMA

    return {"schema": ROUTING_SCHEMA, "model": "m", "version": "v1", "length": "chars", "fallback": "fp32",
            "buckets": [{"name": "short", "min_chars": 1, "max_chars": 10, "variant": "fp32", "reason": "r",
                         "figures": {}},
                        {"name": "long", "min_chars": 11, "max_chars": None, "variant": "fp32", "reason": "r",
                         "figures": {}}],
            "variants": {"fp32": {"manifest_sha256": "0" * 64, "payload_sha256": "1" * 64}}}


def test_fuzz_routing_json(tmp_path: Path) -> None:
    from chattts_forge.runtime.phrase_cache import payload_sha256
    from chattts_forge.runtime.router import load_routing, table_buckets

    version = tmp_path / "v1"
    variant = version / "fp32"
    variant.mkdir(parents=True)
    (variant / "artifact.json").write_text(json.dumps(_artifact_doc()))
    (variant / "manifest.json").write_text("{}")
    doc = _routing_doc()
    doc["variants"]["fp32"]["payload_sha256"] = payload_sha256(variant)
    (version / "routing.json").write_text(json.dumps(doc))
    table_buckets(load_routing(version))  # the unmutated table is accepted

    def parse() -> None:
        table_buckets(load_routing(version))

    _fuzz_file("routing.json", 2, doc, (version / "routing.json").write_bytes, parse)


def _manifest_doc() -> dict[str, Any]:
    return {"schema": "chattts-forge/manifest/1", "model": "m", "version": "v1", "variant": "fp32",
            "created_at": "2026-01-01", "precision": {"gpt": "fp32"}, "total_bytes": 3,
            "source_checkpoint": {"kind": "synthetic", "hashes": {"a": "b"}},
            "gate": {"passed": True, "headline": {"rtf": 0.5}},
            "files": [{"path": "a.txt", "bytes": 3, "sha256": "c" * 64}, {"path": "sub/b.txt", "bytes": 0,
                                                                           "sha256": "d" * 64}]}


def test_fuzz_variant_manifest_and_index(tmp_path: Path) -> None:
    from chattts_forge.publish.index import build_index
    from chattts_forge.publish.verify import verify_variant

    root = tmp_path / "artifacts"
    vdir = root / "m" / "v1" / "fp32"
    (vdir / "sub").mkdir(parents=True)
    (vdir / "a.txt").write_text("abc")
    (tmp_path / "secret").write_text("s")

    def parse() -> None:
        assert all(isinstance(p, str) for p in verify_variant(vdir, check_location=True))
        build_index(root)

    _fuzz_file("manifest.json + index", 3, _manifest_doc(), (vdir / "manifest.json").write_bytes, parse)


def test_fuzz_version_manifest(tmp_path: Path) -> None:
    from chattts_forge.publish.version_files import load_version_manifest, verify_version

    version = tmp_path / "m" / "v1"
    version.mkdir(parents=True)
    (version / "routing.json").write_text(json.dumps(_routing_doc()))
    doc = {"schema": "chattts-forge/version-manifest/1", "model": "m", "version": "v1",
           "variants": {"fp32": "0" * 64}, "routing": {"short": "fp32"}, "phrase_cache": None,
           "files": [{"path": "routing.json", "bytes": 10, "sha256": "e" * 64}]}

    def parse() -> None:
        load_version_manifest(version / "manifest.json")
        assert all(isinstance(p, str) for p in verify_version(version))

    _fuzz_file("version manifest.json", 4, doc, (version / "manifest.json").write_bytes, parse)


def test_fuzz_phrase_cache(tmp_path: Path) -> None:
    """Byte mutations, each once with its trailer recomputed (so the header checks are reached) and
    once without (the trailer check), and JSON mutations of the header behind a valid trailer."""
    import hashlib

    from chattts_forge.runtime.phrase_cache import (
        _DIGEST,
        _LEN,
        MAGIC,
        CachedPhrase,
        PhraseCache,
        encode_cache,
    )

    payload = "a" * 64
    phrases = [(t, "fp32", payload, CachedPhrase(np.full((4, 3), i, np.float32), np.arange(8).reshape(2, 4)))
               for i, t in enumerate(("你好", "hello"))]
    good = encode_cache({"seed": 1, "top_k": 20}, {"fp32": payload}, phrases)
    start = len(MAGIC) + _LEN.size
    (head_len,) = _LEN.unpack_from(good, len(MAGIC))
    header = json.loads(good[start:start + head_len])
    blobs = good[start + head_len:-_DIGEST]
    path = tmp_path / "phrase_cache.bin"

    def parse() -> None:
        cache = PhraseCache(path)
        try:
            for entry in cache.entries.values():
                cache.get(entry["payload_sha256"], entry["text"], cache.knobs)
        finally:
            cache.close()

    rng = random.Random(5)
    fuzz = Fuzz("phrase_cache.bin")
    for i in range(ROUNDS):
        if i % 2 == 0:
            head = _dump(mutate_json(header, rng))
            body = MAGIC + _LEN.pack(len(head)) + head + blobs
        else:
            body = mutate_bytes(good[:-_DIGEST], rng)
        for data in (body + hashlib.sha256(body).digest(), mutate_bytes(body, rng)):
            path.write_bytes(data)
            fuzz.run(parse, f"input {i}")
    fuzz.check()


def test_fuzz_calibration_manifest(tmp_path: Path) -> None:
    from chattts_forge.calibration_data.store import SCHEMA, CalibrationStore

    calib = tmp_path / "calib"
    (calib / "gpt").mkdir(parents=True)
    np.savez(calib / "gpt" / "shard-00000.npz", **{"000000.x": np.zeros(3, np.float32)})
    np.savez(tmp_path / "outside.npz", **{"000000.x": np.ones(3, np.float32)})
    doc = {"schema": SCHEMA, "seed": 0, "components": {"gpt": {"samples": 1, "shards": ["gpt/shard-00000.npz"]}}}

    def parse() -> None:
        store = CalibrationStore(calib)
        store.count("gpt")
        list(store.iter_samples("gpt"))

    _fuzz_file("calibration manifest.json", 6, doc, (calib / "manifest.json").write_bytes, parse)
    shard = (calib / "gpt" / "shard-00000.npz").read_bytes()
    (calib / "manifest.json").write_text(json.dumps(doc))
    _fuzz_file("calibration shard", 7, None, (calib / "gpt" / "shard-00000.npz").write_bytes, parse, raw=shard)


def test_fuzz_gate_toml(tmp_path: Path) -> None:
    from chattts_forge.evaluate.gate import DEFAULT_GATE, load_gate
    from chattts_forge.fsutil import read_toml
    from chattts_forge.quantize.auto import fidelity_targets

    raw = Path(DEFAULT_GATE).read_bytes()
    doc = read_toml(DEFAULT_GATE)
    path = tmp_path / "gate.toml"

    def toml_text(d: Any) -> bytes:
        """A TOML rendering of a (mutated) gate document; values TOML cannot hold become strings."""
        def value(v: Any) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, int | float) and v == v and abs(v) != float("inf"):
                return repr(v)
            if isinstance(v, list):
                return "[" + ", ".join(value(x) for x in v[:50]) + "]"
            return json.dumps(str(v)[:100])

        lines, tables = [], []
        for k, v in (d.items() if isinstance(d, dict) else []):
            (tables if isinstance(v, dict) else lines).append((k, v))
        out = [f"{json.dumps(str(k))} = {value(v)}" for k, v in lines]
        for k, t in tables:
            out.append(f"[{json.dumps(str(k))}]")
            for k2, v2 in t.items():
                out.append(f"{json.dumps(str(k2))} = {value(v2) if not isinstance(v2, dict) else '{}'}")
        return ("\n".join(out) + "\n").encode()

    def parse() -> None:
        load_gate(path)
        try:
            fidelity_targets(path)
        except ForgeError:
            pass

    rng = random.Random(8)
    fuzz = Fuzz("gate TOML")
    for i in range(ROUNDS):
        path.write_bytes(toml_text(mutate_json(doc, rng)) if i % 2 == 0 else mutate_bytes(raw, rng))
        fuzz.run(parse, f"input {i}")
    fuzz.check()


def test_fuzz_corpus_files(tmp_path: Path) -> None:
    from chattts_forge.calibration_data.corpus import load_corpus

    raw = "你好，欢迎使用。\nHello there, how are you?\n\n混合 mixed 文本。\n".encode()
    path = tmp_path / "corpus.txt"
    _fuzz_file("corpus file", 9, None, path.write_bytes, lambda: load_corpus(path), raw=raw)


def test_fuzz_speaker_strings() -> None:
    from chattts_forge.runtime import chattts_speaker

    rng = random.Random(10)
    vec = np.random.default_rng(0).standard_normal(768).astype(np.float16)
    speaker = chattts_speaker.encode_speaker(vec)
    sample = chattts_speaker.encode_prompt(np.random.default_rng(1).integers(0, 625, (4, 50)))
    fuzz = Fuzz("speaker strings")
    alphabet = [chr(c) for c in (0x4E00, 0x4E01, 0x7FFF, 0x8000, 0x3D00, 0x41, 0x10000)]
    for i in range(ROUNDS):
        base = speaker if i % 2 == 0 else sample
        chars = list(base)
        kind = rng.random()
        if kind < 0.4:
            for _ in range(rng.randint(1, 6)):
                chars[rng.randrange(len(chars))] = rng.choice(alphabet)
        elif kind < 0.7:
            chars = chars[: rng.randrange(len(chars))]
        else:
            chars += [rng.choice(alphabet) for _ in range(rng.randint(1, 400))]
        text = "".join(chars)
        fuzz.run(lambda t=text: chattts_speaker.speaker_vector(t, 768), f"spk_emb {i}")
        fuzz.run(lambda t=text: chattts_speaker.decode_prompt(t, 4 * 4096), f"spk_smp {i}")
    for bad in (None, 5, b"x", "", "一" * (1 << 16)):
        fuzz.run(lambda b=bad: chattts_speaker.speaker_vector(b, 768), f"spk_emb {bad!r:.20}")  # type: ignore[arg-type]
        fuzz.run(lambda b=bad: chattts_speaker.decode_prompt(b), f"spk_smp {bad!r:.20}")  # type: ignore[arg-type]
    fuzz.check()


def test_fuzz_request_parameters() -> None:
    from dataclasses import fields, replace

    from chattts_forge.runtime.pipeline import (
        InferCodeParams,
        RefineTextParams,
        SynthParams,
        check_synth_params,
    )

    rng = random.Random(11)
    fuzz = Fuzz("request parameters")
    code_fields = [f.name for f in fields(InferCodeParams)]
    synth_fields = [f.name for f in fields(SynthParams) if f.name not in ("code", "refine")]
    pool = [*_NASTY, "20", 20, 0.7, [0.3, 0.3], [0.3, "x"], np.int64(5), np.float32(0.5), 2**64, -(2**63)]
    for i in range(ROUNDS * 2):
        code = replace(InferCodeParams(), **{rng.choice(code_fields): rng.choice(pool) for _ in range(rng.randint(1, 3))})
        params = SynthParams(code=code)
        if i % 3 == 0:
            params = replace(params, **{rng.choice(synth_fields): rng.choice(pool)})
        if i % 5 == 0:
            params = replace(params, refine=rng.choice([RefineTextParams(top_k=rng.choice(pool)), "refine", 3]))
        fuzz.run(lambda p=params: check_synth_params(p, 4096, 32768), f"params {i}")
    fuzz.run(lambda: check_synth_params({"code": {}}), "a dict")
    fuzz.check()


@pytest.mark.parametrize("text", ["", "x" * 5, "/etc/passwd", "../x", "a\0b", "fp32/../../etc"])
def test_resolve_inside_never_raises_anything_else(tmp_path: Path, text: str) -> None:
    from chattts_forge.fsutil import resolve_inside

    try:
        assert tmp_path in resolve_inside(tmp_path, text, file="f", field="g").parents
    except ForgeError as e:
        assert "\n" not in str(e)
