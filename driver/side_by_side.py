"""`--jobs N`: the build's steps that time nothing, N at a time.

Calibrate and every quantize step whose method times nothing (all but auto, whose search times its
candidates' decode steps interleaved) only compute, and what they write does not depend on what runs
beside them. One of them alone leaves cores idle (a quantize step averages 1.2-1.4 of 2 cores:
rewriting graphs and writing 0.7 GB files is one thread), so two at a time finish sooner. Every step
that times something (evaluate-reference, quantize-auto, evaluate-latency, the evaluations) still
runs alone, so no timing shares the machine with the build's own work.

The order with `--jobs` > 1: checkpoint, verify, convert; evaluate-reference (alone: it times the
reference, and every quantize step reads its FP32 runs); then calibrate and the untimed quantize
steps side by side, calibrate first (the steps that read the calibration start once it is done);
then quantize-auto, the latency run and the evaluations, one at a time. Steps keep the keys and
records of a run with `--jobs 1`, so either resumes the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from chattts_forge.driver.records import Build, stage_env
from chattts_forge.driver.steplog import run_stage
from chattts_forge.driver.steps import CALIBRATED, Step, within
from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger

log = get_logger("chattts_forge.pipeline")


@dataclass
class _Planned:
    """An untimed step not started yet: built (its inputs fingerprinted) only once `needs` are done."""

    name: str
    make: Callable[[], Step]
    needs: tuple[str, ...]
    variant: str | None  # the variant it builds (None: calibrate): skipped once that variant is set aside


def run_one(pipe: Build, step: Step) -> None:
    """One step on its own; a failure sets its variants aside (or stops the build: `Build.set_aside`)."""
    try:
        pipe.run(step)
    except ForgeError as e:
        pipe.set_aside(step, e)


def run_with_jobs(pipe: Build, jobs: int, until: str | None) -> None:
    """Every step up to `until`, the untimed ones `jobs` at a time (module docstring)."""
    for step in pipe.shared_steps(until, calibrate=False):
        run_one(pipe, step)
    run_one(pipe, pipe.reference_step())
    timed = [v for v in pipe.quantized_variants() if not pipe.quantize_is_untimed(v)]
    run_untimed(pipe, jobs, [v for v in pipe.quantized_variants() if v not in timed])
    for variant in timed:
        if variant not in pipe.broken:
            run_one(pipe, pipe.quantize_step(variant))
    if within("evaluate", until):
        for step in pipe.evaluation_steps():
            run_one(pipe, step)


def run_untimed(pipe: Build, jobs: int, variants: list[str]) -> None:
    """Calibrate (when a variant of the build reads it) and `variants`' quantize steps, `jobs` at a time."""
    planned: list[_Planned] = []
    calibrate = pipe.calibrate_step()
    if calibrate is not None:
        planned.append(_Planned("calibrate", lambda: calibrate, (), None))
    for v in variants:
        needs = ("calibrate",) if v in CALIBRATED and calibrate is not None else ()
        planned.append(_Planned(f"quantize-{v}", lambda v=v: pipe.quantize_step(v), needs, v))
    done: set[str] = set()
    running: dict[Future[tuple[int, bytes | None]], tuple[Step, str, str, float]] = {}
    started = time.perf_counter()
    busy = 0.0  # the steps' own seconds, summed
    log.info("side by side, %d at a time (they time nothing): %s", jobs, ", ".join(p.name for p in planned))
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="forge-step") as pool:
        while planned or running:
            for item in list(planned):
                if len(running) >= jobs:
                    break
                if item.variant is not None and item.variant in pipe.broken:  # set aside (e.g. calibrate failed)
                    planned.remove(item)
                    continue
                if not all(n in done for n in item.needs):
                    continue
                planned.remove(item)
                step = item.make()
                prepared = pipe.prepare(step)  # records, keys and the hash cache: this thread only
                if prepared is None:
                    done.add(item.name)
                    continue
                key, cmd, shown = prepared
                future = pool.submit(run_stage, cmd, stage_env(), step.capture_stdout, step.name, side_by_side=True)
                running[future] = (step, key, shown, time.perf_counter())
            if not running:
                if planned and not any(p.variant is None or p.variant not in pipe.broken for p in planned):
                    continue  # all that is left is set aside: the loop drops them
                if planned:  # waiting on something that will never finish: a bug in the plan
                    raise ForgeError(f"steps {', '.join(p.name for p in planned)} wait on steps that did not run")
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                step, key, shown, t0 = running.pop(future)
                took = time.perf_counter() - t0
                busy += took
                try:
                    returncode, stdout = future.result()
                    pipe.finish(step, key, shown, returncode, stdout, took)
                    done.add(step.name)
                except ForgeError as e:
                    pipe.set_aside(step, e)
    wall = time.perf_counter() - started
    pipe.overlapped_s += max(0.0, busy - wall)
    if busy:
        log.info("side by side: %.1f s of steps in %.1f s", busy, wall)

