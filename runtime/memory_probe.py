"""Memory of an artifact's runtime: `RssSampler` (this process's peak resident memory per phase) and
`measure_memory` (a variant's own figures, measured in a fresh process).

`measure_memory` runs this module in a new interpreter (`python -m chattts_forge.runtime.memory_probe`,
`probe`), which measures as `chattts-forge bench` does (the same `OnnxEngine`, GPT engine `auto`,
threads and workload: `timing.BENCH_TEXT`, `timing.BENCH_STEPS` steps a row with EOS masked): load
the artifact and run bench's 16-step warm-up (the "load" phase), then synthesize at batch 1, then at
batch 8, each its own phase. Per batch size the figure is the process's peak through load and that
batch (`peak_rss_mb_by_batch`: max of the load phase's and the batch's VmHWM), so the batch-1 figure
is what `bench --artifact DIR --batch 1` prints as its process peak RSS; `after_load_mb` is the
resident size once loaded and warmed. A process of its own per variant: in a shared one, allocators
keep what earlier variants freed, and RSS is per process.

Peak RSS is defined in `runtime.timing` (`peak_rss_bytes`, `hwm_bytes`, `current_rss_bytes`;
docs/bench.md "Definitions").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.timed_engine import OnnxEngine
from chattts_forge.runtime.timing import (
    BENCH_STEPS,
    BENCH_TEXT,
    Request,
    current_rss_bytes,
    hwm_bytes,
    peak_rss_bytes,
)

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
        self.process_peak = peak_rss_bytes()  # before any reset: the peak of the process so far (VmHWM)
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
        return hwm_bytes()

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


PROBE_MODULE = "chattts_forge.runtime.memory_probe"
PROBE_BATCHES = (1, 8)
WARMUP_STEPS = 16  # bench's warm-up run (BenchConfig.warmup_steps), part of the load phase as in bench
MB = 1 / 2**20
PROBE_TIMEOUT_S = 1800


def probe(artifact: str | os.PathLike[str], text: str = BENCH_TEXT, threads: int | None = 2,
          steps: int = BENCH_STEPS, batches: Sequence[int] = PROBE_BATCHES, provider: str = "cpu") -> dict[str, Any]:
    """The figures of `artifact` measured in this process (see module doc); meant for a fresh
    interpreter (`measure_memory`), where nothing else has used memory before it."""
    batches = sorted({int(b) for b in batches})
    t0 = time.perf_counter()
    with RssSampler() as rss:
        base = rss.rss()
        with rss.during("load"):
            engine = OnnxEngine(artifact, threads, provider=provider)
            engine.run([text], Request.fixed_steps(min(WARMUP_STEPS, steps)))
        loaded = rss.rss()
        for b in batches:
            gc.collect()  # as bench does before each timed run
            with rss.during(f"batch:{b}"):
                engine.run([text] * b, Request.fixed_steps(steps))
    load_peak = rss.peaks.get("load", 0)
    by_batch = {str(b): max(load_peak, rss.peaks.get(f"batch:{b}", 0)) * MB for b in batches}
    return {
        "peak_rss_mb": by_batch[str(batches[0])],
        "peak_rss_mb_by_batch": by_batch,
        "after_load_mb": loaded * MB,
        "load_peak_mb": load_peak * MB,
        "python_baseline_mb": base * MB,
        "gpt_engine": engine.gpt_engine,
        "rss_method": rss.method,
        "probe_seconds": time.perf_counter() - t0,
    }


def probe_command(artifact: str, text: str = BENCH_TEXT, threads: int | None = 2, steps: int = BENCH_STEPS,
                  batches: Sequence[int] = PROBE_BATCHES, provider: str = "cpu") -> str:
    """The command that measures the same figures again (`artifact` as the caller wants it shown: a
    published report names the variant folder, relative to its version folder, never a machine path)."""
    words = ["python", "-m", PROBE_MODULE, "--artifact", artifact, "--batch", ",".join(str(b) for b in batches),
             "--steps", str(steps), "--threads", str(threads or 0)]
    if provider != "cpu":
        words += ["--provider", provider]
    if text != BENCH_TEXT:
        words += ["--text", text]
    return shlex.join(words)


def settings_label(label: str | None, artifact_dir: str | os.PathLike[str]) -> str:
    """How a record names the measured artifact: `label`, else its folder's name."""
    return label or Path(artifact_dir).name


def measure_memory(artifact_dir: str | os.PathLike[str], text: str = BENCH_TEXT, threads: int | None = 2,
                   steps: int = BENCH_STEPS, provider: str = "cpu", batches: Sequence[int] = PROBE_BATCHES,
                   label: str | None = None) -> dict[str, Any]:
    """A variant's memory, measured by `probe` in a fresh interpreter (module doc): peak RSS per batch
    size, resident size after load, with the settings, the `command` that repeats it (`label`: how it
    names the artifact, default the folder's name) and the seconds it took (`seconds`, start-up
    included). A probe that fails gives `peak_rss_mb` None and its `error` (logged)."""
    batches = sorted({int(b) for b in batches})
    settings = {"steps": steps, "batches": batches, "threads": threads, "provider": provider, "text": text,
                "warmup_steps": min(WARMUP_STEPS, steps),
                "command": probe_command(settings_label(label, artifact_dir), text, threads, steps, batches, provider),
                "method": "a fresh process per variant (python -m chattts_forge.runtime.memory_probe): load + bench's "
                          f"warm-up, then {steps} steps a row (EOS masked) at batch {', then '.join(map(str, batches))}; "
                          "per batch the peak of load and that batch (kernel VmHWM), MiB"}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads or 1)}
    args = [sys.executable, "-m", PROBE_MODULE, "--artifact", str(artifact_dir), "--text", text, "--steps", str(steps),
            "--batch", ",".join(map(str, batches)), "--threads", str(threads or 0), "--provider", provider]
    t0 = time.perf_counter()
    out: dict[str, Any] | None = None
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=PROBE_TIMEOUT_S)
        why = (proc.stderr.strip().splitlines() or ["?"])[-1]
        if proc.returncode == 0:
            try:
                out = json.loads((proc.stdout.strip().splitlines() or ["?"])[-1])
            except ValueError:
                why = f"the probe printed no figures ({why})"
    except subprocess.TimeoutExpired:
        why = f"the probe took more than {PROBE_TIMEOUT_S} s"
    seconds = time.perf_counter() - t0
    if out is None:
        log.warning("memory probe failed for %s: %s", artifact_dir, why)
        why = why.replace(str(artifact_dir), settings_label(label, artifact_dir))  # recorded: no machine path
        return {"peak_rss_mb": None, "peak_rss_mb_by_batch": {}, "error": why, "seconds": seconds, **settings}
    return {**out, "seconds": seconds, **settings}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m chattts_forge.runtime.memory_probe --artifact DIR`: `probe` in this (fresh) process,
    its figures printed as one JSON line."""
    parser = argparse.ArgumentParser(prog=f"python -m {PROBE_MODULE}", description=(
        "Peak RSS of an artifact's runtime in this process: load + warm-up, then a synthesis at each batch "
        "size (bench's text and steps by default); prints one JSON line."))
    parser.add_argument("--artifact", required=True, help="artifact folder (a published variant folder)")
    parser.add_argument("--batch", default=",".join(map(str, PROBE_BATCHES)), help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=BENCH_STEPS, help="GPT steps a row, EOS masked")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (0: onnxruntime's default)")
    parser.add_argument("--provider", default="cpu", help="cpu or cuda (resolved names only)")
    parser.add_argument("--text", default=BENCH_TEXT, help="text each row synthesizes")
    a = parser.parse_args(argv)
    try:
        batches = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--batch takes comma-separated integers, got {a.batch!r}")
    if not batches or min(batches) < 1 or a.steps < 2 or a.threads < 0:
        parser.error("--batch values must be >= 1, --steps >= 2 and --threads >= 0")
    if not Path(a.artifact).is_dir():
        parser.error(f"artifact folder {a.artifact} does not exist")

    try:
        out = probe(a.artifact, a.text, a.threads or None, a.steps, batches, a.provider)
    except ForgeError as e:  # one line, which measure_memory records as the probe's error
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
