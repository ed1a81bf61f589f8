"""`chattts-forge build`: the whole pipeline, incremental and kill-safe (what `make artifacts` runs).

Its options are `BuildConfig`'s declared fields (chattts_forge.options) and, written here, the
regression options shared with `publish` (publish.regression_gate) and `--quiet` (logging, not a
setting of the build).
`python -m chattts_forge.driver` is the same command.
"""

from __future__ import annotations

from typing import Any

import click

from chattts_forge.driver.config import BuildConfig
from chattts_forge.driver.pipeline import run_pipeline
from chattts_forge.log import setup_logging
from chattts_forge.options import declared_options
from chattts_forge.publish.regression_gate import RegressionPolicy, regression_options


@click.command("build")
@declared_options(BuildConfig)
@regression_options  # --baseline, --no-baseline, --accept-regression, --reason (shared with publish)
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def build(
    baseline: str | None,
    no_baseline: bool,
    accept_regression: tuple[str, ...],
    reason: str,
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
        baseline=policy.baseline,
        compare_baseline=policy.compare,
        accept_regression=policy.accept,
        regression_reason=policy.reason,
    )
    run_pipeline(config)
