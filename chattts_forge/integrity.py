"""Whether files match their records: the one module that hashes, checks and caches verified hashes.

Everything that asks "is this file the one its record describes" goes through here:
- the hasher: `sha256_file` (4 MiB blocks into one reused buffer); nothing else in the project reads
  a file to hash it;
- the records: `RecordedFile` (a file as artifact.json, a manifest, SHA256SUMS or a report describes
  it), `recorded_files` (what artifact.json records), `expected_files` (an artifact folder, and the
  manifest of a published one);
- the one comparison: `compare_files` (recorded sizes and sha256s against what a folder holds), and
  its result element `FileMismatch`; `check_files` (the runtime's cached, threaded check) and
  `verify_files` (an artifact folder against its artifact.json: quantize's input check, evaluate's
  identity) both return a `CheckReport` holding every mismatch, and `check_files` raises the first
  as an `IntegrityError` unless told to collect them;
- a folder's files (`list_files`, `hash_tree`, `file_record`) are chattts_forge.folder_files, on
  `sha256_file`;
- the one stat-keyed cache of known sha256s, `VerifiedHashCache`: the runtime's (under the user cache
  folder) and the build driver's (its step keys, `build/<run>/.steps/hashcache.json`).

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
from typing import TYPE_CHECKING, Any

from chattts_forge.artifact import (
    ARTIFACT_JSON,
    EXTERNAL_DATA_SUFFIX,
    OPTIONAL_SUPPORT_FILES,
    SUPPORT_FILES,
    ArtifactMeta,
    component_file_name,
)
from chattts_forge.choices import Choice
from chattts_forge.errors import ArtifactChanged, BadInput, IntegrityError, NotFound
from chattts_forge.fsutil import atomic_write_bytes, resolve_inside
from chattts_forge.log import get_logger

if TYPE_CHECKING:
    from chattts_forge.folder_files import FileEntry

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



class VerifyMode(Choice):
    """How an artifact's files are checked before use (the module docstring's modes)."""

    SHA256 = "sha256"
    FULL = "full"
    SIZE = "size"
    NONE = "none"


VERIFY_MODES = VerifyMode.values()
VERIFY_ALIASES = {"cheap": "sha256"}  # the name of the default before every file was hashed

_BLOCK = 4 << 20  # bytes per read: large enough that hashlib releases the GIL, small enough to stream
MAX_HASH_THREADS = 8
CACHE_SCHEMA = "chattts-forge/verified-sha256/1"
CACHE_FILE = "verified-sha256.json"
CACHE_MAX_ENTRIES = 4096  # ~150 bytes each; an artifact has ~20 files
BUILD_CACHE_MAX_ENTRIES = 1 << 16  # the driver's: every file of a build's folders and the code it runs


def check_verify_mode(mode: str) -> str:
    """The canonical name of a verify mode; BadInput for an unknown one."""
    mode = VERIFY_ALIASES.get(mode, mode)
    if mode not in VERIFY_MODES:
        raise BadInput(f"unknown verify mode {mode!r} (choose from: {', '.join(VERIFY_MODES)})")
    return mode


def sha256sums_text(hashes: dict[str, str]) -> str:
    """`sha256sum -c` format: '<hex>  <path>' per line, sorted by path (SHA256SUMS's one canonical form)."""
    for p in hashes:
        if "\n" in p or "\\" in p:
            raise BadInput(f"file name {p!r} cannot be written to {PUBLISHED_SUMS}")
    return "".join(f"{hashes[p]}  {p}\n" for p in sorted(hashes))


# ---- the one hasher ---------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike[str], on_block: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file, read into one reused 4 MiB buffer (no allocation per block); `on_block(n)`
    after each block (progress)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        # A small file gets a buffer its size (the driver hashes hundreds of source files).
        buf = bytearray(max(1, min(_BLOCK, os.fstat(f.fileno()).st_size)))
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            if on_block is not None:
                on_block(n)
    return h.hexdigest()


# ---- records, and the one comparison ----------------------------------------------------------
# The one definition of "this file matches its record": `compare_files` (recorded sizes and sha256s
# against what a folder holds). `check_files`, `verify_files` and publish's report check judge
# through it.

MISSING, SIZE, SHA256, UNRECORDED = "missing", "size", "sha256", "unrecorded"


@dataclass(frozen=True)
class RecordedFile:
    """A file as a record describes it (bytes and sha256 may be unrecorded: None)."""

    rel: str  # path relative to the folder, '/'-separated
    bytes: int | None
    sha256: str | None
    recorded_in: str  # the file that records it (artifact.json, manifest.json, SHA256SUMS, report.json)
    what: str = ""  # what it is, for messages ("component 'embed'", "support file 'tokenizer'")

    def describe(self) -> str:
        return self.what or f"listed in {self.recorded_in}"


@dataclass(frozen=True)
class FileMismatch:
    """One file that differs from its record: `problem` is MISSING, SIZE, SHA256 or UNRECORDED (a
    file that a record meant to list every file does not name)."""

    rel: str
    problem: str
    recorded_in: str
    what: str = ""
    recorded: int | str | None = None
    found: int | str | None = None

    def describe(self) -> str:
        """One line: what is wrong with the file."""
        if self.problem == MISSING:
            return f"{self.rel} ({self.what or 'listed in ' + self.recorded_in}) is missing"
        if self.problem == SIZE:
            return f"{self.rel} has {self.found} bytes, {self.recorded_in} says {self.recorded}"
        if self.problem == SHA256:
            return f"{self.rel} does not match its sha256 in {self.recorded_in}"
        return f"{self.rel} is not recorded in {self.recorded_in}"


def compare_files(
    expected: dict[str, RecordedFile],
    sizes: dict[str, int],
    digests: dict[str, str] | None = None,
    *,
    complete: bool = False,
) -> list[FileMismatch]:
    """Every mismatch between recorded files and what a folder holds, in `expected`'s order: a file
    absent from `sizes` is MISSING; a recorded size that differs is SIZE; a recorded sha256 that
    differs from `digests` (where a digest is given) is SHA256. `complete`: the records list every
    file, so a file of `sizes` they do not name is UNRECORDED (listed last, sorted)."""
    out: list[FileMismatch] = []
    for rel, entry in expected.items():
        where = {"recorded_in": entry.recorded_in, "what": entry.what}
        if rel not in sizes:
            out.append(FileMismatch(rel, MISSING, **where))
        elif entry.bytes is not None and entry.bytes != sizes[rel]:
            out.append(FileMismatch(rel, SIZE, **where, recorded=entry.bytes, found=sizes[rel]))
        elif digests is not None and rel in digests and entry.sha256 and digests[rel] != entry.sha256:
            out.append(FileMismatch(rel, SHA256, **where, recorded=entry.sha256, found=digests[rel]))
    if complete:
        recorded_in = next(iter(expected.values())).recorded_in if expected else ARTIFACT_JSON
        out += [FileMismatch(rel, UNRECORDED, recorded_in) for rel in sorted(set(sizes) - set(expected))]
    return out


def size_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sha256_or_none(value: Any) -> str | None:
    ok = isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    return value if ok else None


def recorded_files(
    meta: ArtifactMeta,
    components: tuple[str, ...] | None = None,
    present: Callable[[str], bool] | None = None,
) -> dict[str, RecordedFile]:
    """{relative path: RecordedFile} of what artifact.json records: each component's graph and its
    external data (of `components`, default all), and the support files that have a record.

    `present(rel)` (how a loader sees the folder): a component whose graph is absent is skipped
    (optional components, dvae_encoder, gpt_fast: the runtime refuses later, naming it, if it needs
    one); weights beside a graph that records none are listed unrecorded (they are still opened);
    every support file is listed, recorded or not, but the DVAE coefficients only when present
    (the runtime does not read them; older artifacts lack them).
    """
    out: dict[str, RecordedFile] = {}
    for name, info in sorted(meta.components.items()):
        rel = str(info.get("file", component_file_name(name)))
        if (components is not None and name not in components) or (present is not None and not present(rel)):
            continue
        what = f"component '{name}'"
        out[rel] = RecordedFile(rel, size_or_none(info.get("bytes")), sha256_or_none(info.get("sha256")),
                                ARTIFACT_JSON, what)
        data = info.get("external_data")
        if isinstance(data, dict) and data.get("file"):
            data_rel = (Path(rel).parent / str(data["file"])).as_posix()
            out[data_rel] = RecordedFile(data_rel, size_or_none(data.get("bytes")),
                                         sha256_or_none(data.get("sha256")), ARTIFACT_JSON, what)
        elif present is not None and present(rel + EXTERNAL_DATA_SUFFIX):
            out[rel + EXTERNAL_DATA_SUFFIX] = RecordedFile(rel + EXTERNAL_DATA_SUFFIX, None, None, ARTIFACT_JSON, what)
    if components is not None:
        return out
    for key in SUPPORT_FILES:
        rel, record = meta.support_file(key), meta.support_record(key)
        if record is None and present is None:
            continue  # recorded by name only (older artifacts): nothing to check it against
        if present is not None and key in OPTIONAL_SUPPORT_FILES and not present(rel):
            continue
        out[rel] = RecordedFile(rel, size_or_none((record or {}).get("bytes")),
                                sha256_or_none((record or {}).get("sha256")), ARTIFACT_JSON, f"support file '{key}'")
    return out


# ---- what a folder is checked against --------------------------------------------------------


def _add(out: dict[str, RecordedFile], entry: RecordedFile) -> None:
    old = out.get(entry.rel)
    if old is None:
        out[entry.rel] = entry
        return
    if entry.sha256 and old.sha256 and entry.sha256 != old.sha256:
        raise IntegrityError(f"{entry.recorded_in} and {old.recorded_in} record different sha256s for {entry.rel}: "
                             "the folder was changed after it was made")
    if (old.sha256 is None and entry.sha256 is not None) or (not old.what and entry.what):
        out[entry.rel] = RecordedFile(entry.rel, old.bytes if old.bytes is not None else entry.bytes,
                                      old.sha256 or entry.sha256, old.recorded_in if old.sha256 else entry.recorded_in,
                                      old.what or entry.what)


def artifact_records(meta: ArtifactMeta, present: Callable[[str], bool]) -> list[RecordedFile]:
    """The files artifact.json records, as a loader sees the folder (`present(rel)`: whether a file
    exists): `recorded_files` with `present`."""
    return list(recorded_files(meta, present=present).values())


def published_records(folder: Path) -> list[RecordedFile] | None:
    """The files a published variant folder's manifest.json lists, manifest.json itself (its line in
    SHA256SUMS) and SHA256SUMS (its canonical text, rebuilt from the manifest, must be its bytes);
    None when the folder is not published (no manifest.json)."""
    manifest_path = folder / PUBLISHED_MANIFEST
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        listed = [RecordedFile(str(e["path"]), int(e["bytes"]), str(e["sha256"]), PUBLISHED_MANIFEST) for e in files]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise IntegrityError(f"{manifest_path} is unreadable or malformed ({type(e).__name__}): the published folder "
                             "is damaged") from None
    sums_path = folder / PUBLISHED_SUMS
    try:
        sums_bytes = sums_path.read_bytes()
    except OSError:
        raise IntegrityError(f"{sums_path} is missing or unreadable: the published folder is damaged") from None
    manifest_line = next((line for line in sums_bytes.decode("utf-8", "replace").splitlines()
                          if line.endswith(f"  {PUBLISHED_MANIFEST}")), "")
    manifest_sha = sha256_or_none(manifest_line[:64])
    if manifest_sha is None:
        raise IntegrityError(f"{sums_path} does not list {PUBLISHED_MANIFEST}: the published folder is damaged")
    want = {e.rel: e.sha256 for e in listed} | {PUBLISHED_MANIFEST: manifest_sha}
    if sums_bytes != sha256sums_text(want).encode("utf-8"):  # type: ignore[arg-type]
        raise IntegrityError(f"{sums_path} does not match {PUBLISHED_MANIFEST} (changed or damaged)")
    return [*listed, RecordedFile(PUBLISHED_MANIFEST, None, manifest_sha, PUBLISHED_SUMS)]


def expected_files(folder: str | os.PathLike[str], meta: ArtifactMeta) -> dict[str, RecordedFile]:
    """{relative path: RecordedFile} of every file the folder records (artifact.json, and the manifest of
    a published folder); ForgeError where two records disagree."""
    folder = Path(folder)
    out: dict[str, RecordedFile] = {}
    published = published_records(folder)
    for entry in published or []:
        _add(out, entry)
    for entry in artifact_records(meta, lambda rel: (folder / rel).is_file()):
        _add(out, entry)
    for entry in out.values():  # a recorded path that leads out of the folder is refused, never followed
        resolve_inside(folder, entry.rel, file=folder / entry.recorded_in, field="a file path")
    return dict(sorted(out.items()))


# ---- the stat-keyed cache of known sha256s ----------------------------------------------------


def user_cache_dir() -> Path:
    """Where chattts-forge keeps its per-user cache ($XDG_CACHE_HOME/chattts-forge, else ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "chattts-forge"


def stat_key(st: os.stat_result) -> str:
    """What identifies one version of a file on disk (a changed file gets another key)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class VerifiedHashCache:
    """{(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): sha256} of files hashed while they had that stat.

    The runtime's (default path: under the user cache folder) vouches for an artifact's files found
    as recorded (`hit`, `add`); the build driver's (its own path) fingerprints step inputs and code
    (`sha256`, `tree`). One JSON file, written atomically, merged with what other processes wrote
    meanwhile, bounded to `CACHE_MAX_ENTRIES` (the oldest go first). A missing, unreadable or corrupt
    cache is an empty one (and rewritten on the next save); a cache that cannot be written only costs
    a re-hash next time.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, max_entries: int | None = None) -> None:
        self.path = Path(path) if path is not None else user_cache_dir() / CACHE_FILE
        self.max_entries = max_entries  # None: CACHE_MAX_ENTRIES
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

    def sha256(self, file: Path) -> str:
        """The file's sha256: remembered for its current stat, else hashed (and remembered when the
        file did not change while it was read)."""
        st = os.stat(file)
        known = self.entries.get(stat_key(st))
        if known is not None:
            return known
        digest = sha256_file(file)
        with contextlib.suppress(OSError):
            if stat_key(os.stat(file)) == stat_key(st):
                self.add(st, digest)
        return digest

    def tree(self, root: Path) -> str:
        """Fingerprint of a file or a folder: every file's relative path and sha256."""
        if root.is_file():
            return self.sha256(root)
        if not root.is_dir():
            raise NotFound(f"{root} does not exist")
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.is_file():
                h.update(f"{p.relative_to(root).as_posix()}\0{self.sha256(p)}\n".encode())
        return h.hexdigest()

    def save(self) -> None:
        if not self._new:
            return
        merged = self._read()
        for key, sha in self._new.items():
            merged.pop(key, None)
            merged[key] = sha
        kept = dict(list(merged.items())[-(self.max_entries or CACHE_MAX_ENTRIES):])
        data = json.dumps({"schema": CACHE_SCHEMA, "entries": kept}, indent=0).encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write_bytes(self.path, data)
        except OSError as e:
            log.debug("could not write the verified-hash cache %s (%s): the next load hashes again", self.path, e)
            return
        self.entries, self._new = kept, {}


# ---- checking a folder against its records -----------------------------------------------------


@dataclass
class CheckReport:
    """What a check found and did (the one result of `check_files` and `verify_files`): every file
    that differs from its record (`mismatches`, in the records' order), which files it hashed, which
    the cache vouched for, and how long it took."""

    mode: str
    files: list[str] = field(default_factory=list)
    mismatches: list[FileMismatch] = field(default_factory=list)
    hashed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    bytes_total: int = 0
    bytes_hashed: int = 0
    hash_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches

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


def hash_files(folder: Path, rels: list[str], sizes: dict[str, int]) -> dict[str, str]:
    """{rel: sha256} of files of `folder`, spread over threads, the largest first (so the longest file
    does not start last and leave the other threads idle)."""
    todo = sorted(rels, key=lambda rel: -sizes[rel])
    if not todo:
        return {}
    with ThreadPoolExecutor(max_workers=hash_threads(sizes[r] for r in todo)) as pool:
        return dict(zip(todo, pool.map(lambda rel: sha256_file(folder / rel), todo), strict=True))


def _raise_first(folder: Path, expected: dict[str, RecordedFile], mismatches: list[FileMismatch]) -> None:
    """The first mismatch as the one-line error a loader shows (IntegrityError: ArtifactChanged)."""
    if not mismatches:
        return
    first = mismatches[0]
    path, entry = folder / first.rel, expected[first.rel]
    if first.problem == MISSING:
        raise ArtifactChanged(f"artifact file {path} ({entry.describe()}) is missing")
    if first.problem == SIZE:
        raise ArtifactChanged(f"artifact file {path} has {first.found} bytes, {entry.recorded_in} says "
                              f"{first.recorded}: changed or damaged; refusing to load it")
    bad = sorted(m.rel for m in mismatches if m.problem == SHA256)
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    raise ArtifactChanged(f"artifact file {folder / bad[0]} does not match its sha256 in {expected[bad[0]].recorded_in} "
                          f"(changed or damaged){more}; refusing to load it")


def check_files(
    folder: str | os.PathLike[str],
    expected: dict[str, RecordedFile],
    mode: str = "sha256",
    cache: VerifiedHashCache | None = None,
    *,
    collect: bool = False,
) -> CheckReport:
    """Check `expected` files of `folder` (see the module docstring for the modes). The first problem
    is a one-line ArtifactChanged naming the file; with `collect`, every mismatch is returned in the
    report instead (a file whose size differs is not hashed). `cache`: the verified-hash cache (mode
    sha256; None: the user's)."""
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
            if collect:
                continue  # not the file its record describes: missing
            raise IntegrityError(f"artifact file {path} is not a regular file")
        stats[rel] = st
        report.bytes_total += st.st_size
    sizes = {rel: st.st_size for rel, st in stats.items()}
    found = [m for m in compare_files(expected, sizes) if m.problem == MISSING or mode != "none"]
    if not collect:
        _raise_first(folder, expected, found)
    report.mismatches = found
    if mode in ("size", "none"):
        report.seconds = time.perf_counter() - t0
        return report
    unrecorded = [rel for rel, e in expected.items() if e.sha256 is None and rel in sizes]
    if unrecorded and not collect:
        raise IntegrityError(f"{folder / unrecorded[0]}: no sha256 is recorded for it ({ARTIFACT_JSON} of an artifact "
                         "made before every file was recorded); convert it again, or load it with verify='size' "
                         "(synth --verify size)")
    wrong = {m.rel for m in found}
    candidates = [rel for rel, e in expected.items() if rel in sizes and rel not in wrong and e.sha256]
    if mode == "sha256" and not collect:
        cache = cache if cache is not None else VerifiedHashCache()
        report.cached = [rel for rel in candidates if cache.hit(stats[rel], expected[rel].sha256)]  # type: ignore[arg-type]
    t_hash = time.perf_counter()
    digests = hash_files(folder, [rel for rel in candidates if rel not in report.cached], sizes)
    report.hash_seconds = time.perf_counter() - t_hash
    report.hashed = sorted(digests)
    report.bytes_hashed = sum(stats[rel].st_size for rel in digests)
    report.mismatches = compare_files(expected, sizes, digests)
    if collect:
        report.seconds = time.perf_counter() - t0
        return report
    _raise_first(folder, expected, report.mismatches)
    if cache is not None or mode == "full":
        cache = cache if cache is not None else VerifiedHashCache()
        for rel in digests:
            with contextlib.suppress(OSError):
                if stat_key(os.stat(folder / rel)) == stat_key(stats[rel]):  # unchanged while it was hashed
                    cache.add(stats[rel], digests[rel])
        cache.save()
    report.seconds = time.perf_counter() - t0
    return report


def verify_files(
    folder: str | os.PathLike[str],
    meta: ArtifactMeta,
    *,
    components: tuple[str, ...] | None = None,
    hashed: dict[str, FileEntry] | None = None,
) -> CheckReport:
    """Every file artifact.json records (graphs, external data, support files; only `components`'
    files when given) against `folder`: the report's `mismatches` lists each missing file, wrong size
    and wrong sha256, none left out (no cache is read or written). `hashed`: the folder's files already
    hashed (`hash_tree`), so nothing is read twice. A recorded path that leads out of the folder is a
    one-line ForgeError, never followed."""
    folder = Path(folder)
    expected = recorded_files(meta, components)
    for rel in expected:
        resolve_inside(folder, rel, file=meta.where, field="a recorded file")
    if hashed is None:
        return check_files(folder, expected, "full", collect=True)
    sizes = {rel: hashed[rel].bytes for rel in expected if rel in hashed}
    digests = {rel: hashed[rel].sha256 for rel in sizes}
    return CheckReport("full", files=list(expected), mismatches=compare_files(expected, sizes, digests))
