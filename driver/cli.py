"""`chattts-forge build`: the whole pipeline, incremental and kill-safe (what `make artifacts` runs).

Its options are `BuildConfig`'s declared fields (chattts_forge.options) and, written here, those whose
command-line spelling is not the field's value: the comma-separated variant lists, `--stage-args`,
the regression options shared with `publish` (publish.regression_gate) and the hidden test hooks.
`python -m chattts_forge.driver` is the same command.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from chattts_forge.artifact import VARIANTS
from chattts_forge.driver.config import BuildConfig
from chattts_forge.driver.pipeline import run_pipeline
from chattts_forge.driver.steps import STAGES
from chattts_forge.errors import ForgeError
from chattts_forge.log import setup_logging
from chattts_forge.options import declared_options
from chattts_forge.publish.regression_gate import RegressionPolicy, regression_options


def parse_stage_args(values: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """--stage-args STAGE='--opt v' (repeatable): extra options for one stage's command."""
    out: dict[str, list[str]] = {}
    for item in values:
        stage, _, args = item.partition("=")
        if stage not in (*STAGES, "warm"):
            raise ForgeError(f"--stage-args: unknown stage {stage!r} (one of {', '.join(STAGES)}, warm)")
        out.setdefault(stage, []).extend(shlex.split(args))
    return out


def _names(text: str) -> tuple[str, ...]:
    return tuple(v for v in text.split(",") if v)


@click.command("build")
@declared_options(BuildConfig)
@click.option(
    "--variants", default=",".join(VARIANTS), help="comma-separated variants to build (fp32 among them)"
)
@click.option(
    "--stage-args", multiple=True, metavar="STAGE=ARGS", help="extra options for one stage's command"
)
@click.option(
    "--require-published",
    default="",
    metavar="VARIANTS",
    help="comma-separated variants that must pass the gate and be published, else exit 2 "
    "(the full-size check: docs/testing.md)",
)
@regression_options  # --baseline, --no-baseline, --accept-regression, --reason (shared with publish)
@click.option("--forge-cmd", default=None, hidden=True)  # a stand-in for the stages' command, for tests
@click.option(
    "--code-root", type=click.Path(path_type=Path), default=None, hidden=True
)  # a source copy, for tests
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def build(
    variants: str,
    stage_args: tuple[str, ...],
    require_published: str,
    baseline: str | None,
    no_baseline: bool,
    accept_regression: tuple[str, ...],
    reason: str,
    forge_cmd: str | None,
    code_root: Path | None,
    quiet: bool,
    **declared: Any,
) -> None:
    """Run every stage (each step redone only when its inputs or code changed), then publish the
    variants whose gate passed and print where the reports are (driver/pipeline.py tells the whole story)."""
    if quiet:
        setup_logging(-1)
    policy = RegressionPolicy.from_options(baseline, no_baseline, accept_regression, reason)
    # an empty value (a Makefile variable left empty) means "not given"
    for name in ("checkpoint", "gate", "ray"):
        declared[name] = declared[name] or None
    config = BuildConfig(
        **declared,
        variants=_names(variants),
        extra=parse_stage_args(stage_args),
        forge_cmd=shlex.split(forge_cmd) if forge_cmd else None,
        code_root=code_root,
        require_published=_names(require_published),
        baseline=policy.baseline,
        compare_baseline=policy.compare,
        accept_regression=policy.accept,
        regression_reason=policy.reason,
    )
    run_pipeline(config)
