"""Running one stage command so that a non-interactive log always shows where the build is.

On a terminal the stage inherits stderr and draws its own progress bars. Elsewhere (a pipeline, CI,
`make artifacts > build.log`) its stderr is read line by line and passed on unchanged, and when the
stage has said nothing for `QUIET_LIMIT_S` seconds the driver logs that the step is still running,
for how long, and how many steps of the build remain: no gap in the log is ever longer than that.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from chattts_forge.log import get_logger
from chattts_forge.progress import format_duration, progress_mode

log = get_logger("chattts_forge.pipeline")

QUIET_LIMIT_S = 30.0
_STAMP = re.compile(rb"\d\d:\d\d:\d\d ")  # chattts_forge.log's line start
_WRITE_LOCK = threading.Lock()  # steps side by side write whole lines, one at a time


def labelled(line: bytes, label: bytes) -> bytes:
    """`line` with `label` (steps side by side: which step said it) after its time stamp, so every
    stamped line of the build's log still begins with its time; an unstamped line begins with it."""
    if not label:
        return line
    if _STAMP.match(line):
        return line[:9] + label + line[9:]
    return label + line


def _forward(stream: IO[bytes], heard: list[float], lock: threading.Lock, label: bytes = b"") -> None:
    """Pass the stage's stderr on line by line (bytes where stderr has a buffer: a captured one may not),
    each line `labelled`."""
    sink = getattr(sys.stderr, "buffer", None)
    for line in iter(stream.readline, b""):
        line = labelled(line, label)
        with _WRITE_LOCK, lock:
            if sink is not None:
                sink.write(line)
                sink.flush()
            else:
                sys.stderr.write(line.decode("utf-8", errors="replace"))
                sys.stderr.flush()
            heard[0] = time.monotonic()
    stream.close()


def run_stage(cmd: Sequence[str], env: dict[str, str], capture_stdout: bool, name: str,
              quiet_limit: float = QUIET_LIMIT_S, side_by_side: bool = False) -> tuple[int, bytes | None]:
    """Run `cmd`; returns (exit status, its stdout when `capture_stdout`). `side_by_side`: other steps
    run at the same time, so its lines are logged (never bars, which would overwrite each other) and
    each names the step (`labelled`)."""
    stdout = subprocess.PIPE if capture_stdout else None
    if progress_mode() == "bar" and not side_by_side:  # a terminal: the stage's own bars show where it is
        proc = subprocess.run(list(cmd), stdout=stdout, env=env)
        return proc.returncode, proc.stdout
    env = {**env, "CHATTTS_FORGE_PROGRESS": "log"}
    started = time.monotonic()
    heard = [started]
    lock = threading.Lock()
    proc_p = subprocess.Popen(list(cmd), stdout=stdout, stderr=subprocess.PIPE, env=env)
    assert proc_p.stderr is not None
    label = f"[{name}] ".encode() if side_by_side else b""
    reader = threading.Thread(target=_forward, args=(proc_p.stderr, heard, lock, label), daemon=True)
    reader.start()
    out_chunks: list[bytes] = []
    out_reader = None
    if capture_stdout:
        assert proc_p.stdout is not None
        out_reader = threading.Thread(target=lambda: out_chunks.append(proc_p.stdout.read()), daemon=True)  # type: ignore[union-attr]
        out_reader.start()
    while True:
        try:
            proc_p.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        with lock:
            quiet = now - heard[0]
        if quiet >= quiet_limit:
            log.info("%s: still running (%s so far; its last output %s ago)", name,
                     format_duration(now - started), format_duration(quiet))
            with lock:
                heard[0] = now
    reader.join()
    if out_reader is not None:
        out_reader.join()
    return proc_p.returncode, b"".join(out_chunks) if capture_stdout else None
