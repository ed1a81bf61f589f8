"""The regression gate as a build and a plain publish both run it: one set of options, one baseline
rule, one record, one refusal (so `chattts-forge build` and `chattts-forge publish` cannot
disagree).

- `REGRESSION_OPTIONS`: `--baseline vN`, `--no-baseline`, `--accept-regression VARIANT` (repeatable,
  comma-separated), `--reason WHY`; declared once, added to both commands by `regression_options`.
- `RegressionPolicy.check`: the options' own errors (the same one-line messages for both).
- `find_build_baseline`: the baseline (the newest published version of the model in the target
  folder, or the requested one), or None and why.
- `judge_variant`: the variant's regression record (publish.regression.compare_build_variant with
  the `[regression]` tolerances its report was judged with), accepted with the reason when told,
  marked ``already_published`` when a version holds its bytes already (publishing it is a no-op).
- `refused` / `refusal_message`: whether a record stops publication, and the error both exit 2 with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from msgspec import UNSET

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.report_schema import read_report
from chattts_forge.log import get_logger
from chattts_forge.publish.manifest import default_model_name, source_checkpoint
from chattts_forge.publish.publish import find_identical, publish_artifact

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Option:
    flag: str
    dest: str
    kind: str  # "value" | "flag" | "append"
    help: str
    metavar: str | None = None


REGRESSION_OPTIONS: tuple[_Option, ...] = (
    _Option("--baseline", "baseline", "value",
            "the published version every variant is compared with (default: the newest of the model)", "vN"),
    _Option("--no-baseline", "no_baseline", "flag", "compare with no previous version"),
    _Option("--accept-regression", "accept_regression", "append",
            "publish VARIANT even if it is worse than the baseline's (repeatable; needs --reason)", "VARIANT"),
    _Option("--reason", "reason", "value", "why the accepted regression may ship (recorded in its manifest)"),
)
_DEFAULTS = {"baseline": None, "reason": ""}


def regression_options(f: F) -> F:
    """The regression options on a click command (build, publish); click applies decorators bottom-up."""
    for o in reversed(REGRESSION_OPTIONS):
        if o.kind == "flag":
            f = click.option(o.flag, o.dest, is_flag=True, default=False, help=o.help)(f)
        elif o.kind == "append":
            f = click.option(o.flag, o.dest, multiple=True, metavar=o.metavar, help=o.help)(f)
        else:
            f = click.option(o.flag, o.dest, default=_DEFAULTS[o.dest], metavar=o.metavar, help=o.help)(f)
    return f


@dataclass(frozen=True)
class RegressionPolicy:
    """What the regression options asked for: the version compared with (None: the newest published),
    whether to compare at all, the variants published despite a regression and why."""

    baseline: str | None = None
    compare: bool = True
    accept: tuple[str, ...] = ()
    reason: str = ""

    @classmethod
    def from_options(cls, baseline: str | None, no_baseline: bool, accept_regression: Iterable[str],
                     reason: str) -> RegressionPolicy:
        """From the parsed options (`--accept-regression a,b` and repeated flags both name several)."""
        accepted = tuple(v for item in accept_regression for v in item.split(",") if v)
        return cls(baseline or None, not no_baseline, accepted, reason or "")

    def check(self, variants: Iterable[str], what: str = "this build does not build") -> None:
        """The options' own errors, before anything is built or published."""
        not_built = [v for v in self.accept if v not in set(variants)]
        if not_built:
            raise ForgeError(f"--accept-regression names variant(s) {what}: {', '.join(not_built)}")
        if self.accept and not self.reason.strip():
            raise ForgeError("--accept-regression needs --reason: why this regression may ship (it goes into the manifest)")
        if self.baseline is not None and not self.compare:
            raise ForgeError("--baseline and --no-baseline exclude each other")


def find_build_baseline(to: Path, model: str, policy: RegressionPolicy) -> tuple[Any, str]:
    """(the version compared with (publish.regression.Baseline) or None, why there is none)."""
    from chattts_forge.publish.regression import NO_BASELINE, find_baseline

    if not policy.compare:
        return None, "no baseline: the build was told --no-baseline"
    baseline = find_baseline(to, model, policy.baseline)
    if baseline is not None:
        get_logger(__name__).info("regression gate: every variant against %s/%s", model, baseline.version)
    return baseline, NO_BASELINE


def report_tolerances(report_dir: Path) -> dict[str, float]:
    """The `[regression]` tolerances of the gate file the report was judged with (recorded in its gate
    section), so a build and a later publish of its report judge with the same numbers."""
    report = read_report(report_dir)
    tolerances = report.record.gate.regression
    if tolerances is UNSET:
        raise ForgeError(f"report {report.path} records no [regression] tolerances (evaluated before the regression "
                         "gate); evaluate the artifact again, or publish with --no-baseline")
    return {str(k): float(v) for k, v in tolerances.items()}


def judge_variant(artifact_dir: Path, report_dir: Path, to: Path, baseline: Any, note: str,
                  policy: RegressionPolicy) -> dict[str, Any]:
    """A passing variant's regression record against the same variant of `baseline` (None: a record
    saying why there is none): accepted with the policy's reason when it names the variant; marked
    ``already_published`` when a version already holds these bytes (never refused: publishing is a no-op)."""
    from chattts_forge.publish.regression import accept, compare_build_variant

    tolerances = report_tolerances(report_dir) if baseline is not None else {}
    record = compare_build_variant(artifact_dir, report_dir, baseline, tolerances, note)
    if record["verdict"] != "regression":
        return record
    variant = record["baseline"]["variant"]
    if variant in policy.accept:
        return accept(record, policy.reason)

    same = find_identical(to, baseline.model, variant, read_report(report_dir).artifact_files)
    return {**record, "already_published": same.parent.name} if same is not None else record


def refused(record: dict[str, Any] | None) -> bool:
    """Worse than the baseline beyond a tolerance, not accepted, not already published: not published."""
    return bool(record and record["verdict"] == "regression" and not record.get("accepted")
                and not record.get("already_published"))


def refusal_message(records: dict[str, dict[str, Any]]) -> str:
    """The one-line error of the refused variants ({variant: record}); the build and publish exit 2 with it."""
    return ("refused as a regression against the previous version (publish them anyway with "
            "--accept-regression VARIANT --reason WHY): " + "; ".join(
                f"{variant}: " + "; ".join(r["figures"][f]["message"] for f in r["regressions"])
                for variant, r in records.items()))


def publish_judged(artifact: Path, report: Path, to: Path, policy: RegressionPolicy, *, model: str | None = None,
                   version: str | None = None, sign_key: Path | None = None,
                   announce: Callable[[str, dict[str, Any]], None] | None = None) -> Any:
    """`chattts-forge publish`: the regression gate as a build runs it (`judge_variant` against the
    newest published version of the model in `to`, or `policy.baseline`), then `publish_artifact`
    with the record in the manifest; a refused variant is a ForgeError with the build's message and
    nothing is written. `announce(variant, record)` hears the record first (the CLI prints its summary)."""
    artifact, report, to = Path(artifact), Path(report), Path(to)
    meta = ArtifactMeta.load(artifact)
    policy.check([str(meta.variant)], what="other than this artifact's")
    record = None
    if read_report(report).passed:  # a failed report is refused by publish_artifact, with its failed checks
        name = model or default_model_name(meta, source_checkpoint(meta))
        baseline, note = find_build_baseline(to, name, policy)
        record = judge_variant(artifact, report, to, baseline, note, policy)
        if announce is not None:
            announce(str(meta.variant), record)
        if refused(record):
            raise ForgeError(refusal_message({str(meta.variant): record}))
    return publish_artifact(artifact, report, to, model=model, version=version, sign_key=sign_key, regression=record)
