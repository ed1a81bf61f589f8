"""Memory of an artifact's runtime: `RssSampler` (this process's peak resident memory per phase) and
`measure_memory` (the peak of a fresh process that loads an artifact and synthesizes once).

Peak RSS is defined in `runtime.timing` (`peak_rss_bytes`, `current_rss_bytes`; docs/bench.md
"Definitions").
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chattts_forge.log import get_logger
from chattts_forge.runtime.timing import current_rss_bytes, peak_rss_bytes

log = get_logger(__name__)


class RssSampler:
    """Peak resident memory of this process per phase.

    On Linux the kernel's own high-water mark is used: writing "5" to /proc/self/clear_refs resets
    VmHWM to the current RSS at the start of a phase, and VmHWM is read at its end - exact, and with
    no sampling thread to steal a core (or the GIL) from the timed engines. Elsewhere a thread samples
    RSS every `interval` s. The resets lower getrusage's ru_maxrss too, so `process_peak` keeps the
    process's peak.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.phase: str | None = None
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.process_peak = peak_rss_bytes()  # before any reset: the peak of the process so far
        self.kernel_hwm = self._reset_hwm()
        self.method = "kernel VmHWM (reset per phase)" if self.kernel_hwm else f"sampled every {interval * 1e3:g} ms"

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return RssSampler._hwm() is not None
        except OSError:
            return False

    @staticmethod
    def _hwm() -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def rss(self) -> int:
        return current_rss_bytes()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.note()

    def note(self) -> None:
        if self.phase is not None:
            r = (self._hwm() or 0) if self.kernel_hwm else self.rss()
            r = max(r, self.rss())
            if r > self.peaks.get(self.phase, 0):
                self.peaks[self.phase] = r
            self.process_peak = max(self.process_peak, r)

    def peak_process(self) -> int:
        """The process's peak RSS so far (getrusage once no reset has lowered it)."""
        return self.process_peak if self.kernel_hwm else max(self.process_peak, peak_rss_bytes())

    def __enter__(self) -> RssSampler:
        if not self.kernel_hwm:
            self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        prev, self.phase = self.phase, phase
        if self.kernel_hwm:
            self._reset_hwm()
        self.note()
        try:
            yield
        finally:
            self.note()
            self.phase = prev


_RSS_PROBE = """
import json, sys
from chattts_forge.runtime.timed_engine import OnnxEngine
from chattts_forge.runtime.timing import Request, current_rss_bytes, peak_rss_bytes
art, text, threads, steps, provider = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
base = current_rss_bytes()
engine = OnnxEngine(art, threads or None, provider=provider)
loaded = current_rss_bytes()
engine.run([text], Request(max_new_token=steps, speaker_seed=0))
peak = peak_rss_bytes()
print(json.dumps({"python_baseline_mb": base / 2**20, "after_load_mb": loaded / 2**20, "peak_rss_mb": peak / 2**20}))
"""


def measure_memory(artifact_dir: str | os.PathLike[str], text: str, threads: int | None = 2,
                   max_new_token: int = 24, provider: str = "cpu") -> dict[str, Any]:
    """Peak RSS (host memory) of a fresh process that loads the artifact and synthesizes `text` once.

    In-process figures are confounded by whatever ran before (allocators keep freed memory), so each
    artifact gets its own short-lived interpreter; the result is what a server would need.
    """
    import json

    env = {**os.environ, "OMP_NUM_THREADS": str(threads or 1)}
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(artifact_dir), text, str(threads or 0), str(max_new_token), provider],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if proc.returncode != 0:
        log.warning("memory probe failed for %s: %s", artifact_dir, proc.stderr.strip().splitlines()[-1:])
        return {"peak_rss_mb": None, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["method"] = f"fresh process: load + one synthesis of {max_new_token} steps, getrusage ru_maxrss"
    return out
