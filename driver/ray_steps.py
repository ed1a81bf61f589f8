"""`make artifacts RAY=ADDRESS|local`: the variants' quantize and evaluate steps as Ray tasks.

The shared steps (checkpoint, verify, convert, calibrate) run here, one after the other, as without
Ray. Then every variant's quantize step runs as a Ray task, side by side; then, here, the shared
latency run (every variant timed against FP32 in the same rounds, as without Ray); then every
variant's evaluate step as a Ray task, side by side. Each task runs the same `chattts-forge` command line in its own process on
whichever node Ray picks, with `step_cpus` CPUs reserved (default 2, the stages' thread count, so two
steps never share cores and latency figures stay honest; fewer means more steps at once and noisier
timings).

Artifacts move through a shared path, not Ray's object store: the command lines name absolute paths
under BUILD, so every node must mount BUILD (and the checkpoint, corpora and gate files) at the same
path and run the same toolchain at the same path (the driver's Python). Only the command, its exit
status, its stdout (a few KB) and where it ran go through Ray. The limit is the shared file system's:
a full-size build moves ~10 GB through it (each variant reads the 1.8 GB FP32 artifact).

Unchanged: the keys (the same `Step`s, keyed and recorded by this process exactly as a local run: a
build made with Ray is up to date for a run without it and back), and crash safety (stages write
through a temporary folder and one rename; the record is written here after the output is checked;
a stage process dies with its Ray worker, so a lost worker leaves nothing half-written, only a step
without a record, which the next run redoes). A lost worker sets its variant aside like any failed
step; the other variants are still judged and published.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from chattts_forge.driver.records import Build, stage_env
from chattts_forge.driver.steps import STAGES, Step
from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.raycluster import connect

log = get_logger("chattts_forge.pipeline")


def _die_with_parent() -> None:
    """In the stage's process: be killed when the Ray worker that started it dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_stage(cmd: list[str], env_overrides: dict[str, str], capture_stdout: bool
              ) -> tuple[int, bytes | None, float, str]:
    """(exit status, stdout if captured, seconds, host): one step's command, run in a Ray worker."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE if capture_stdout else None,
                          env={**os.environ, **env_overrides}, preexec_fn=_die_with_parent)
    return proc.returncode, proc.stdout, time.perf_counter() - start, socket.gethostname()


def run_variant_steps(pipe: Build, address: str, step_cpus: float = 2, last_stage: str = "evaluate",
                      first_stage: str = "quantize") -> None:
    """Run every variant's quantize/evaluate steps from `first_stage` to `last_stage` as Ray tasks
    (see the module docstring)."""
    ray = connect(address)
    task = ray.remote(num_cpus=step_cpus, max_retries=0)(run_stage)
    # The driver's SOURCE_DATE_EPOCH (reproducible stamps); everything else is the worker's own.
    overrides = {k: v for k, v in stage_env().items() if k == "SOURCE_DATE_EPOCH"}
    pending: dict[Any, tuple[Step, str, str]] = {}
    chains = {v: [kind for kind in [*(["quantize"] if v in pipe.quantized_variants() else []), "evaluate"]
                  if STAGES.index(first_stage) <= STAGES.index(kind)] for v in pipe.variants}

    def advance(variant: str) -> None:
        """Submit the variant's next step that is not up to date (none left: its chain is done)."""
        while chains[variant] and variant not in pipe.broken:
            kind = chains[variant].pop(0)
            if STAGES.index(kind) > STAGES.index(last_stage):
                return
            step = pipe.quantize_step(variant) if kind == "quantize" else pipe.evaluate_step(variant)
            prepared = pipe.prepare(step)
            if prepared is not None:
                key, cmd, shown = prepared
                pending[task.remote(cmd, overrides, step.capture_stdout)] = (step, key, shown)
                return

    for variant in pipe.variants:
        advance(variant)
    log.info("Ray: %d step(s) submitted to %s (%s CPUs each)", len(pending), address, step_cpus)
    while pending:
        [ready], _ = ray.wait(list(pending), num_returns=1)
        step, key, shown = pending.pop(ready)
        try:
            try:
                returncode, stdout, took, host = ray.get(ready)
            except ray.exceptions.RayError as e:
                raise ForgeError(f"step {step.name} lost its Ray worker ({type(e).__name__}); "
                                 "run again to redo it") from None
            log.info("%-22s ran on %s", step.name, host)
            pipe.finish(step, key, shown, returncode, stdout, took)
        except ForgeError as e:
            pipe.set_aside(step, e)
            continue
        advance(step.feeds[0])
