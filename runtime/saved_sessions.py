"""onnxruntime's optimized graphs, prepacked weights included, saved once per host and reused.

Creating a CPU session spends most of its time prepacking the weights of the MatMuls and convolutions
into the layout this CPU's kernels read (docs/measurements/2026-12-03-xeon/: gpt_fast of the full
int8-dynamic-kv8 variant 1.2 s of its 1.5 s). That layout is a function of the graph's bytes, the
onnxruntime build and the CPU, so the first session of a graph on a host saves what onnxruntime
made of it (`optimized_model_filepath` with `session.save_external_prepacked_constant_initializers`)
under the user cache, and later sessions load that saved graph with graph optimizations off: the
same kernels on the same packed weights (the same outputs, bit for bit; tests/test_coldstart.py), no
packing at load.

An entry is keyed (`saved_key`) by the recorded sha256 of the graph and of its external data, the
onnxruntime version, the CPU model and SIMD flags (runtime.machine) and the session options that
shape the graph; any change is another key, never a stale graph. An entry is a folder written through
a temporary folder and one rename (fsutil.atomic_output_dir) holding the graph, its data and
`entry.json` (the key and the stat keys of the two files at write time): a file whose stat differs
(changed, truncated, replaced) makes the entry ignored and written again, the same trust the
verified-hash cache gives a stat key. The folder is `$XDG_CACHE_HOME/chattts-forge/sessions/` (else
~/.cache/...); at most `MAX_ENTRIES` entries and `MAX_BYTES` are kept (the least recently used go).
A saved entry costs disk (the graph's weights plus their packed copy: ~380 MB for the full INT8 GPT,
~1.5 GB for FP32). The runtime saves the sessions of published variant folders (what it serves), not
those of the build's intermediate artifacts; `CHATTTS_FORGE_SAVED_SESSIONS=0` (or
`LoadedArtifact(saved_sessions=False)`) turns it off, `LoadedArtifact(saved_sessions=True)` on for any folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chattts_forge.fsutil import atomic_output_dir
from chattts_forge.integrity import stat_key, user_cache_dir
from chattts_forge.log import get_logger
from chattts_forge.runtime import machine

log = get_logger(__name__)

SAVED_SCHEMA = "chattts-forge/saved-session/1"
SAVED_ENV = "CHATTTS_FORGE_SAVED_SESSIONS"  # "0"/"false"/"off": every session is built from the artifact's graph
SAVED_DIR = "sessions"
ENTRY_JSON = "entry.json"
GRAPH_NAME = "graph.onnx"
DATA_NAME = "graph.onnx.data"
MAX_ENTRIES = 32
MAX_BYTES = 8 << 30  # a version's six full-size variants fit
# Initializers at least this large go to the data file (a protobuf holds at most 2 GB; FP32's GPT is more)
MIN_EXTERNAL_BYTES = 1024


def saved_sessions_default() -> bool:
    return os.environ.get(SAVED_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def saved_key(graph_sha256: str, data_sha256: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """What a saved graph depends on: the source graph's bytes, onnxruntime, the CPU, the options."""
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    return {"schema": SAVED_SCHEMA, "graph_sha256": graph_sha256, "data_sha256": data_sha256,
            "onnxruntime": ort.__version__, "cpu_model": machine.cpu_model(), "cpu_flags": machine.cpu_flags(),
            "options": dict(sorted(options.items()))}


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]


class SavedSessions:
    """The saved-graph folder of this host (`root`: default the user cache's `sessions/`)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else user_cache_dir() / SAVED_DIR

    def entry(self, key: dict[str, Any]) -> Path:
        return self.root / _digest(key)

    def lookup(self, key: dict[str, Any]) -> Path | None:
        """The saved graph for `key`, or None (absent, another key, or a file changed since it was written)."""
        folder = self.entry(key)
        try:
            record = json.loads((folder / ENTRY_JSON).read_text(encoding="utf-8"))
            if record.get("key") != key:
                raise ValueError("written for another graph, runtime or machine")
            for name in (GRAPH_NAME, DATA_NAME):
                if record["stats"].get(name) != stat_key(os.stat(folder / name)):
                    raise ValueError(f"{name} changed since it was saved")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.info("saved session %s ignored (%s): building it again", folder, e)
            return None
        with contextlib.suppress(OSError):
            os.utime(folder / ENTRY_JSON)  # recently used: pruned last
        return folder / GRAPH_NAME

    @contextlib.contextmanager
    def saving(self, key: dict[str, Any], opts: Any) -> Iterator[None]:
        """Make the session created inside the block (with `opts`) save its optimized graph as the
        entry of `key`; the entry appears in one rename when the block ends without an error. A cache
        folder that cannot be written costs only the saving: the session is made as usual."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            writable = os.access(self.root, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            log.info("saved sessions: %s is not writable; the session is not saved", self.root)
            yield
            return
        made = False
        try:
            with atomic_output_dir(self.entry(key)) as tmp:
                opts.optimized_model_filepath = str(tmp / GRAPH_NAME)
                opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_NAME)
                opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                              str(MIN_EXTERNAL_BYTES))
                opts.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
                yield
                made = True
                (tmp / DATA_NAME).touch()  # a graph without large weights writes none: an empty one
                stats = {name: stat_key(os.stat(tmp / name)) for name in (GRAPH_NAME, DATA_NAME)}
                (tmp / ENTRY_JSON).write_text(json.dumps({"key": key, "stats": stats}, sort_keys=True) + "\n",
                                              encoding="utf-8")
        except OSError as e:
            if not made:  # the session's own failure
                raise
            log.info("saved sessions: entry %s not kept (%s)", self.entry(key), e)
            return
        self.prune()

    def prune(self, keep: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        """Keep the most recently used entries, at most `keep` of them and `max_bytes` in all."""
        try:
            entries = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return

        def used(p: Path) -> float:
            try:
                return (p / ENTRY_JSON).stat().st_mtime
            except OSError:
                return 0.0

        def size(p: Path) -> int:
            return sum(f.stat().st_size for f in p.iterdir() if f.is_file())

        total = 0
        for i, entry in enumerate(sorted(entries, key=used, reverse=True)):
            with contextlib.suppress(OSError):
                total += size(entry)
            if i >= keep or (i > 0 and total > max_bytes):  # the newest stays, whatever its size
                shutil.rmtree(entry, ignore_errors=True)
