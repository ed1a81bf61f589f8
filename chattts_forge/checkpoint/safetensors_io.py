"""Streaming, deterministic safetensors writing and cheap header reading (no torch, no full load).

The format: 8-byte little-endian header length N, N bytes of JSON header
(`{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}}`, offsets relative
to the end of the header), then the raw little-endian tensor bytes.

Writing: the header is computed from the shapes first, then tensors are produced and written one at
a time, so a 1.2 GB checkpoint never sits in memory. Keys are sorted and the JSON is compact, so the
same tensors always give the same bytes.

Reading: `read_header` parses only the header and checks it against the file size, so `verify` can
tell a truncated or foreign file apart without loading any tensor. It stays by hand: `safe_open`
gives names, dtypes and shapes but neither the data offsets (the spans-tile-the-data check) nor
which of truncated / not safetensors / corrupt a bad file is. `read_tensor` is `safe_open`'s.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from chattts_forge.errors import ForgeError, IntegrityError

# Metadata written by torch's safetensors `save_file`/`save_pretrained`; transformers checks it.
DEFAULT_METADATA = {"format": "pt"}
_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": None,
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_ITEMSIZE = {
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F64": 8,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
MAX_HEADER_BYTES = 100_000_000  # the limit the safetensors library enforces


class SafetensorsError(ForgeError):
    """A file that is not a valid safetensors file; `kind` is "truncated", "not_safetensors" or "corrupt"."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class HeaderEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, HeaderEntry]
    metadata: dict[str, str]
    data_start: int  # byte offset of the tensor data in the file
    data_bytes: int  # bytes of tensor data the header describes


def build_header(
    shapes: Iterable[tuple[str, tuple[int, ...], str]], metadata: dict[str, str] | None = None
) -> tuple[bytes, list[tuple[str, int, int]]]:
    """Header bytes (length prefix included) and the (name, begin, end) layout in sorted name order."""
    items = sorted(shapes, key=lambda t: t[0])
    header: dict[str, Any] = {"__metadata__": dict(sorted((metadata or DEFAULT_METADATA).items()))}
    layout = []
    offset = 0
    for name, shape, dtype in items:
        nbytes = math.prod(shape) * _ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        layout.append((name, offset, offset + nbytes))
        offset += nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # tensor data 8-byte aligned, as the safetensors writer does
    return struct.pack("<Q", len(text)) + text, layout


def write_safetensors(
    path: str | os.PathLike[str],
    shapes: Iterable[tuple[str, tuple[int, ...], str]],
    produce: Callable[[str], np.ndarray],
    metadata: dict[str, str] | None = None,
    on_tensor: Callable[[str, int], None] | None = None,
) -> None:
    """Write a safetensors file whose tensors come one at a time from `produce(name)`."""
    shape_of = {name: (tuple(shape), dtype) for name, shape, dtype in shapes}
    head, layout = build_header(((n, s, d) for n, (s, d) in shape_of.items()), metadata)
    with open(path, "wb") as f:
        f.write(head)
        for name, begin, end in layout:
            arr = np.ascontiguousarray(produce(name))
            shape, dtype = shape_of[name]
            want = _DTYPES[dtype]
            if arr.shape != shape or arr.dtype != want:
                raise ForgeError(
                    f"internal: tensor {name} is {arr.dtype}{arr.shape}, header says {dtype}{shape}"
                )
            data = arr.astype(want.newbyteorder("<"), copy=False).tobytes()
            assert len(data) == end - begin
            f.write(data)
            if on_tensor is not None:
                on_tensor(name, len(data))


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse and validate a safetensors header; ForgeError (one line, naming the file) if it is not one.

    Checks: the length prefix fits the file, the header is a JSON object of tensor entries with known
    dtypes, each entry's byte span matches its shape, the spans tile the data without gaps, and the
    file holds exactly that many data bytes (fewer: truncated).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if size == 0:
                raise SafetensorsError(f"{path}: truncated safetensors file (empty)", "truncated")
            if len(prefix) < 8:
                raise SafetensorsError(
                    f"{path}: not a safetensors file ({size} bytes, no header)", "not_safetensors"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or n == 0:
                raise SafetensorsError(
                    f"{path}: not a safetensors file (implausible header length {n})", "not_safetensors"
                )
            if 8 + n > size:
                raise SafetensorsError(
                    f"{path}: truncated safetensors file (header needs {8 + n} bytes, file has {size})",
                    "truncated",
                )
            raw = f.read(n)
    except OSError as e:
        raise SafetensorsError(f"{path}: cannot read ({e.strerror})", "unreadable") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SafetensorsError(
            f"{path}: not a safetensors file (header is not JSON)", "not_safetensors"
        ) from None
    if not isinstance(header, dict):
        raise SafetensorsError(
            f"{path}: not a safetensors file (header is not a JSON object)", "not_safetensors"
        )
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, HeaderEntry] = {}
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(int(x) for x in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise SafetensorsError(
                f"{path}: not a safetensors file (bad header entry for '{name}')", "not_safetensors"
            ) from None
        if dtype not in _ITEMSIZE:
            raise SafetensorsError(
                f"{path}: not a safetensors file (unknown dtype {dtype} of '{name}')", "not_safetensors"
            )
        if end - begin != math.prod(shape) * _ITEMSIZE[dtype]:
            raise SafetensorsError(
                f"{path}: corrupt safetensors header ('{name}' spans {end - begin} bytes for {dtype}{list(shape)})",
                "corrupt",
            )
        tensors[name] = HeaderEntry(dtype, shape, begin, end)
    spans = sorted((e.begin, e.end) for e in tensors.values())
    cursor = 0
    for begin, end in spans:
        if begin != cursor:
            raise SafetensorsError(
                f"{path}: corrupt safetensors header (tensor data has a gap or overlap at byte {begin})",
                "corrupt",
            )
        cursor = end
    data_start = 8 + n
    if data_start + cursor > size:
        raise SafetensorsError(
            f"{path}: truncated safetensors file ({size} bytes, header describes {data_start + cursor})",
            "truncated",
        )
    if data_start + cursor < size:
        raise SafetensorsError(
            f"{path}: corrupt safetensors file ({size - data_start - cursor} trailing bytes after the tensor data)",
            "corrupt",
        )
    return SafetensorsHeader(tensors, dict(metadata), data_start, cursor)


def read_tensor(path: str | os.PathLike[str], name: str) -> np.ndarray:
    """One tensor as numpy, through safetensors' own reader (it maps the file: no full load)."""
    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            return f.get_tensor(name)
    except (SafetensorError, TypeError) as e:  # TypeError: a dtype numpy has not (BF16)
        raise IntegrityError(f"{path}: cannot read tensor '{name}' ({e})") from None
