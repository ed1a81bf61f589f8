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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from chattts_forge.artifact import VARIANTS
from chattts_forge.codegraph import CodeGraph, Layout
from chattts_forge.driver.steplog import run_stage
from chattts_forge.driver.steps import (
    DEFAULT_CALIB_CORPUS,
    DEFAULT_EVAL_CORPUS,
    DEFAULT_FORGE,
    PRESET_STAGE_ARGS,
    STAGES,
    WARM_ARGS,
    Step,
    StepPlan,
    code_fingerprint,
    step_code_files,
    within,
)
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes, atomic_write_json, recover_replaced_dirs
from chattts_forge.log import get_logger
from chattts_forge.options import option, option_args
from chattts_forge.runtime.cli import WarmOptions

log = get_logger("chattts_forge.pipeline")


@dataclass
class Build(StepPlan):
    """A build: what it builds and its step graph (`StepPlan`), the steps' records and how they are run."""

    # How a stage is run; tests substitute a stand-in.
    forge: list[str] = field(default_factory=lambda: list(DEFAULT_FORGE))
    # Where step closures are read from: the running toolchain; tests pass a copy of the source tree.
    code: CodeGraph = field(default_factory=CodeGraph)
    code_keys: dict[str, str] = field(default_factory=dict)  # subcommand -> code fingerprint, per run
    timings: dict[str, float] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    pages: dict[Path, Path] = field(default_factory=dict)  # version page -> its copy in the build's reports
    overlapped_s: float = 0.0  # step seconds that ran beside other steps (`--jobs`): not wall time

    def without_machine_paths(self, message: str) -> str:
        """`message` (a failed step's: its command line names this machine's folders) as a published page
        may show it: the build, artifacts and checkpoint folders, the working folder and the home folder
        named by placeholders, the longest first."""
        roots = {"<build>": self.work, "<artifacts>": self.to, "<checkpoint>": self.checkpoint,
                 "<cwd>": Path.cwd(), "~": Path.home()}
        given = [(name, Path(p)) for name, p in roots.items() if p is not None]
        spelled = sorted([(str(p), name) for name, p in given] + [(str(p.resolve()), name) for name, p in given],
                         key=lambda r: -len(r[0]))
        for path, name in spelled:
            if len(path) > 1:
                message = message.replace(path, name)
        return message

    # records
    def _record_path(self, step: Step) -> Path:
        return self.work / ".steps" / f"{step.name}.json"

    def _key(self, step: Step) -> str:
        from chattts_forge.versions import library_versions

        if not self.versions:
            self.versions = library_versions()
        ident = {
            "step": step.name,
            "argv": [*step.argv, *self.extra.get(step.kind, [])],
            "inputs": step.inputs,
            "code": self.code_key(step.argv[0]),
            "versions": self.versions,
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()

    def code_key(self, subcommand: str) -> str:
        """Fingerprint of the code a step runs: its import closure, or a substituted command's files."""
        if self.forge == DEFAULT_FORGE:
            if subcommand not in self.code_keys:
                self.code_keys[subcommand] = code_fingerprint(step_code_files(subcommand, self.code), self.cache)
            return self.code_keys[subcommand]
        files = [Path(a) for a in self.forge if Path(a).is_file()]
        return hashlib.sha256(" ".join([*self.forge, *(self.cache.sha256(f) for f in files)]).encode()).hexdigest()

    def _read_record(self, step: Step) -> dict[str, Any] | None:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            record = json.loads(self._record_path(step).read_text(encoding="utf-8"))
            return record if isinstance(record, dict) else None
        return None

    def stale_reason(self, step: Step, key: str) -> str | None:
        """Why `step` must run (None: it is up to date)."""
        record = self._read_record(step)
        if record is None:
            return "no record of a finished run"
        if record.get("key") != key:
            # The record keeps the code fingerprint so the log can tell a code change from the rest.
            if record.get("code") != self.code_key(step.argv[0]):
                return "its code changed"
            return "its command, inputs or library versions changed"
        if not step.out.exists() or record.get("output") != self.cache.tree(step.out):
            return "its output is missing or was changed"
        return None

    def run(self, step: Step) -> bool:
        """Run `step` unless up to date; True when it ran."""
        prepared = self.prepare(step)
        if prepared is None:
            return False
        key, cmd, shown = prepared
        start = time.perf_counter()
        returncode, stdout = run_stage(cmd, stage_env(), step.capture_stdout, step.name)
        self.finish(step, key, shown, returncode, stdout, time.perf_counter() - start)
        return True

    def set_aside(self, step: Step, error: ForgeError) -> None:
        """A failed step: the variants it feeds are set aside (the others are still built, judged and
        published); a step every variant needs (checkpoint, convert) stops the run."""
        if step.optional:
            log.error("%s; going on without it", error)
            return
        if not step.feeds:
            raise error
        for variant in step.feeds:
            self.broken[variant] = str(error)
        log.error("%s; going on without %s", error, ", ".join(step.feeds))

    def prepare(self, step: Step) -> tuple[str, list[str], str] | None:
        """None when `step` is up to date; else remove its record and output and return (key, command,
        the command as logged)."""
        key = self._key(step)
        reason = self.stale_reason(step, key)
        if reason is None:
            log.info("%-22s up to date (%s)", step.name, step.out)
            return None
        self._record_path(step).unlink(missing_ok=True)
        if step.out.exists() and step.out != self.checkpoint:
            shutil.rmtree(step.out) if step.out.is_dir() else step.out.unlink()
        step.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [*self.forge, *step.argv, *self.extra.get(step.kind, [])]
        shown = "chattts-forge " + shlex.join(cmd[len(self.forge) :])
        log.info("%-22s running (%s): %s", step.name, reason, shown)
        return key, cmd, shown

    def finish(self, step: Step, key: str, shown: str, returncode: int, stdout: bytes | None, took: float) -> None:
        """Judge a finished command (wherever it ran) and write the step's record."""
        self.timings[step.name] = took
        if step.capture_stdout and returncode == 0:
            atomic_write_bytes(step.out, stdout or b"")
        if returncode != 0:
            report = step.out / "report.json"
            if not (step.gate_may_fail and report.is_file()):
                raise ForgeError(f"step {step.name} failed (exit {returncode}): {shown}")
            log.info("%-22s gate FAILED (report written: %s)", step.name, step.out)
        if not step.out.exists():
            raise ForgeError(f"step {step.name} finished but wrote nothing at {step.out}")
        atomic_write_json(
            self._record_path(step),
            {
                "step": step.name,
                "key": key,
                "code": self.code_key(step.argv[0]),
                "output": self.cache.tree(step.out),
                "seconds": round(took, 2),
            },
        )
        self.cache.save()
        self.ran.append(step.name)
        log.info("%-22s done in %.1f s", step.name, took)

def stage_env() -> dict[str, str]:
    """The stages' environment, with SOURCE_DATE_EPOCH (reproducible-builds convention) set to the
    toolchain's commit time unless the caller set it: a stage that stamps created_at from it writes
    the same bytes when a killed step is run again."""
    env = dict(os.environ)
    if "SOURCE_DATE_EPOCH" not in env:
        here = Path(__file__).resolve().parent
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            stamp = subprocess.run(
                ["git", "-C", str(here), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=True
            ).stdout.strip()
            if stamp.isdigit():
                env["SOURCE_DATE_EPOCH"] = stamp
    return env


# ---- leftovers and locking -------------------------------------------------------------------


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


def run_tag(checkpoint: Path | None, preset: str, seed: int) -> str:
    if checkpoint is None:
        return f"synthetic-{preset}-seed{seed}"
    where = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:10]
    return f"checkpoint-{where}"


# ---- the run ---------------------------------------------------------------------------------


@dataclass
class VariantOutcome:
    variant: str
    report_dir: Path
    passed: bool | None
    published: Path | None = None
    status: str = ""
    regression: dict[str, Any] | None = None  # its comparison with the baseline version (publish.regression)

    @property
    def refused_as_regression(self) -> bool:
        """Passed its gate, worse than the baseline beyond the tolerance, not accepted: not published."""
        from chattts_forge.publish.regression_gate import refused

        return bool(self.passed) and refused(self.regression)


@dataclass
class BuildConfig:
    """What `run_pipeline` builds: the options of `chattts-forge build`, each field that is one option
    declared with `chattts_forge.options.option` (chattts_forge.driver.cli adds the rest).

    `pytorch_baseline`: time ChatTTS's PyTorch pipeline in every evaluation (ratios in the reports).
    None (default): yes, except for a `tiny` synthetic run, whose latency figures mean nothing and
    which should stay a quick smoke run of the chain (loading torch in every evaluation doubles it).
    `code_root`: key steps on the closures read from this source tree (its pyproject.toml layout)
    instead of the running toolchain's (tests edit a copy, never the real tree).
    `ray`: a Ray cluster address or "local": the variants' quantize and evaluate steps run as Ray
    tasks of `ray_step_cpus` CPUs each, through the shared BUILD path (driver/ray_steps.py).
    `jobs`: calibrate and the quantize steps that time nothing run this many at a time; every step that
    times something still runs alone (driver/side_by_side.py).
    `sign_key`: the PEM private key every published folder is signed with (None: the user's own key
    pair, chattts_forge.signing); its public half is written to `to/signing-key.pub`.
    """

    build: Path = option(Path("build"), "--build", kind="path")
    to: Path = option(Path("artifacts"), "--to", kind="path")
    preset: str = option("full", "--preset", choices=("full", "tiny"))
    seed: int = option(0, "--seed", kind=int)
    checkpoint: str | os.PathLike[str] | None = option(
        None, "--checkpoint", "a real (or any) ChatTTS checkpoint instead of a synthetic one")
    # `--variants a,b` on the command line (chattts_forge.driver.cli)
    variants: tuple[str, ...] = VARIANTS
    calib_corpus: str = option(DEFAULT_CALIB_CORPUS, "--calib-corpus")
    eval_corpus: str = option(DEFAULT_EVAL_CORPUS, "--eval-corpus")
    gate: str | None = option(None, "--gate")
    extra: dict[str, list[str]] | None = None  # `--stage-args STAGE='--opt v'` (repeatable)
    until: str | None = option(None, "--until", "stop after this stage (nothing is published)", choices=STAGES)
    forge_cmd: list[str] | None = None
    pytorch_baseline: bool | None = option(
        None, "--pytorch-baseline/--no-pytorch-baseline",
        "time ChatTTS's PyTorch pipeline in every evaluation (default: yes, except PRESET=tiny)")
    code_root: str | os.PathLike[str] | None = None  # a source copy, for tests (a hidden option)
    ray: str | None = option(
        None, "--ray", "run the variants' quantize/evaluate steps as Ray tasks (BUILD must be a shared path)",
        metavar="ADDRESS|local")
    ray_step_cpus: float = option(2, "--ray-step-cpus", "CPUs reserved per Ray step (default 2)", kind=float)
    # the steps that time nothing (calibrate, quantize but auto), this many at a time
    jobs: int = option(
        1, "--jobs", "run calibrate and the quantize steps that time nothing N at a time; every step that times "
        "something still runs alone (default 1; `make artifacts`: JOBS=2)", kind=click.IntRange(min=1), metavar="N")
    sign_key: str | os.PathLike[str] | None = option(
        None, "--sign-key", "EC private key to sign the published folders with (default: your own key pair in "
        "$XDG_CONFIG_HOME/chattts-forge/, made on first use)", kind="path", metavar="PEM")
    # variants whose absence from the publication fails the run (`--require-published a,b`)
    require_published: tuple[str, ...] = ()
    # The regression gate (publish.regression): the version compared with (None: the newest published),
    # or none at all; variants published despite a regression, and why (recorded in their manifests).
    baseline: str | None = None
    compare_baseline: bool = True
    accept_regression: tuple[str, ...] = ()
    regression_reason: str = ""

    def regression_policy(self) -> Any:
        """The regression options as publish.regression_gate reads them (shared with `chattts-forge publish`)."""
        from chattts_forge.publish.regression_gate import RegressionPolicy

        return RegressionPolicy(self.baseline, self.compare_baseline, tuple(self.accept_regression),
                                self.regression_reason)


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
        outcomes = _publish_passing(pipe, cfg)
        pipe.cache.save()
    _print_summary(pipe, outcomes, time.perf_counter() - started)
    if pipe.broken:
        raise ForgeError(
            f"{len(pipe.broken)} variant(s) could not be built or evaluated ({', '.join(pipe.broken)}); "
            f"the others were judged and published: {next(iter(pipe.broken.values()))}"
        )
    if not any(o.published for o in outcomes):
        raise ForgeError("no variant passed the quality gate; nothing was published (see the reports above)")
    regressions = {o.variant: o.regression for o in outcomes if o.refused_as_regression and o.regression}
    if regressions:
        from chattts_forge.publish.regression_gate import refusal_message

        raise ForgeError(refusal_message(regressions))
    missing = [o for o in outcomes if o.variant in cfg.require_published and not o.published]
    if missing:
        raise ForgeError("required variant(s) not published: " + "; ".join(
            f"{o.variant} ({_why_not_published(o)})" for o in missing))
    return outcomes


def _why_not_published(outcome: VariantOutcome) -> str:
    """A refused variant's failed gate rules (from its report), or why it was not built."""
    if outcome.passed is None:
        return outcome.status or "not built"
    from chattts_forge.evaluate.report_schema import read_report

    failed = read_report(outcome.report_dir).data.get("gate", {}).get("failed", [])
    return "gate failed: " + (", ".join(map(str, failed)) or "see its report")


def _prepared_build(cfg: BuildConfig) -> Build:
    """The build's step graph for `cfg` (variants checked, paths absolute, stage options merged)."""
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown or "fp32" not in cfg.variants:
        raise ForgeError(f"variants must include fp32 and be among {', '.join(VARIANTS)} "
                         f"(got {', '.join(cfg.variants)})")
    not_built = [v for v in cfg.require_published if v not in cfg.variants]
    if not_built:
        raise ForgeError(f"--require-published names variant(s) this build does not build: {', '.join(not_built)}")
    cfg.regression_policy().check(cfg.variants)
    ckpt: Path | None = None
    if cfg.checkpoint:
        from chattts_forge.checkpoint.layout import resolve_asset_dir

        ckpt = resolve_asset_dir(cfg.checkpoint).resolve()
    # Absolute paths: step keys hold command lines, which must not depend on how paths were spelled.
    build, to = Path(cfg.build).resolve(), Path(cfg.to).resolve()
    work = build / run_tag(ckpt, cfg.preset, cfg.seed)
    stage_args: dict[str, list[str]] = {}
    for source in (PRESET_STAGE_ARGS.get(cfg.preset, {}) if ckpt is None else {}, cfg.extra or {}):
        for stage, args in source.items():
            stage_args.setdefault(stage, []).extend(args)
    pipe = Build(work, to, cfg.variants, ckpt, cfg.preset, cfg.seed, cfg.calib_corpus, cfg.eval_corpus, cfg.gate,
                 stage_args, cfg.until)
    pipe.pytorch_baseline = (not (ckpt is None and cfg.preset == "tiny") if cfg.pytorch_baseline is None
                             else cfg.pytorch_baseline)
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
        from chattts_forge.driver.side_by_side import run_with_jobs

        run_with_jobs(pipe, cfg.jobs, until)
        return
    for step in pipe.shared_steps(until) if cfg.ray is not None else pipe.steps(until):
        try:
            pipe.run(step)
        except ForgeError as e:
            pipe.set_aside(step, e)
    if cfg.ray is not None and within("quantize", until):
        from chattts_forge.driver.ray_steps import run_variant_steps

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


def _publish_passing(pipe: Build, cfg: BuildConfig) -> list[VariantOutcome]:
    """Publish (and verify) every variant whose report passed, then each version's serving files."""
    from chattts_forge.evaluate.report_schema import read_report
    from chattts_forge.publish.publish import publish_artifact
    from chattts_forge.publish.verify import verify_path

    outcomes: list[VariantOutcome] = []
    baseline, note = _baseline(pipe, cfg)
    for variant in cfg.variants:
        rdir = pipe.report_dir(variant)
        if variant in pipe.broken:
            outcomes.append(VariantOutcome(variant, rdir, None, status=pipe.broken[variant]))
            continue
        report = read_report(rdir)
        outcome = VariantOutcome(variant, rdir, report.passed)
        if report.passed:
            outcome.regression = _regression(pipe, cfg, variant, baseline, note)
        if outcome.refused_as_regression:
            outcome.status = "refused as a regression"
        elif report.passed:
            result = publish_artifact(pipe.artifact_dir(variant), rdir, Path(cfg.to).resolve(), sign_key=cfg.sign_key,
                                      regression=outcome.regression)
            outcome.published, outcome.status = result.path, result.status
            problems = verify_path(result.path, public_key=result.public_key).problems
            if problems:
                raise ForgeError(f"published {result.path} does not verify: {problems[0]}")
        outcomes.append(outcome)
    for version_dir in sorted({o.published.parent for o in outcomes if o.published}):
        publish_serving_files(pipe, version_dir, outcomes, cfg.sign_key)
    return outcomes


def _baseline(pipe: Build, cfg: BuildConfig) -> tuple[Any, str]:
    """(the version this build is compared with (publish.regression.Baseline) or None, why none)."""
    from chattts_forge.artifact import ArtifactMeta
    from chattts_forge.publish.manifest import default_model_name, source_checkpoint
    from chattts_forge.publish.regression_gate import find_build_baseline

    if not cfg.compare_baseline:
        return find_build_baseline(pipe.to, "", cfg.regression_policy())
    meta = ArtifactMeta.load(pipe.artifact_dir("fp32"))
    return find_build_baseline(pipe.to, default_model_name(meta, source_checkpoint(meta)), cfg.regression_policy())


def _regression(pipe: Build, cfg: BuildConfig, variant: str, baseline: Any, note: str) -> dict[str, Any]:
    """A passing variant's comparison with the same variant of the baseline (publish.regression_gate,
    as `chattts-forge publish` makes it)."""
    from chattts_forge.publish.regression_gate import judge_variant

    return judge_variant(pipe.artifact_dir(variant), pipe.report_dir(variant), pipe.to, baseline, note,
                         cfg.regression_policy())


def version_page(pipe: Build, version_dir: Path, outcomes: list[VariantOutcome]) -> bytes:
    """The version page (evaluate.version_page) of every variant of this run (published, refused by the
    gate, or not built) and of every variant published in this version by an earlier build; its copy
    goes to the build's reports folder."""
    from chattts_forge.evaluate.report_schema import read_report
    from chattts_forge.evaluate.version_page import VariantEntry, render_version_page
    from chattts_forge.publish.regression import published_regression
    from chattts_forge.publish.version_files import published_variants, routing_table
    from chattts_forge.runtime.router import FALLBACK_VARIANT

    here = published_variants(version_dir)
    entries = []
    for o in outcomes:
        if o.passed is None:
            entries.append(VariantEntry(o.variant, "not built", detail=pipe.without_machine_paths(o.status)))
            continue
        report = read_report(o.report_dir).data
        if o.variant in here:  # the page shows the report it was published with (verify checks that)
            published = read_report(here[o.variant] / "report.json").data
            same = published["integrity"] == report["integrity"]
            entries.append(VariantEntry(o.variant, "published", published, o.report_dir if same else None,
                                        "" if same else "published by an earlier build",
                                        published_regression(here[o.variant])))
        elif not o.passed:
            entries.append(VariantEntry(o.variant, "refused", report, o.report_dir))
        elif o.refused_as_regression:
            entries.append(VariantEntry(o.variant, "regression", report, o.report_dir, "", o.regression))
        else:
            where = o.published.parent.name if o.published else "-"
            entries.append(VariantEntry(o.variant, "other version", report, o.report_dir, f"passed; published in {where}",
                                        o.regression))
    shown = {o.variant for o in outcomes}
    for variant, vdir in here.items():
        if variant not in shown:
            entries.append(VariantEntry(variant, "published", read_report(vdir / "report.json").data, None,
                                        "published by an earlier build", published_regression(vdir)))
    routing = routing_table(version_dir) if FALLBACK_VARIANT in here else None
    page = render_version_page(version_dir.parent.name, version_dir.name, entries, routing)
    copy = pipe.work / "reports" / f"{version_dir.parent.name}-{version_dir.name}.html"
    atomic_write_bytes(copy, page)
    pipe.pages[version_dir / "report.html"] = copy
    return page


def publish_serving_files(pipe: Build, version_dir: Path, outcomes: list[VariantOutcome] | None = None,
                          sign_key: str | os.PathLike[str] | None = None) -> None:
    """A published version's routing.json and version page (every variant of `outcomes`), then its phrase
    cache (warmed through that routing table, an incremental step like the others) and the version
    manifest (publish.version_files), signed."""
    from chattts_forge.calibration_data.phrases import latest_version, shipped_phrase_file
    from chattts_forge.publish.version_files import publish_version_files
    from chattts_forge.runtime.router import FALLBACK_VARIANT, ROUTING_NAME

    page = version_page(pipe, version_dir, outcomes) if outcomes is not None else None
    if not (version_dir / FALLBACK_VARIANT / "manifest.json").is_file():
        # e.g. a version opened by one re-quantized variant: nothing to fall back to, so no routing
        # (the version page still shows it against its baseline)
        log.info("%s: no %s published in this version, so no routing table or phrase cache", version_dir,
                 FALLBACK_VARIANT)
        publish_version_files(version_dir, page=page, sign_key=sign_key)
        return
    publish_version_files(version_dir, page=page, sign_key=sign_key, sign=False)  # signed below, with its phrase cache
    phrases = shipped_phrase_file()
    model, version = version_dir.parent.name, version_dir.name
    out = pipe.work / "phrase_cache" / f"{model}-{version}.bin"
    step = Step(
        f"warm-{model}-{version}",
        "warm",
        ["warm", *option_args(WarmOptions, {"artifact": version_dir, "phrases": phrases, "out": out}, spell_defaults=True),
         *WARM_ARGS],
        out,
        # routing.json records every variant's manifest and payload hash: it names what the cache is for.
        {"routing": pipe.cache.sha256(version_dir / ROUTING_NAME), "phrases": pipe.cache.sha256(phrases)},
    )
    pipe.run(step)
    listing = {"name": phrases.stem, "version": latest_version(), "sha256": pipe.cache.sha256(phrases)}
    publish_version_files(version_dir, cache_file=out, phrase_list=listing, page=page, sign_key=sign_key)


def _print_summary(pipe: Build, outcomes: list[VariantOutcome], seconds: float) -> None:
    ran = ", ".join(pipe.ran) if pipe.ran else "nothing (everything up to date)"
    print(f"\npipeline finished in {seconds:.1f} s; ran: {ran}")
    per_stage: dict[str, float] = {}
    for name, took in pipe.timings.items():  # step names start with their stage: quantize-int4, evaluate-fp16
        per_stage[name.split("-")[0]] = per_stage.get(name.split("-")[0], 0.0) + took
    if per_stage:
        # publishing, warming the phrase cache, signing (steps side by side counted once)
        rest = max(0.0, seconds - sum(per_stage.values()) + pipe.overlapped_s)
        overlap = f" ({pipe.overlapped_s:.1f} s of it side by side, --jobs)" if pipe.overlapped_s else ""
        print("time per stage (steps run now): " + ", ".join(f"{k} {v:.1f} s" for k, v in per_stage.items())
              + f"{overlap}; publish and the rest {rest:.1f} s")
    print(f"{'variant':<14} {'gate':<7} {'published':<60} report")
    for o in outcomes:
        gate = "pass" if o.passed else "FAIL" if o.passed is False else "ERROR"
        pub = f"{o.published} ({o.status})" if o.published else "REGRESSION" if o.refused_as_regression else "-"
        report = next((o.report_dir / n for n in ("report.html", "report.md", "report.json") if (o.report_dir / n).exists()), o.report_dir)
        print(f"{o.variant:<14} {gate:<7} {pub:<60} {report if o.passed is not None else o.status}")
    records = {o.variant: o.regression for o in outcomes if o.regression is not None}
    if records:
        from chattts_forge.publish.regression import summary

        print("regression gate (each variant against the same variant of the previous version):")
        for variant, record in records.items():
            print(f"  {summary(variant, record)}")
        atomic_write_json(pipe.work / "reports" / "regression.json", records)
        print(f"  every figure with its interval: {pipe.work / 'reports' / 'regression.json'}")
    print(f"reports: {pipe.work / 'reports'}/<variant>/report.{{json,md,html}}")
    for page, copy in sorted(pipe.pages.items()):
        print(f"version page (every variant, by eye and by ear): {page} (copy: {copy})")
    print(f"published: {pipe.to}/ (index: {pipe.to / 'index.json'}); check with: chattts-forge verify {pipe.to}"
          f" --public-key {pipe.to / 'signing-key.pub'}")
    if (pipe.to / "signing-key.pub").is_file():
        print(f"signed: every published folder holds model.sig; public key {pipe.to / 'signing-key.pub'} "
              "(model_signing verify key DIR --signature DIR/model.sig --public_key KEY)")
