"""One run at a time per build folder (`run_lock`), and what a killed run left behind swept away at the
start of the next (`sweep_leftovers`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import recover_replaced_dirs
from chattts_forge.log import get_logger

log = get_logger("chattts_forge.pipeline")


def sweep_leftovers(root: Path) -> list[Path]:
    """Remove temporary siblings (.NAME.*.partial/.old folders, .NAME.*.tmp files) a kill left."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for dirpath, dirnames, filenames in os.walk(root):
        # A kill between the two renames of a folder replacement left only `.NAME.*.old`: rename it
        # back before anything is deleted (it is the last complete NAME).
        for restored in recover_replaced_dirs(dirpath):
            log.info("restored %s (a replacement of it was interrupted)", restored)
            dirnames.append(restored.name)
        dirnames[:] = sorted(set(n for n in dirnames if (Path(dirpath) / n).is_dir()))
        for name in list(dirnames):
            if name.startswith(".") and (name.endswith(".partial") or name.endswith(".old")):
                shutil.rmtree(Path(dirpath) / name, ignore_errors=True)
                dirnames.remove(name)
                removed.append(Path(dirpath) / name)
        for name in filenames:
            if name.startswith(".") and name.endswith(".tmp"):
                (Path(dirpath) / name).unlink(missing_ok=True)
                removed.append(Path(dirpath) / name)
    for p in removed:
        log.info("removed leftover of an interrupted run: %s", p)
    return removed


@contextlib.contextmanager
def run_lock(work: Path) -> Iterator[None]:
    work.mkdir(parents=True, exist_ok=True)
    fd = os.open(work / ".pipeline.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ForgeError(f"another pipeline run is using {work}; wait for it to finish") from None
        yield
    finally:
        os.close(fd)
