"""Verify a ChatTTS checkpoint: the released one, a synthetic one, or broken (and how).

Library use::

    from chattts_forge.checkpoint.verify import verify_checkpoint
    report = verify_checkpoint("path/to/asset")   # or a snapshot root, an HF cache, None (HF default)
    report.kind        # "real" | "synthetic"
    report.summary()   # one line for humans

A broken checkpoint raises `CheckpointError` (a ForgeError) whose one-line message names the file
and whose `kind` says what is wrong: "missing", "truncated", "not_safetensors", "corrupt",
"wrong_shape", "hash_mismatch" or "inconsistent" (marker vs gpt/config.json / its own fields).

Checks, cheapest first, so a broken file is named by its most specific fault:
1. every file of the released layout exists;
2. each safetensors file has a valid header whose data length equals the file size (truncated and
   non-safetensors files are told apart without reading tensor data);
3. the header's tensor names, shapes and dtypes equal the inventory for the checkpoint's dims
   (the released dims when there is no marker; the marker's dims, which must agree with
   gpt/config.json, when there is one);
4. sha256 of every file: against ChatTTS's own res/sha256_map.json (no marker: "real") or against
   the marker's `files` (synthetic).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pybase16384 as b14
from tqdm import tqdm

from chattts_forge.checkpoint.inventory import TENSOR_FILES, inventory_table
from chattts_forge.checkpoint.layout import (
    ASSET_FILES,
    FULL,
    MARKER_NAME,
    PRESETS,
    Dims,
    read_marker,
    resolve_asset_dir,
)
from chattts_forge.checkpoint.release import release_sha256_map
from chattts_forge.checkpoint.safetensors_io import SafetensorsError, SafetensorsHeader, read_header
from chattts_forge.errors import ForgeError, IntegrityError
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger

log = get_logger(__name__)

_DTYPE_NAMES = {"float32": "F32"}
_PROGRESS_BYTES = 200_000_000  # show a hashing progress bar above this


class CheckpointError(IntegrityError):
    """A broken checkpoint. `kind`: missing | truncated | not_safetensors | corrupt | unreadable |
    wrong_shape | hash_mismatch | inconsistent; `file`: the asset-relative file at fault."""

    def __init__(self, message: str, kind: str, file: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.file = file


@dataclass
class FileReport:
    path: str  # relative to the asset folder
    bytes: int
    sha256: str
    expected_sha256: str
    tensors: int | None = None  # safetensors files only


@dataclass
class VerifyReport:
    kind: str  # "real" | "synthetic"
    asset_dir: Path
    preset: str | None = None
    seed: int | None = None
    tool_version: str | None = None
    hash_source: str = ""
    dims: dict[str, Any] = field(default_factory=dict)
    files: list[FileReport] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["asset_dir"] = str(self.asset_dir)
        d["total_bytes"] = self.total_bytes
        return d

    def summary(self) -> str:
        size = f"{len(self.files)} files, {self.total_bytes / 1e6:.1f} MB"
        if self.kind == "real":
            return f"real: {self.asset_dir} is the released ChatTTS checkpoint ({size}, sha256 match {self.hash_source})"
        return (
            f"synthetic: {self.asset_dir} is a synthetic {self.preset} checkpoint (seed {self.seed}, "
            f"chattts-forge {self.tool_version}; {size}, sha256, dims and tensor shapes consistent)"
        )


def _released_dims() -> Dims:
    """Dims a checkpoint without marker must have (the released model's)."""
    return FULL


def _check_present(asset: Path) -> None:
    for rel in ASSET_FILES:
        p = asset / rel
        if not p.is_file():
            what = "dangling link" if p.is_symlink() else "missing file"
            raise CheckpointError(f"{p}: {what} ({rel} of the ChatTTS asset folder)", "missing", rel)


def _check_headers(asset: Path) -> dict[str, SafetensorsHeader]:
    headers = {}
    for rel in TENSOR_FILES:
        try:
            headers[rel] = read_header(asset / rel)
        except SafetensorsError as e:
            raise CheckpointError(str(e), e.kind, rel) from None
    return headers


def _check_inventory(asset: Path, headers: dict[str, SafetensorsHeader], dims: Dims, what: str) -> None:
    table = inventory_table(dims)
    for rel in TENSOR_FILES:
        want = table[rel]
        got = headers[rel].tensors
        p = asset / rel
        for name, (shape, dtype) in want.items():
            if name not in got:
                raise CheckpointError(
                    f"{p}: tensor '{name}' missing (expected by {what})", "wrong_shape", rel
                )
            entry = got[name]
            if entry.shape != shape:
                raise CheckpointError(
                    f"{p}: wrong shape for '{name}': {list(entry.shape)} in the file, {list(shape)} for {what}",
                    "wrong_shape",
                    rel,
                )
            if entry.dtype != _DTYPE_NAMES[dtype]:
                raise CheckpointError(
                    f"{p}: wrong dtype for '{name}': {entry.dtype} in the file, {_DTYPE_NAMES[dtype]} for {what}",
                    "wrong_shape",
                    rel,
                )
        extra = sorted(set(got) - set(want))
        if extra:
            raise CheckpointError(
                f"{p}: unexpected tensor '{extra[0]}' ({len(extra)} not in {what}; ChatTTS loads strictly)",
                "wrong_shape",
                rel,
            )


def _check_hashes(asset: Path, expected: dict[str, str], against: str) -> dict[str, str]:
    total = sum((asset / rel).stat().st_size for rel in ASSET_FILES)
    got: dict[str, str] = {}
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="sha256",
        disable=True if total < _PROGRESS_BYTES else None,
    ) as bar:
        for rel in ASSET_FILES:
            got[rel] = sha256_file(asset / rel, on_block=bar.update if bar is not None else None)
            if got[rel] != expected[rel]:
                raise CheckpointError(
                    f"{asset / rel}: sha256 mismatch against {against} "
                    f"(got {got[rel][:16]}..., expected {expected[rel][:16]}...)",
                    "hash_mismatch",
                    rel,
                )
    return got


def _marker_dims(asset: Path, marker: dict[str, Any]) -> Dims:
    mp = asset / MARKER_NAME
    if marker.get("synthetic") is not True:
        raise CheckpointError(f"{mp}: marker does not say synthetic: true", "inconsistent", MARKER_NAME)
    for key in ("preset", "seed", "tool", "tool_version", "dims", "spk_stat", "files"):
        if key not in marker:
            raise CheckpointError(f"{mp}: marker lacks '{key}'", "inconsistent", MARKER_NAME)
    try:
        dims = Dims.from_dict(marker["dims"])
    except (ForgeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{mp}: marker dims unreadable ({e})", "inconsistent", MARKER_NAME) from None
    preset = marker["preset"]
    if preset in PRESETS and PRESETS[preset] != dims:
        raise CheckpointError(
            f"{mp}: marker says preset '{preset}' but its dims differ from that preset",
            "inconsistent",
            MARKER_NAME,
        )
    files = marker["files"]
    if not isinstance(files, dict) or any(not isinstance(files.get(rel), str) for rel in ASSET_FILES):
        missing = [rel for rel in ASSET_FILES if not isinstance(files, dict) or rel not in files]
        raise CheckpointError(
            f"{mp}: marker has no sha256 for {', '.join(missing) or 'some files'}",
            "inconsistent",
            MARKER_NAME,
        )
    try:
        stat = np.frombuffer(b14.decode_from_string(marker["spk_stat"]), dtype=np.float16)
    except Exception:  # pybase16384 raises assorted errors on garbage
        stat = np.zeros(0, dtype=np.float16)
    if stat.size != 2 * dims.hidden_size:
        raise CheckpointError(
            f"{mp}: spk_stat holds {stat.size} values, expected 2 x hidden_size = {2 * dims.hidden_size}",
            "inconsistent",
            MARKER_NAME,
        )
    return dims


def _check_gpt_config(asset: Path, dims: Dims) -> None:
    p = asset / "gpt" / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"{p}: unreadable gpt config ({e})", "inconsistent", "gpt/config.json"
        ) from None
    want = dims.gpt_config_json()
    diff = sorted(k for k in set(want) | set(cfg) if cfg.get(k) != want.get(k))
    if diff:
        k = diff[0]
        raise CheckpointError(
            f"{p}: '{k}' is {cfg.get(k)!r}, the marker's dims say {want.get(k)!r}",
            "inconsistent",
            "gpt/config.json",
        )


def verify_checkpoint(path: str | Path | None) -> VerifyReport:
    """Classify the checkpoint at `path` as real or synthetic; raise CheckpointError if broken."""
    asset = resolve_asset_dir(path)
    marker = read_marker(asset)
    _check_present(asset)
    headers = _check_headers(asset)
    if marker is None:
        dims = _released_dims()
        _check_inventory(asset, headers, dims, "the released checkpoint")
        expected, origin = release_sha256_map()
        got = _check_hashes(
            asset, expected, f"ChatTTS's res/sha256_map.json (released checkpoint; no {MARKER_NAME} here)"
        )
        report = VerifyReport("real", asset, hash_source=origin, dims=dims.to_dict())
    else:
        dims = _marker_dims(asset, marker)
        _check_gpt_config(asset, dims)
        _check_inventory(asset, headers, dims, f"the marker's {marker['preset']} dims")
        expected = {rel: marker["files"][rel] for rel in ASSET_FILES}
        got = _check_hashes(asset, expected, f"the synthetic marker {MARKER_NAME}")
        report = VerifyReport(
            "synthetic",
            asset,
            preset=marker["preset"],
            seed=marker["seed"],
            tool_version=marker["tool_version"],
            hash_source=str(asset / MARKER_NAME),
            dims=dims.to_dict(),
        )
    for rel in ASSET_FILES:
        report.files.append(
            FileReport(
                path=rel,
                bytes=(asset / rel).stat().st_size,
                sha256=got[rel],
                expected_sha256=expected[rel],
                tensors=len(headers[rel].tensors) if rel in headers else None,
            )
        )
    log.debug("%s", report.summary())
    return report
