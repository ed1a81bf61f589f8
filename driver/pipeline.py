"""The whole pipeline, incremental and kill-safe: what `make artifacts` runs.

    chattts-forge build [--preset full|tiny] [--seed 0] [--checkpoint DIR]
        [--build build] [--to artifacts] [--calib-corpus SPEC] [--eval-corpus SPEC] [--gate GATE.toml]

Steps (each a `chattts-forge` stage run in its own process, so torch's memory goes away with it):
checkpoint synthesize (skipped with --checkpoint) + verify -> convert (fp32, fp16) -> calibrate
(calibration split) -> quantize dynamic / static / int4 (GPTQ) / auto / dynamic with an INT8 KV cache
(int8-dynamic-kv8, cache scales from the calibration split) -> the FP32 reference's side of every
evaluation, once (evaluate-reference: its latency run and audio, the PyTorch baseline, the ASR of its
audio) -> every variant but fp32 timed against fp32 in the same interleaved rounds, once
(evaluate-latency: the reference synthesized once per round for all of them) -> evaluate every
variant against fp32 (held-out split; each reads those shared runs) -> publish the variants whose
gate passed -> print where the reports are.

Incremental by content: every step has a key, the sha256 of its command, the content fingerprints
of its inputs (upstream outputs, corpus and gate files), the fingerprint of the toolchain code it
runs, and the library versions. The code is the step's import closure, computed from the source
(chattts_forge.codegraph): the `chattts-forge` CLI module and the subcommand's module, every
`chattts_forge` module they import transitively (function-local imports included) and the package
data of the packages involved (corpora, gate toml, release json). So a change to
runtime/fast_gpt.py re-runs convert (its parity check runs the fast GPT) and everything downstream,
and a change to publish code re-runs no stage: publishing itself runs on every invocation, in this
process, and is idempotent (identical bytes are "already-published").

After a step succeeds its record (`BUILD/<run>/.steps/<step>.json`: key, code fingerprint (so the
log can say why a step re-runs), fingerprint of its output) is written atomically; a step whose record matches and whose
output still has the recorded fingerprint is skipped. A step without a valid record (never run,
killed, inputs changed, output touched) has its output removed and is run again. Stages write
their outputs atomically themselves; the driver sweeps `.*.partial`, `.*.old` and `.*.tmp`
leftovers of a killed run at start. Publishing is deterministic (see chattts_forge.publish), so a
killed and restarted run publishes the same bytes as an uninterrupted one from the same reports.
File hashes are cached by (size, mtime, inode), so a run with nothing changed re-hashes nothing.

This module is the run loop (`run_pipeline`); the parts it runs: driver/config.py (`BuildConfig`),
driver/steps.py (the steps), driver/records.py (`Build`: records, keys, running a step),
driver/lock.py (the run lock, the sweep), driver/publishing.py, driver/summary.py, driver/cli.py.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from chattts_forge.artifact import VARIANTS
from chattts_forge.checkpoint.layout import resolve_asset_dir
from chattts_forge.codegraph import CodeGraph, Layout
from chattts_forge.driver.config import BuildConfig
from chattts_forge.driver.lock import run_lock, sweep_leftovers
from chattts_forge.driver.publishing import VariantOutcome, publish_passing
from chattts_forge.driver.ray_steps import run_variant_steps
from chattts_forge.driver.records import Build
from chattts_forge.driver.side_by_side import run_with_jobs
from chattts_forge.driver.steps import PRESET_STAGE_ARGS, within
from chattts_forge.driver.summary import print_summary
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.report_schema import read_report
from chattts_forge.publish.regression_gate import refusal_message

__all__ = ["BuildConfig", "VariantOutcome", "run_pipeline", "run_tag"]


def run_tag(checkpoint: Path | None, preset: str, seed: int) -> str:
    if checkpoint is None:
        return f"synthetic-{preset}-seed{seed}"
    where = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:10]
    return f"checkpoint-{where}"


def run_pipeline(config: BuildConfig | None = None, **fields: Any) -> list[VariantOutcome]:
    """Run (or resume) the pipeline; returns what happened to each variant. `fields` replace those
    of `config` (default `BuildConfig()`), so `run_pipeline(build=..., preset="tiny")` works too."""
    cfg = replace(config or BuildConfig(), **fields)
    pipe = _prepared_build(cfg)
    started = time.perf_counter()
    with run_lock(pipe.work):
        sweep_leftovers(pipe.work)
        _run_steps(pipe, cfg)
        if cfg.until:
            pipe.cache.save()
            print(f"stopped after {cfg.until}: {pipe.work}")
            return []
        outcomes = publish_passing(pipe, cfg)
        pipe.cache.save()
    print_summary(pipe, outcomes, time.perf_counter() - started)
    if pipe.broken:
        raise ForgeError(
            f"{len(pipe.broken)} variant(s) could not be built or evaluated ({', '.join(pipe.broken)}); "
            f"the others were judged and published: {next(iter(pipe.broken.values()))}"
        )
    if not any(o.published for o in outcomes):
        raise ForgeError("no variant passed the quality gate; nothing was published (see the reports above)")
    regressions = {o.variant: o.regression for o in outcomes if o.refused_as_regression and o.regression}
    if regressions:
        raise ForgeError(refusal_message(regressions))
    missing = [o for o in outcomes if o.variant in cfg.require_published and not o.published]
    if missing:
        raise ForgeError(
            "required variant(s) not published: "
            + "; ".join(f"{o.variant} ({_why_not_published(o)})" for o in missing)
        )
    return outcomes


def _why_not_published(outcome: VariantOutcome) -> str:
    """A refused variant's failed gate rules (from its report), or why it was not built."""
    if outcome.passed is None:
        return outcome.status or "not built"

    failed = read_report(outcome.report_dir).record.gate.failed
    return "gate failed: " + (", ".join(map(str, failed)) or "see its report")


def _prepared_build(cfg: BuildConfig) -> Build:
    """The build's step graph for `cfg` (variants checked, paths absolute, stage options merged)."""
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown or "fp32" not in cfg.variants:
        raise ForgeError(
            f"variants must include fp32 and be among {', '.join(VARIANTS)} (got {', '.join(cfg.variants)})"
        )
    not_built = [v for v in cfg.require_published if v not in cfg.variants]
    if not_built:
        raise ForgeError(
            f"--require-published names variant(s) this build does not build: {', '.join(not_built)}"
        )
    cfg.regression_policy().check(cfg.variants)
    ckpt: Path | None = None
    if cfg.checkpoint:
        ckpt = resolve_asset_dir(cfg.checkpoint).resolve()
    # Absolute paths: step keys hold command lines, which must not depend on how paths were spelled.
    build, to = Path(cfg.build).resolve(), Path(cfg.to).resolve()
    work = build / run_tag(ckpt, cfg.preset, cfg.seed)
    stage_args: dict[str, list[str]] = {}
    for source in (PRESET_STAGE_ARGS.get(cfg.preset, {}) if ckpt is None else {}, cfg.extra or {}):
        for stage, args in source.items():
            stage_args.setdefault(stage, []).extend(args)
    pipe = Build(
        work,
        to,
        cfg.variants,
        ckpt,
        cfg.preset,
        cfg.seed,
        cfg.calib_corpus,
        cfg.eval_corpus,
        cfg.gate,
        stage_args,
        cfg.until,
    )
    pipe.pytorch_baseline = (
        not (ckpt is None and cfg.preset == "tiny") if cfg.pytorch_baseline is None else cfg.pytorch_baseline
    )
    if cfg.forge_cmd:
        pipe.forge = list(cfg.forge_cmd)
    if cfg.code_root is not None:
        pipe.code = CodeGraph(Layout.from_pyproject(cfg.code_root))
    return pipe


def _run_steps(pipe: Build, cfg: BuildConfig) -> None:
    """Every step up to `cfg.until`, each redone only when its key changed; a step that fails sets
    its variant aside (the others go on). With Ray, the variants' steps run as Ray tasks."""
    until = cfg.until
    if cfg.ray is None and cfg.jobs > 1 and within("quantize", until) and pipe.quantized_variants():
        run_with_jobs(pipe, cfg.jobs, until)
        return
    for step in pipe.shared_steps(until) if cfg.ray is not None else pipe.steps(until):
        try:
            pipe.run(step)
        except ForgeError as e:
            pipe.set_aside(step, e)
    if cfg.ray is not None and within("quantize", until):
        evaluating = within("evaluate", until)
        if evaluating:  # the evaluations' shared step, here
            pipe.run(pipe.reference_step())
        run_variant_steps(pipe, cfg.ray, cfg.ray_step_cpus, "quantize")
        if evaluating:
            # every variant quantized: the shared latency run here, as without Ray (the same step keys),
            # then the evaluations as Ray tasks
            latency = pipe.latency_step()
            if latency is not None:
                try:
                    pipe.run(latency)
                except ForgeError as e:
                    pipe.set_aside(latency, e)
            run_variant_steps(pipe, cfg.ray, cfg.ray_step_cpus, "evaluate", first_stage="evaluate")
