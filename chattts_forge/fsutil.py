"""Crash-safe file helpers: every write goes to a temporary sibling first, then one rename."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError

_CHUNK = 1 << 20


def _umask() -> int:
    # os.umask can only be read by setting it; restore at once.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _public_file_mode() -> int:
    """The mode open() would give a new file (mkstemp's 0600 would make outputs private)."""
    return 0o666 & ~_umask()


def _public_dir_mode() -> int:
    return 0o777 & ~_umask()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _public_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


@contextlib.contextmanager
def atomic_output_dir(final: str | os.PathLike[str], overwrite: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary folder next to `final`; on success it replaces `final` in one rename.

    On any exception the temporary folder is removed and `final` is left as it was, so a failed
    or killed run never leaves a half-written artifact folder under the final name.
    """
    final = Path(final)
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ForgeError(f"cannot create output folder {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise ForgeError(f"output folder {parent} is not writable")
    if final.exists() and not overwrite:
        raise ForgeError(f"{final} already exists; refusing to overwrite it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=parent))
    os.chmod(tmp, _public_dir_mode())
    try:
        yield tmp
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=parent))
            os.rmdir(old)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def clean_stale_partials(parent: str | os.PathLike[str]) -> list[Path]:
    """Remove `.NAME.*.partial` / `.old` leftovers of a killed run in `parent`; return what went."""
    removed = []
    parent = Path(parent)
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        if p.name.startswith(".") and (p.name.endswith(".partial") or p.name.endswith(".old")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def portable_path(target: str | os.PathLike[str], base: str | os.PathLike[str]) -> str:
    """`target` as an artifact folder `base` records it: relative to that folder, POSIX-style.

    Artifacts are written to a temporary sibling of their final folder, so the relative path is the
    same from both; a build tree then records the same bytes wherever it sits on disk.
    """
    return Path(os.path.relpath(Path(target).resolve(), Path(base).resolve())).as_posix()


def recorded_path(value: str | os.PathLike[str], base: str | os.PathLike[str]) -> Path:
    """A path an artifact folder `base` recorded: relative to it (absolute in older artifacts)."""
    p = Path(value)
    return p if p.is_absolute() else Path(os.path.normpath(Path(base).resolve() / p))


def read_toml(path: str | os.PathLike[str], what: str = "file") -> dict[str, Any]:
    """Parse a TOML file; `what` names it in the one-line errors ("gate file", ...)."""
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ForgeError(
                f"reading {Path(path).name} on Python 3.10 needs the 'tomli' package: pip install tomli"
            ) from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ForgeError(f"{what} {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ForgeError(f"{what} {path} is not valid TOML: {e}") from None


def resolve_inside(
    folder: str | os.PathLike[str], relative: str, *, file: str | os.PathLike[str], field: str
) -> Path:
    """`folder / relative`, refused (one-line ForgeError naming `file` and `field`) unless it stays
    inside `folder`: no absolute path, no `..` climbing out, no symbolic link leading out."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise ForgeError(f"{file}: {field} is not a file name ({relative!r})")
    if Path(relative).is_absolute():
        raise ForgeError(f"{file}: {field} {relative!r} is an absolute path; it must be inside {folder}")
    root = Path(folder).resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ForgeError(f"{file}: {field} {relative!r} leads out of {folder}")
    return Path(folder) / relative
