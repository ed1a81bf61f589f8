"""A build's steps as it runs them: `Build` (a `StepPlan` with the steps' records, their keys and how
they are run) and the stages' environment (driver/pipeline.py tells the whole story).

After a step succeeds its record (`BUILD/<run>/.steps/<step>.json`: key, code fingerprint (so the
log can say why a step re-runs), fingerprint of its output) is written atomically; a step whose
record matches and whose output still has the recorded fingerprint is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chattts_forge.codegraph import CodeGraph
from chattts_forge.driver.steplog import run_stage
from chattts_forge.driver.steps import (
    DEFAULT_FORGE,
    Step,
    StepPlan,
    code_fingerprint,
    method_stage_args,
    step_code_files,
)
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes, atomic_write_json
from chattts_forge.log import get_logger
from chattts_forge.versions import library_versions

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
        roots = {
            "<build>": self.work,
            "<artifacts>": self.to,
            "<checkpoint>": self.checkpoint,
            "<cwd>": Path.cwd(),
            "~": Path.home(),
        }
        given = [(name, Path(p)) for name, p in roots.items() if p is not None]
        spelled = sorted(
            [(str(p), name) for name, p in given] + [(str(p.resolve()), name) for name, p in given],
            key=lambda r: -len(r[0]),
        )
        for path, name in spelled:
            if len(path) > 1:
                message = message.replace(path, name)
        return message

    def stage_extra(self, step: Step, log_dropped: bool = False) -> list[str]:
        """The user's `--stage-args` words for `step`: a quantize step gets those its method reads."""
        words = self.extra.get(step.kind, [])
        if step.method is None:
            return words
        kept, dropped = method_stage_args(step.method, words)
        if dropped and log_dropped:
            log.info("%-22s --stage-args quantize: %s not passed (--method %s does not read it)",
                     step.name, shlex.join(dropped), step.method)
        return kept

    # records
    def _record_path(self, step: Step) -> Path:
        return self.work / ".steps" / f"{step.name}.json"

    def _key(self, step: Step) -> str:
        if not self.versions:
            self.versions = library_versions()
        ident = {
            "step": step.name,
            "argv": [*step.argv, *self.stage_extra(step)],
            "inputs": step.inputs,
            "code": self.code_key(step.argv[0]),
            "versions": self.versions,
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()

    def code_key(self, subcommand: str) -> str:
        """Fingerprint of the code a step runs: its import closure, or a substituted command's files."""
        if self.forge == DEFAULT_FORGE:
            if subcommand not in self.code_keys:
                self.code_keys[subcommand] = code_fingerprint(
                    step_code_files(subcommand, self.code), self.cache
                )
            return self.code_keys[subcommand]
        files = [Path(a) for a in self.forge if Path(a).is_file()]
        return hashlib.sha256(
            " ".join([*self.forge, *(self.cache.sha256(f) for f in files)]).encode()
        ).hexdigest()

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
        cmd = [*self.forge, *step.argv, *self.stage_extra(step, log_dropped=True)]
        shown = "chattts-forge " + shlex.join(cmd[len(self.forge) :])
        log.info("%-22s running (%s): %s", step.name, reason, shown)
        return key, cmd, shown

    def finish(
        self, step: Step, key: str, shown: str, returncode: int, stdout: bytes | None, took: float
    ) -> None:
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
                ["git", "-C", str(here), "log", "-1", "--format=%ct"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if stamp.isdigit():
                env["SOURCE_DATE_EPOCH"] = stamp
    return env
