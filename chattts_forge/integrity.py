"""Checking an artifact folder's files against their recorded sha256 before they are used, fast.

What a folder is checked against (`expected_files(folder, meta)`):
- every file artifact.json records: each component's graph and its external data, and the support
  files (tokenizer, speaker statistics, homophones, DVAE coefficients);
- in a published variant folder (`manifest.json` beside artifact.json): every file the manifest
  lists (artifact.json, report.json and the model card included), `manifest.json` against its line in
  `SHA256SUMS`, and `SHA256SUMS` itself, whose bytes are a function of the manifest. So one changed
  byte anywhere in a published folder is found; a change made coherently to a file, the manifest and
  SHA256SUMS together is found only by the signature (chattts_forge.signing).

How (`check_files`): sizes first (free), then sha256 streamed in 4 MiB blocks, the files spread over
threads (hashlib releases the GIL on large buffers, so the threads hash in parallel). A verified hash
is remembered in a small cache (`VerifiedHashCache`, under the user cache folder) keyed by the file's
(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) and the expected sha256, so loading an unchanged
artifact again costs one stat per file. ctime is in the key because no user-space call can set it:
a file rewritten and given its old mtime back (`touch -d`) still misses the cache.

Modes (`Pipeline(verify=...)`, `synth --verify`): `sha256` (default: every file hashed once, then
cached), `full` (every file hashed on every load, the cache neither read nor trusted), `size` (sizes
only: the explicit opt-out), `none` (presence only). `cheap`, the old default, is an alias of `sha256`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from chattts_forge.artifact import (
    ARTIFACT_JSON,
    MISSING,
    SIZE,
    ArtifactMeta,
    RecordedFile,
    compare_files,
    recorded_files,
    sha256_or_none,
)
from chattts_forge.errors import ArtifactChanged, ForgeError
from chattts_forge.fsutil import atomic_write_bytes, resolve_inside
from chattts_forge.log import get_logger

log = get_logger(__name__)

# Names publish writes into a variant folder that the runtime reads back (publish.manifest uses these).
PUBLISHED_MANIFEST = "manifest.json"
PUBLISHED_SUMS = "SHA256SUMS"
SIGNATURE_NAME = "model.sig"  # the OpenSSF Model Signing signature of a published folder
PUBLISHED_CARD = "README.md"  # the model card
PUBLISHED_REPORT = "report.json"  # the gate report's copy (evaluate.report_schema.REPORT_NAME)
# Every name publish adds: they describe one published folder, so an artifact made from it (quantize)
# does not carry them, and publish refuses an artifact that does.
PUBLISHED_NAMES = frozenset({PUBLISHED_MANIFEST, PUBLISHED_SUMS, SIGNATURE_NAME, PUBLISHED_CARD, PUBLISHED_REPORT})

VERIFY_MODES = ("sha256", "full", "size", "none")
VERIFY_ALIASES = {"cheap": "sha256"}  # the name of the default before every file was hashed

_BLOCK = 4 << 20  # bytes per read: large enough that hashlib releases the GIL, small enough to stream
MAX_HASH_THREADS = 8
CACHE_SCHEMA = "chattts-forge/verified-sha256/1"
CACHE_FILE = "verified-sha256.json"
CACHE_MAX_ENTRIES = 4096  # ~150 bytes each; an artifact has ~20 files


def check_verify_mode(mode: str) -> str:
    """The canonical name of a verify mode; ForgeError for an unknown one."""
    mode = VERIFY_ALIASES.get(mode, mode)
    if mode not in VERIFY_MODES:
        raise ForgeError(f"unknown verify mode {mode!r} (choose from: {', '.join(VERIFY_MODES)})")
    return mode


def sha256sums_text(hashes: dict[str, str]) -> str:
    """`sha256sum -c` format: '<hex>  <path>' per line, sorted by path (SHA256SUMS's one canonical form)."""
    for p in hashes:
        if "\n" in p or "\\" in p:
            raise ForgeError(f"file name {p!r} cannot be written to {PUBLISHED_SUMS}")
    return "".join(f"{hashes[p]}  {p}\n" for p in sorted(hashes))


# ---- what a folder is checked against --------------------------------------------------------


# What a folder is checked against: the contract's record of one file (kept under its old name here).
Expected = RecordedFile


def _add(out: dict[str, Expected], entry: Expected) -> None:
    old = out.get(entry.rel)
    if old is None:
        out[entry.rel] = entry
        return
    if entry.sha256 and old.sha256 and entry.sha256 != old.sha256:
        raise ForgeError(f"{entry.recorded_in} and {old.recorded_in} record different sha256s for {entry.rel}: "
                         "the folder was changed after it was made")
    if (old.sha256 is None and entry.sha256 is not None) or (not old.what and entry.what):
        out[entry.rel] = Expected(entry.rel, old.bytes if old.bytes is not None else entry.bytes,
                                  old.sha256 or entry.sha256, old.recorded_in if old.sha256 else entry.recorded_in,
                                  old.what or entry.what)


def artifact_records(meta: ArtifactMeta, present: Callable[[str], bool]) -> list[Expected]:
    """The files artifact.json records, as a loader sees the folder (`present(rel)`: whether a file
    exists): `artifact.recorded_files` with `present`."""
    return list(recorded_files(meta, present=present).values())


def published_records(folder: Path) -> list[Expected] | None:
    """The files a published variant folder's manifest.json lists, manifest.json itself (its line in
    SHA256SUMS) and SHA256SUMS (its canonical text, rebuilt from the manifest, must be its bytes);
    None when the folder is not published (no manifest.json)."""
    manifest_path = folder / PUBLISHED_MANIFEST
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        listed = [Expected(str(e["path"]), int(e["bytes"]), str(e["sha256"]), PUBLISHED_MANIFEST) for e in files]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ForgeError(f"{manifest_path} is unreadable or malformed ({type(e).__name__}): the published folder "
                         "is damaged") from None
    sums_path = folder / PUBLISHED_SUMS
    try:
        sums_bytes = sums_path.read_bytes()
    except OSError:
        raise ForgeError(f"{sums_path} is missing or unreadable: the published folder is damaged") from None
    manifest_line = next((line for line in sums_bytes.decode("utf-8", "replace").splitlines()
                          if line.endswith(f"  {PUBLISHED_MANIFEST}")), "")
    manifest_sha = sha256_or_none(manifest_line[:64])
    if manifest_sha is None:
        raise ForgeError(f"{sums_path} does not list {PUBLISHED_MANIFEST}: the published folder is damaged")
    want = {e.rel: e.sha256 for e in listed} | {PUBLISHED_MANIFEST: manifest_sha}
    if sums_bytes != sha256sums_text(want).encode("utf-8"):  # type: ignore[arg-type]
        raise ForgeError(f"{sums_path} does not match {PUBLISHED_MANIFEST} (changed or damaged)")
    return [*listed, Expected(PUBLISHED_MANIFEST, None, manifest_sha, PUBLISHED_SUMS)]


def expected_files(folder: str | os.PathLike[str], meta: ArtifactMeta) -> dict[str, Expected]:
    """{relative path: Expected} of every file the folder records (artifact.json, and the manifest of
    a published folder); ForgeError where two records disagree."""
    folder = Path(folder)
    out: dict[str, Expected] = {}
    published = published_records(folder)
    for entry in published or []:
        _add(out, entry)
    for entry in artifact_records(meta, lambda rel: (folder / rel).is_file()):
        _add(out, entry)
    for entry in out.values():  # a recorded path that leads out of the folder is refused, never followed
        resolve_inside(folder, entry.rel, file=folder / entry.recorded_in, field="a file path")
    return dict(sorted(out.items()))


# ---- hashing, with a cache of verified hashes ------------------------------------------------


def user_cache_dir() -> Path:
    """Where chattts-forge keeps its per-user cache ($XDG_CACHE_HOME/chattts-forge, else ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "chattts-forge"


def stat_key(st: os.stat_result) -> str:
    """What identifies one version of a file on disk (a changed file gets another key)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class VerifiedHashCache:
    """{(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): sha256} of files hashed and found as recorded.

    One JSON file, written atomically, merged with what other processes wrote meanwhile, bounded to
    `CACHE_MAX_ENTRIES` (the oldest go first). A missing, unreadable or corrupt cache is an empty one
    (and rewritten on the next save); a cache that cannot be written only costs a re-hash next time.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else user_cache_dir() / CACHE_FILE
        self.entries = self._read()
        self._new: dict[str, str] = {}

    def _read(self) -> dict[str, str]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return {}
        entries = doc.get("entries") if isinstance(doc, dict) and doc.get("schema") == CACHE_SCHEMA else None
        if not isinstance(entries, dict):
            return {}
        return {k: v for k, v in entries.items() if isinstance(k, str) and sha256_or_none(v)}

    def hit(self, st: os.stat_result, sha256: str) -> bool:
        return self.entries.get(stat_key(st)) == sha256

    def add(self, st: os.stat_result, sha256: str) -> None:
        key = stat_key(st)
        self.entries.pop(key, None)
        self.entries[key] = sha256
        self._new[key] = sha256

    def save(self) -> None:
        if not self._new:
            return
        merged = self._read()
        for key, sha in self._new.items():
            merged.pop(key, None)
            merged[key] = sha
        kept = dict(list(merged.items())[-CACHE_MAX_ENTRIES:])
        data = json.dumps({"schema": CACHE_SCHEMA, "entries": kept}, indent=0).encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write_bytes(self.path, data)
        except OSError as e:
            log.debug("could not write the verified-hash cache %s (%s): the next load hashes again", self.path, e)
            return
        self.entries, self._new = kept, {}


def sha256_stream(path: Path, on_block: Callable[[int], None] | None = None) -> str:
    """sha256 of a file, read into one reused 4 MiB buffer (no allocation per block)."""
    h = hashlib.sha256()
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            if on_block is not None:
                on_block(n)
    return h.hexdigest()


@dataclass
class CheckReport:
    """What `check_files` did: which files it hashed, which the cache vouched for, and how long it took."""

    mode: str
    files: list[str] = field(default_factory=list)
    hashed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    bytes_total: int = 0
    bytes_hashed: int = 0
    hash_seconds: float = 0.0
    seconds: float = 0.0

    def summary(self) -> str:
        if self.mode in ("size", "none"):
            return f"{len(self.files)} files checked by {'size' if self.mode == 'size' else 'presence'} only"
        return (f"{len(self.files)} files ({self.bytes_total / 1e6:.1f} MB) checked against their sha256: "
                f"{len(self.hashed)} hashed ({self.bytes_hashed / 1e6:.1f} MB in {self.hash_seconds:.2f} s), "
                f"{len(self.cached)} vouched for by the verified-hash cache; {self.seconds * 1e3:.0f} ms in all")


def hash_threads(sizes: Iterable[int]) -> int:
    """Threads for hashing: one per core (at most MAX_HASH_THREADS), no more than there are files."""
    n = sum(1 for _ in sizes)
    return max(1, min(n, os.cpu_count() or 1, MAX_HASH_THREADS))


def check_files(
    folder: str | os.PathLike[str],
    expected: dict[str, Expected],
    mode: str = "sha256",
    cache: VerifiedHashCache | None = None,
) -> CheckReport:
    """Check `expected` files of `folder` (see the module docstring for the modes); the first problem
    is a one-line ForgeError naming the file. `cache`: the verified-hash cache (mode sha256; None: the
    user's)."""
    mode = check_verify_mode(mode)
    folder = Path(folder)
    t0 = time.perf_counter()
    report = CheckReport(mode, files=list(expected))
    stats: dict[str, os.stat_result] = {}
    for rel in expected:
        path = folder / rel
        try:
            st = os.stat(path)
        except OSError:
            continue  # named missing below, in the records' order
        if not path.is_file():
            raise ForgeError(f"artifact file {path} is not a regular file")
        stats[rel] = st
        report.bytes_total += st.st_size
    sizes = {rel: st.st_size for rel, st in stats.items()}
    for problem in compare_files(expected, sizes):
        path, entry = folder / problem.rel, expected[problem.rel]
        if problem.problem == MISSING:
            raise ArtifactChanged(f"artifact file {path} ({entry.describe()}) is missing")
        if mode != "none" and problem.problem == SIZE:
            raise ArtifactChanged(f"artifact file {path} has {problem.found} bytes, {entry.recorded_in} says "
                             f"{problem.recorded}: changed or damaged; refusing to load it")
    if mode in ("size", "none"):
        report.seconds = time.perf_counter() - t0
        return report
    unrecorded = [rel for rel, e in expected.items() if e.sha256 is None]
    if unrecorded:
        raise ForgeError(f"{folder / unrecorded[0]}: no sha256 is recorded for it ({ARTIFACT_JSON} of an artifact "
                         "made before every file was recorded); convert it again, or load it with verify='size' "
                         "(synth --verify size)")
    if mode == "sha256":
        cache = cache if cache is not None else VerifiedHashCache()
        for rel, entry in expected.items():
            if cache.hit(stats[rel], entry.sha256):  # type: ignore[arg-type]
                report.cached.append(rel)
    todo = [rel for rel in expected if rel not in report.cached]
    # Largest first, so the longest file does not start last and leave the other threads idle.
    todo.sort(key=lambda rel: -stats[rel].st_size)
    t_hash = time.perf_counter()
    if todo:
        with ThreadPoolExecutor(max_workers=hash_threads(stats[r].st_size for r in todo)) as pool:
            digests = dict(zip(todo, pool.map(lambda rel: sha256_stream(folder / rel), todo), strict=True))
    else:
        digests = {}
    report.hash_seconds = time.perf_counter() - t_hash
    bad = sorted(m.rel for m in compare_files({rel: expected[rel] for rel in digests}, sizes, digests))
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ArtifactChanged(f"artifact file {folder / bad[0]} does not match its sha256 in {expected[bad[0]].recorded_in} "
                         f"(changed or damaged){more}; refusing to load it")
    report.hashed = sorted(digests)
    report.bytes_hashed = sum(stats[rel].st_size for rel in digests)
    if cache is not None or mode == "full":
        cache = cache if cache is not None else VerifiedHashCache()
        for rel in digests:
            with contextlib.suppress(OSError):
                if stat_key(os.stat(folder / rel)) == stat_key(stats[rel]):  # unchanged while it was hashed
                    cache.add(stats[rel], digests[rel])
        cache.save()
    report.seconds = time.perf_counter() - t0
    return report
