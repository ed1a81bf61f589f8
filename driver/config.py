"""`BuildConfig`: what a build builds, the options of `chattts-forge build` (driver/cli.py), each
declared once on its field (chattts_forge.options)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from chattts_forge.artifact import VARIANTS
from chattts_forge.driver.steps import DEFAULT_CALIB_CORPUS, DEFAULT_EVAL_CORPUS, STAGES
from chattts_forge.errors import BadInput
from chattts_forge.options import option
from chattts_forge.publish.regression_gate import RegressionPolicy


def parse_stage_args(values: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """--stage-args STAGE='--opt v' (repeatable): extra options for one stage's command."""
    out: dict[str, list[str]] = {}
    for item in values:
        stage, _, args = item.partition("=")
        if stage not in (*STAGES, "warm"):
            raise BadInput(f"--stage-args: unknown stage {stage!r} (one of {', '.join(STAGES)}, warm)")
        out.setdefault(stage, []).extend(shlex.split(args))
    return out


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (`--variants a,b`)."""
    return tuple(v for v in text.split(",") if v)


def _spell_names(names: tuple[str, ...]) -> str:
    return ",".join(names)


def _read_command(spelled: str | None) -> list[str] | None:
    return shlex.split(spelled) if spelled else None


@dataclass
class BuildConfig:
    """What `run_pipeline` builds: the options of `chattts-forge build`, each field that is one option
    declared with `chattts_forge.options.option` (chattts_forge.driver.cli adds the regression options
    it shares with `publish`).

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
        None, "--checkpoint", "a real (or any) ChatTTS checkpoint instead of a synthetic one"
    )
    variants: tuple[str, ...] = option(
        VARIANTS, "--variants", "comma-separated variants to build (fp32 among them)", spell=_spell_names,
        convert=_names)
    calib_corpus: str = option(DEFAULT_CALIB_CORPUS, "--calib-corpus")
    eval_corpus: str = option(DEFAULT_EVAL_CORPUS, "--eval-corpus")
    gate: str | None = option(None, "--gate")
    extra: dict[str, list[str]] | None = option(
        None, "--stage-args", "extra options for one stage's command", multiple=True, metavar="STAGE=ARGS",
        convert=parse_stage_args)
    until: str | None = option(
        None, "--until", "stop after this stage (nothing is published)", choices=STAGES
    )
    # a stand-in for the stages' command, for tests
    forge_cmd: list[str] | None = option(None, "--forge-cmd", hidden=True, convert=_read_command)
    pytorch_baseline: bool | None = option(
        None,
        "--pytorch-baseline/--no-pytorch-baseline",
        "time ChatTTS's PyTorch pipeline in every evaluation (default: yes, except PRESET=tiny)",
    )
    code_root: str | os.PathLike[str] | None = option(None, "--code-root", kind="path", hidden=True)  # a source copy, for tests
    ray: str | None = option(
        None,
        "--ray",
        "run the variants' quantize/evaluate steps as Ray tasks (BUILD must be a shared path)",
        metavar="ADDRESS|local",
    )
    ray_step_cpus: float = option(2, "--ray-step-cpus", "CPUs reserved per Ray step (default 2)", kind=float)
    # the steps that time nothing (calibrate, quantize but auto), this many at a time
    jobs: int = option(
        1,
        "--jobs",
        "run calibrate and the quantize steps that time nothing N at a time; every step that times "
        "something still runs alone (default 1; `make artifacts`: JOBS=2)",
        kind=click.IntRange(min=1),
        metavar="N",
    )
    sign_key: str | os.PathLike[str] | None = option(
        None,
        "--sign-key",
        "EC private key to sign the published folders with (default: your own key pair in "
        "$XDG_CONFIG_HOME/chattts-forge/, made on first use)",
        kind="path",
        metavar="PEM",
    )
    # variants whose absence from the publication fails the run
    require_published: tuple[str, ...] = option(
        (), "--require-published", "comma-separated variants that must pass the gate and be published, else exit 2 "
        "(the full-size check: docs/testing.md)", metavar="VARIANTS", spell=_spell_names, convert=_names)
    # The regression gate (publish.regression): the version compared with (None: the newest published),
    # or none at all; variants published despite a regression, and why (recorded in their manifests).
    baseline: str | None = None
    compare_baseline: bool = True
    accept_regression: tuple[str, ...] = ()
    regression_reason: str = ""

    def regression_policy(self) -> Any:
        """The regression options as publish.regression_gate reads them (shared with `chattts-forge publish`)."""
        return RegressionPolicy(
            self.baseline, self.compare_baseline, tuple(self.accept_regression), self.regression_reason
        )
