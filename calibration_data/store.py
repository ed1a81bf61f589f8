"""The on-disk calibration set: sharded .npz files of recorded graph inputs plus a manifest.

Layout of a calibration folder (written by `calibrate`, read by `quantize --method static`)::

    manifest.json                    # schema, artifact, corpus (name, sha256), seed, settings, counts
    gpt/shard-00000.npz ...          # one sample = one recorded session.run feed
    head_code/shard-00000.npz ...
    decoder/shard-00000.npz ...
    dvae/shard-00000.npz ...

Inside a shard, sample `i` of the component is stored as arrays named `"{i:06d}.{graph input name}"`.
Past key/value inputs of the GPT are stored as float16 (halves the disk use; their ranges are not
quantized, MatMuls with a constant weight are) and read back as float32.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import portable_path, recorded_path, resolve_inside

SCHEMA = "chattts-forge/calibration/1"
MANIFEST = "manifest.json"
COMPONENTS = ("gpt", "head_code", "decoder", "dvae")
DEFAULT_SHARD_BYTES = 64 << 20


def _stored(name: str, arr: np.ndarray) -> np.ndarray:
    if name.startswith("past_key_values.") and arr.dtype == np.float32:
        return arr.astype(np.float16)
    return np.ascontiguousarray(arr)


def sample_bytes(sample: dict[str, np.ndarray]) -> int:
    """Bytes a sample takes on disk (after the float16 storage of past key/values)."""
    total = 0
    for name, arr in sample.items():
        itemsize = 2 if name.startswith("past_key_values.") and arr.dtype == np.float32 else arr.dtype.itemsize
        total += int(arr.size) * itemsize
    return total


class ShardWriter:
    """Appends samples of one component into shard files of about `shard_bytes` each."""

    def __init__(self, root: Path, component: str, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.dir = root / component
        self.component = component
        self.shard_bytes = shard_bytes
        self.count = 0
        self.bytes = 0
        self.shards: list[str] = []
        self._pending: dict[str, np.ndarray] = {}
        self._pending_bytes = 0

    def add(self, sample: dict[str, np.ndarray]) -> None:
        for name, arr in sample.items():
            self._pending[f"{self.count:06d}.{name}"] = _stored(name, np.asarray(arr))
        size = sample_bytes(sample)
        self._pending_bytes += size
        self.bytes += size
        self.count += 1
        if self._pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        rel = f"{self.component}/shard-{len(self.shards):05d}.npz"
        np.savez(self.dir.parent / rel, **self._pending)
        self.shards.append(rel)
        self._pending = {}
        self._pending_bytes = 0


def check_calibration_manifest(manifest: Any, where: str | os.PathLike[str]) -> None:
    """Schema and the types `CalibrationStore` reads: components {name: {"shards": [str], "samples": int >= 0}}."""
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else None
        raise ForgeError(f"{where}: schema {str(got)[:80]!r} is not {SCHEMA!r}")
    comps = manifest.get("components", {})
    if not isinstance(comps, dict):
        raise ForgeError(f"{where}: 'components' must be an object")
    for name, comp in comps.items():
        if not isinstance(comp, dict):
            raise ForgeError(f"{where}: components.{name} must be an object")
        shards, samples = comp.get("shards", []), comp.get("samples", 0)
        if not isinstance(shards, list) or not all(isinstance(r, str) for r in shards):
            raise ForgeError(f"{where}: components.{name}.shards must be a list of file names")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ForgeError(f"{where}: components.{name}.samples must be a whole number >= 0, got {str(samples)[:40]!r}")


class CalibrationStore:
    """Read access to a calibration folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not self.path.is_dir():
            raise ForgeError(f"calibration folder {self.path} does not exist (run `chattts-forge calibrate`)")
        try:
            self.manifest: dict[str, Any] = json.loads(mpath.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ForgeError(f"{mpath} is missing: {self.path} is not a calibration folder") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise ForgeError(f"{mpath} is unreadable: {str(e)[:200]}") from None
        check_calibration_manifest(self.manifest, mpath)
        self._shards: dict[str, list[Path]] = {}
        for name, comp in self.manifest.get("components", {}).items():
            paths = [resolve_inside(self.path, rel, file=mpath, field=f"components.{name}.shards[{i}]")
                     for i, rel in enumerate(comp.get("shards", []))]
            for shard in paths:
                if not shard.is_file():
                    raise ForgeError(f"calibration shard {shard} is missing")
            self._shards[name] = paths

    def count(self, component: str) -> int:
        return int(self.manifest.get("components", {}).get(component, {}).get("samples", 0))

    def iter_samples(self, component: str) -> Iterator[dict[str, np.ndarray]]:
        """Samples in recording order, every float array as float32."""
        for path in self._shards.get(component, []):
            by_index: dict[str, dict[str, np.ndarray]] = {}
            try:  # allow_pickle stays off: a shard holds plain arrays only
                with np.load(path, allow_pickle=False) as shard:
                    for key in shard.files:
                        idx, _, name = key.partition(".")
                        by_index.setdefault(idx, {})[name] = shard[key]
            except Exception as e:  # noqa: BLE001 - numpy/zipfile/zlib raise many types on a damaged .npz
                raise ForgeError(f"calibration shard {path} is unreadable ({type(e).__name__}: {str(e)[:200]})") from None
            for idx in sorted(by_index):
                yield {
                    n: a.astype(np.float32) if a.dtype == np.float16 else a for n, a in by_index[idx].items()
                }

    def describe(self, relative_to: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """What artifact.json records about the calibration set used; with `relative_to` (the artifact
        folder that records it) every path is made relative to that folder."""
        m = copy.deepcopy(self.manifest)

        def rel(p: str) -> str:
            return p if relative_to is None else portable_path(p, relative_to)

        corpus = m.get("corpus")
        if isinstance(corpus, dict) and isinstance(corpus.get("files"), list):
            corpus["files"] = [rel(f) for f in corpus["files"]]
        art = m.get("artifact")
        if isinstance(art, dict) and art.get("path"):
            art_dir = Path(art["path"])
            source = art.get("source")
            if isinstance(source, dict) and source.get("asset_dir"):  # relative to the FP32 folder
                source["asset_dir"] = rel(str(recorded_path(source["asset_dir"], art_dir)))
            art["path"] = rel(art["path"])
        return {
            "path": rel(str(self.path)),
            "corpus": corpus,
            "seed": m.get("seed"),
            "samples": {k: v.get("samples", 0) for k, v in m.get("components", {}).items()},
            "sentences": m.get("sentences"),
            "source_artifact": art,
        }
