"""The on-disk calibration set: streamed statistics, a bounded seeded sample of raw inputs, a manifest.

Layout of a calibration folder (written by `calibrate`, read by `quantize`)::

    manifest.json                    # schema, artifact, corpus, sentences (sha256, per file), bounds
    statistics.npz                   # `statistics.Statistics`: ranges, histograms, importance, KV absmax
    gpt/sample-<key>.npz ...         # the raw sample: one file = one recorded session.run feed
    head_code/sample-<key>.npz ...
    decoder/sample-<key>.npz ...
    dvae/sample-<key>.npz ...

The raw sample of a component is the recorded inputs with the smallest seeded keys
(`statistics.sample_key`) such that at most `RawSampleBounds.count` of them fit in their byte share;
it serves the quantizers that must see raw tensors (GPTQ, auto's sensitivity, the fused graph's parity
check). Inside a file the arrays are named `"{i:06d}.{graph input name}"` (i = 0). Past key/value
inputs of the GPT are stored as float16 (halves the disk use; their ranges are not quantized, MatMuls
with a constant weight are) and read back as float32.
"""

from __future__ import annotations

import bisect
import copy
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import DECODER, DVAE, GPT, HEAD_CODE
from chattts_forge.calibration_data.statistics import STATS_FILE, Statistics
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import portable_path, recorded_path, resolve_inside

SCHEMA = "chattts-forge/calibration/2"
OLD_SCHEMAS = ("chattts-forge/calibration/1",)
MANIFEST = "manifest.json"
COMPONENTS = (GPT, HEAD_CODE, DECODER, DVAE)


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


@dataclass(frozen=True)
class RawSampleBounds:
    """How many raw inputs of a component the sample keeps at most, and in how many bytes."""

    count: int
    bytes: int


class RawSample:
    """The kept raw inputs of one component: the smallest keys whose running byte total fits.

    Streaming and batch agree: adding an input can only move the cut-off to a smaller key, so an
    input dropped once is never part of the final sample. Kept inputs are spilled to their own file
    at once (memory holds only keys); dropped ones are deleted."""

    def __init__(self, root: Path, component: str, bounds: RawSampleBounds) -> None:
        self.dir = root / component
        self.component = component
        self.bounds = bounds
        self.kept: list[tuple[float, int, str]] = []  # (key, bytes, relative file), ascending key
        self.offered = 0

    @property
    def bytes(self) -> int:
        return sum(b for _, b, _ in self.kept)

    def would_keep(self, key: float) -> bool:
        """False when `key` is past the cut-off already (the caller need not copy the input)."""
        return len(self.kept) < self.bounds.count or key < self.kept[-1][0]

    def offer(self, key: float, sample: dict[str, np.ndarray] | None, size: int | None = None) -> bool:
        """Consider one input; `sample` None means it would not be kept (only counted)."""
        self.offered += 1
        if sample is None or not self.would_keep(key):
            return False
        size = sample_bytes(sample) if size is None else size
        rel = f"{self.component}/sample-{int(key * 2**64):016x}.npz"
        self.dir.mkdir(parents=True, exist_ok=True)
        np.savez(self.dir.parent / rel, **{f"{0:06d}.{n}": _stored(n, np.asarray(a)) for n, a in sample.items()})
        bisect.insort(self.kept, (key, size, rel))
        self._cut()
        return any(r == rel for _, _, r in self.kept)

    def adopt(self, key: float, size: int, src: Path) -> None:
        """Take over a kept input of an earlier run (`--merge`): copied in, then cut like a new one."""
        rel = f"{self.component}/{src.name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, self.dir.parent / rel)
        self.offered += 1
        bisect.insort(self.kept, (key, size, rel))
        self._cut()

    def _cut(self) -> None:
        total, keep = 0, 0
        for _, size, _ in self.kept:
            if keep >= self.bounds.count or total + size > self.bounds.bytes:
                break
            total += size
            keep += 1
        for _, _, rel in self.kept[keep:]:
            (self.dir.parent / rel).unlink(missing_ok=True)
        del self.kept[keep:]

    def record(self) -> dict[str, Any]:
        return {"samples": len(self.kept), "bytes": self.bytes, "offered": self.offered,
                "bounds": {"count": self.bounds.count, "bytes": self.bounds.bytes},
                "shards": [rel for _, _, rel in self.kept],
                "keys": [key for key, _, _ in self.kept], "sizes": [size for _, size, _ in self.kept]}


def check_calibration_manifest(manifest: Any, where: str | os.PathLike[str]) -> None:
    """Schema and the types `CalibrationStore` reads: components {name: {"shards": [str], "samples": int >= 0}}."""
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else None
        raise ForgeError(f"{where}: schema {str(got)[:80]!r} is not {SCHEMA!r}")
    comps = manifest.get("components", {})
    if not isinstance(comps, dict):
        raise BadInput(f"{where}: 'components' must be an object")
    for name, comp in comps.items():
        if not isinstance(comp, dict):
            raise BadInput(f"{where}: components.{name} must be an object")
        shards, samples = comp.get("shards", []), comp.get("samples", 0)
        if not isinstance(shards, list) or not all(isinstance(r, str) for r in shards):
            raise BadInput(f"{where}: components.{name}.shards must be a list of file names")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise BadInput(f"{where}: components.{name}.samples must be a whole number >= 0, got {str(samples)[:40]!r}")


class CalibrationStore:
    """Read access to a calibration folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not self.path.is_dir():
            raise NotFound(f"calibration folder {self.path} does not exist (run `chattts-forge calibrate`)")
        try:
            self.manifest: dict[str, Any] = json.loads(mpath.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BadInput(f"{mpath} is missing: {self.path} is not a calibration folder") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise BadInput(f"{mpath} is unreadable: {str(e)[:200]}") from None
        if isinstance(self.manifest, dict) and self.manifest.get("schema") in OLD_SCHEMAS:
            raise ForgeError(f"{self.path} is a calibration folder of stored tensors (schema "
                             f"{self.manifest.get('schema')}); re-run `chattts-forge calibrate` to get statistics")
        check_calibration_manifest(self.manifest, mpath)
        self._statistics: Statistics | None = None
        self._shards: dict[str, list[Path]] = {}
        for name, comp in self.manifest.get("components", {}).items():
            paths = [resolve_inside(self.path, rel, file=mpath, field=f"components.{name}.shards[{i}]")
                     for i, rel in enumerate(comp.get("shards", []))]
            for shard in paths:
                if not shard.is_file():
                    raise ForgeError(f"calibration shard {shard} is missing")
            self._shards[name] = paths
        if not (self.path / STATS_FILE).is_file():
            raise NotFound(f"calibration statistics {self.path / STATS_FILE} are missing; re-run `calibrate`")

    @property
    def statistics(self) -> Statistics:
        """The streamed statistics (loaded once)."""
        if self._statistics is None:
            self._statistics = Statistics.load(self.path / STATS_FILE)
        return self._statistics

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
                raise BadInput(f"calibration shard {path} is unreadable ({type(e).__name__}: {str(e)[:200]})") from None
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
            # relative to the corpus root already (absolute in sets recorded before): never rebased
            corpus["files"] = [Path(f).name if Path(f).is_absolute() else f for f in corpus["files"]]
        art = m.get("artifact")
        if isinstance(art, dict) and art.get("path"):
            art_dir = recorded_path(art["path"], self.path)  # relative to this folder (absolute before)
            source = art.get("source")
            if isinstance(source, dict) and source.get("asset_dir"):  # relative to the FP32 folder
                source["asset_dir"] = rel(str(recorded_path(source["asset_dir"], art_dir)))
            art["path"] = rel(str(art_dir))
        return {
            "path": rel(str(self.path)),
            "corpus": corpus,
            "seed": m.get("seed"),
            "samples": {k: v.get("samples", 0) for k, v in m.get("components", {}).items()},
            "sentences": m.get("sentences"),
            "source_artifact": art,
        }
