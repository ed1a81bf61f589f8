"""Progress of long work, on a terminal and in logs alike.

`Progress` draws a tqdm bar when stderr is a terminal. Anywhere else (a build pipeline, CI, `make
artifacts > build.log`) a bar is one line rewritten with carriage returns, unreadable and silent for
minutes, so instead a heartbeat thread logs the same figures as a line every `LOG_INTERVAL_S`
seconds, whether or not an item finished in between, and once at the end:

    12:00:30 INFO    chattts_forge.progress: calibrate: 96/512 sent (18.8%), 0.41 sent/s, ETA 16 min 55 s

`enabled=False` shows nothing (tests, --quiet); None (the default) decides by the terminal.
`CHATTTS_FORGE_PROGRESS=log|bar|off` overrides that choice for every bar of a process.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from chattts_forge.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")

# Lines in non-interactive logs: often enough that a watcher never waits a minute for a sign of life.
LOG_INTERVAL_S = 20.0
ENV_MODE = "CHATTTS_FORGE_PROGRESS"
MODES = ("bar", "log", "off")


def progress_mode(enabled: bool | None = None) -> str:
    """"bar" (tqdm on a terminal), "log" (heartbeat lines) or "off"."""
    if enabled is False:
        return "off"
    forced = os.environ.get(ENV_MODE, "").strip().lower()
    if forced in MODES:
        return forced
    return "bar" if sys.stderr.isatty() else "log"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s} s"
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m} min"


class Progress:
    """A progress bar (tqdm's `update`, `set_postfix_str`, `close`, iteration and `with`) whose figures
    also reach non-interactive logs: done / total, rate and ETA, every `interval` seconds."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", enabled: bool | None = None,
                 interval: float = LOG_INTERVAL_S, leave: bool = True) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.done = 0
        self.postfix = ""
        self.mode = progress_mode(enabled)
        self.started = time.monotonic()
        self.interval = interval
        self._bar: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if self.mode == "bar":
            # tqdm: only when progress is shown; 33 ms to import
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=leave)
        elif self.mode == "log":
            log.info("%s: started (%s %s)", desc, total if total is not None else "?", unit)
            self._thread = threading.Thread(target=self._heartbeat, name=f"progress-{desc}", daemon=True)
            self._thread.start()

    # ---- tqdm's surface ------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            log.info("%s", self.line(final=True))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- the log line --------------------------------------------------------------------
    def line(self, final: bool = False) -> str:
        """`desc: done/total unit (pct), rate unit/s, ETA ...` (or `done in ...` when `final`)."""
        elapsed = time.monotonic() - self.started
        with self._lock:
            done = self.done
        rate = done / elapsed if elapsed > 0 else 0.0
        count = f"{done}/{self.total}" if self.total is not None else f"{done}"
        parts = [f"{self.desc}: {count} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * done / self.total:.1f}%)"
        if final:
            parts.append(f"done in {format_duration(elapsed)}")
        else:
            parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 0.01 or done == 0 else
                         f"{format_duration(elapsed / done)}/{self.unit}")
            if self.total and done:
                parts.append(f"ETA {format_duration((self.total - done) / rate)}")
            elif self.total:
                parts.append(f"running {format_duration(elapsed)}, ETA after the first {self.unit}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.interval):
            log.info("%s", self.line())


def track(items: Iterable[T], desc: str, unit: str = "it", total: int | None = None,
          enabled: bool | None = None, leave: bool = True) -> Iterator[T]:
    """Iterate `items` with a `Progress` (total: `len(items)` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, unit, enabled=enabled, leave=leave) as bar:
        for item in items:
            yield item
            bar.update(1)
