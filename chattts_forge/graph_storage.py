"""How a component's graph is stored on disk: inline, or with its weights in `<file>.data`.

onnxruntime memory-maps an external initializer whose offset is page aligned instead of parsing
it out of the protobuf: a session then costs no parse copy while it loads (the full int8 fast GPT:
a 138 MB transient peak gone), and a table read by Gather costs only the rows a request touches
(the full embedding: 79 MB of RSS inline, 10 MB mapped). The runtime's per-request CPU graphs
(`artifact.EXTERNAL_DATA_COMPONENTS`) are therefore stored this way by every stage that writes
them (`write_component` here, the one writer of a component's graph); the numbers are the
same, only the files differ.

Layout (the ONNX external-data convention, written here rather than by `onnx.save_model` for two
reasons: onnx neither aligns offsets nor leaves the in-memory model untouched):
- every initializer of the main graph with at least `SIZE_THRESHOLD` bytes moves to `<file>.data`,
  in graph order; those of at least `ALIGN_THRESHOLD` bytes start at a multiple of `ALIGN` (zero
  padding before them), the smaller ones are read normally;
- the graph keeps `location`, `offset` and `length` per moved tensor (`data_location = EXTERNAL`).

The bytes depend only on the model, so a stage writing the same graph twice writes the same files.
Artifact record of such a component (artifact.json): `sha256`/`bytes` of the graph file, and
`external_data` = {"file", "bytes", "sha256"} of the data file.

Library::

    from chattts_forge.graph_storage import save_with_external_data, store_components_externally
    save_with_external_data(model, folder / "embed.onnx")     # embed.onnx + embed.onnx.data
    store_components_externally(folder, meta)                 # a stage's folder, records updated
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chattts_forge.artifact import (
    ARTIFACT_JSON,
    EXTERNAL_DATA_COMPONENTS,
    EXTERNAL_DATA_SUFFIX,
    PROTOBUF_LIMIT,
    ArtifactMeta,
    component_file_name,
)
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes, fsync_dir, resolve_inside, unique_temp_path
from chattts_forge.integrity import sha256_file

SIZE_THRESHOLD = 1024  # bytes: smaller tensors stay in the graph (onnx's own default)
ALIGN_THRESHOLD = 1 << 20  # bytes: tensors this large start page aligned, so onnxruntime maps them
ALIGN = 4096  # the page size onnxruntime requires of a mapped offset on Linux and macOS


def data_file_of(path: Path) -> Path:
    """The external-data file that belongs to the graph at `path`."""
    return path.with_name(path.name + EXTERNAL_DATA_SUFFIX)


def save_with_external_data(model: Any, path: Path) -> list[str]:
    """Write `model` (an onnx.ModelProto with its weights loaded) as `path` + `<path>.data`.

    Both files are written under temporary names and renamed into place, the data first; `model`
    itself is not changed. Returns the file names written (relative to `path.parent`).
    """
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx
    from onnx import numpy_helper

    path = Path(path)
    data_path = data_file_of(path)
    stored = onnx.ModelProto()
    stored.CopyFrom(model)
    # Unique names: two writers of one graph never write each other's temporary files.
    tmp_data = unique_temp_path(data_path)
    tmp_graph = unique_temp_path(path)
    try:
        with open(tmp_data, "wb") as f:
            offset = 0
            for tensor in stored.graph.initializer:
                if tensor.data_location == onnx.TensorProto.EXTERNAL:
                    raise ForgeError(f"{path.name}: initializer '{tensor.name}' is not loaded (external data)")
                if tensor.data_type == onnx.TensorProto.STRING:
                    continue
                if not tensor.HasField("raw_data"):  # typed fields (float_data, ...): as raw bytes
                    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
                data = tensor.raw_data
                if len(data) < SIZE_THRESHOLD:
                    continue
                if len(data) >= ALIGN_THRESHOLD:
                    pad = -offset % ALIGN
                    f.write(b"\0" * pad)
                    offset += pad
                f.write(data)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for key, value in (("location", data_path.name), ("offset", str(offset)), ("length", str(len(data)))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
                offset += len(data)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp_graph, "wb") as f:
            f.write(stored.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_data, data_path)  # the data first: a graph never names data that is not there
        os.replace(tmp_graph, path)
        fsync_dir(path.parent)
    finally:
        for tmp in (tmp_data, tmp_graph):
            tmp.unlink(missing_ok=True)
    return [path.name, data_path.name]


def is_stored_externally(path: Path) -> bool:
    """True when the graph at `path` keeps no initializer of `SIZE_THRESHOLD` bytes or more inline
    and its data file is present (what `save_with_external_data` writes)."""
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx

    if not data_file_of(path).is_file():
        return False
    model = onnx.load(str(path), load_external_data=False)
    return not any(_inline_payload(t) >= SIZE_THRESHOLD for t in model.graph.initializer)


def _inline_payload(tensor: Any) -> int:
    """Bytes of a tensor's data kept in the graph (raw or typed fields; 0 when external or strings)."""
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type == onnx.TensorProto.STRING:
        return 0
    return len(tensor.raw_data) if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).nbytes


def store_externally(path: Path) -> bool:
    """Rewrite the graph at `path` with its weights in `<path>.data`; False (nothing written) when
    they already are."""
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx

    if is_stored_externally(path):
        return False
    save_with_external_data(onnx.load(str(path)), path)
    return True


def storage_record(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """`record` (a component entry) with `sha256`, `bytes` and `external_data` of its files now."""
    path = resolve_inside(folder, record.get("file"), file=f"{folder}/{ARTIFACT_JSON}", field="components.*.file")
    rec = {k: v for k, v in record.items() if k != "external_data"}
    rec["sha256"] = sha256_file(path)
    rec["bytes"] = path.stat().st_size
    data = data_file_of(path)
    if data.is_file():
        rec["external_data"] = {"file": data.name, "bytes": data.stat().st_size, "sha256": sha256_file(data)}
    return rec


def write_component(model: Any, folder: str | os.PathLike[str], name: str,
                    record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Store `model` (an onnx.ModelProto with its weights loaded) as component `name`'s graph in
    `folder` and return its artifact.json entry: `record` (precision, opset, converter, inputs,
    ...) with `file`, `sha256`, `bytes` and, for a graph with external data, `external_data`.

    The runtime's per-request graphs (`EXTERNAL_DATA_COMPONENTS`) and any graph over protobuf's
    2 GB limit keep their weights in `<file>.data` (page aligned, so onnxruntime maps
    them); the others are one file. Both are written atomically; `model` is left
    as it was. The one place a stage stores, hashes and records a graph.
    """
    folder = Path(folder)
    rec = dict(record or {})
    rec.setdefault("file", component_file_name(name))
    path = resolve_inside(folder, rec["file"], file=f"{folder}/{ARTIFACT_JSON}", field=f"components.{name}.file")
    if name in EXTERNAL_DATA_COMPONENTS or model.ByteSize() >= PROTOBUF_LIMIT:
        save_with_external_data(model, path)
    else:
        atomic_write_bytes(path, model.SerializeToString())
        data_file_of(path).unlink(missing_ok=True)  # no stale weights beside an inline graph
    return storage_record(folder, rec)


def store_components_externally(
    folder: str | os.PathLike[str], meta: ArtifactMeta, components: Iterable[str] = EXTERNAL_DATA_COMPONENTS
) -> list[str]:
    """Store the weights of `components` (those `meta` lists) in external data inside `folder` and
    update their records in `meta` (not written). Returns the components rewritten."""
    folder = Path(folder)
    rewritten = []
    for name in components:
        if not meta.has_component(name):
            continue
        if store_externally(meta.component_file(folder, name)):
            rewritten.append(name)
        meta.components[name] = storage_record(folder, meta.components[name])
    return rewritten
