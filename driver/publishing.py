"""Publishing a build: every variant whose gate passed (unless refused as a regression against the
baseline version), then each version's serving files: routing.json, the version page (every variant
of the run), the phrase cache (a warm step like the others) and the signed version manifest."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.calibration_data.phrases import latest_version, shipped_phrase_file
from chattts_forge.driver.config import BuildConfig
from chattts_forge.driver.records import Build
from chattts_forge.driver.steps import WARM_ARGS, Step
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.report_schema import read_report
from chattts_forge.evaluate.version_page import VariantEntry, render_version_page
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.log import get_logger
from chattts_forge.options import option_args
from chattts_forge.publish.manifest import default_model_name, source_checkpoint
from chattts_forge.publish.publish import publish_artifact
from chattts_forge.publish.regression import published_regression
from chattts_forge.publish.regression_gate import find_build_baseline, judge_variant, refused
from chattts_forge.publish.verify import verify_path
from chattts_forge.publish.version_files import publish_version_files, published_variants, routing_table
from chattts_forge.runtime.router import FALLBACK_VARIANT, ROUTING_NAME
from chattts_forge.runtime.synth import WarmConfig

log = get_logger("chattts_forge.pipeline")


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
        return bool(self.passed) and refused(self.regression)


def publish_passing(pipe: Build, cfg: BuildConfig) -> list[VariantOutcome]:
    """Publish (and verify) every variant whose report passed, then each version's serving files."""
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
            result = publish_artifact(
                pipe.artifact_dir(variant),
                rdir,
                Path(cfg.to).resolve(),
                sign_key=cfg.sign_key,
                regression=outcome.regression,
            )
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
    if not cfg.compare_baseline:
        return find_build_baseline(pipe.to, "", cfg.regression_policy())
    meta = ArtifactMeta.load(pipe.artifact_dir("fp32"))
    return find_build_baseline(
        pipe.to, default_model_name(meta, source_checkpoint(meta)), cfg.regression_policy()
    )


def _regression(pipe: Build, cfg: BuildConfig, variant: str, baseline: Any, note: str) -> dict[str, Any]:
    """A passing variant's comparison with the same variant of the baseline (publish.regression_gate,
    as `chattts-forge publish` makes it)."""
    return judge_variant(
        pipe.artifact_dir(variant), pipe.report_dir(variant), pipe.to, baseline, note, cfg.regression_policy()
    )


def version_page(pipe: Build, version_dir: Path, outcomes: list[VariantOutcome]) -> bytes:
    """The version page (evaluate.version_page) of every variant of this run (published, refused by the
    gate, or not built) and of every variant published in this version by an earlier build; its copy
    goes to the build's reports folder."""
    here = published_variants(version_dir)
    entries = []
    for o in outcomes:
        if o.passed is None:
            entries.append(VariantEntry(o.variant, "not built", detail=pipe.without_machine_paths(o.status)))
            continue
        report = read_report(o.report_dir).record
        if o.variant in here:  # the page shows the report it was published with (verify checks that)
            published = read_report(here[o.variant] / "report.json").record
            same = published.integrity == report.integrity
            entries.append(
                VariantEntry(
                    o.variant,
                    "published",
                    published,
                    o.report_dir if same else None,
                    "" if same else "published by an earlier build",
                    published_regression(here[o.variant]),
                )
            )
        elif not o.passed:
            entries.append(VariantEntry(o.variant, "refused", report, o.report_dir))
        elif o.refused_as_regression:
            entries.append(VariantEntry(o.variant, "regression", report, o.report_dir, "", o.regression))
        else:
            where = o.published.parent.name if o.published else "-"
            entries.append(
                VariantEntry(
                    o.variant,
                    "other version",
                    report,
                    o.report_dir,
                    f"passed; published in {where}",
                    o.regression,
                )
            )
    shown = {o.variant for o in outcomes}
    for variant, vdir in here.items():
        if variant not in shown:
            entries.append(
                VariantEntry(
                    variant,
                    "published",
                    read_report(vdir / "report.json").record,
                    None,
                    "published by an earlier build",
                    published_regression(vdir),
                )
            )
    routing = routing_table(version_dir) if FALLBACK_VARIANT in here else None
    page = render_version_page(version_dir.parent.name, version_dir.name, entries, routing)
    copy = pipe.work / "reports" / f"{version_dir.parent.name}-{version_dir.name}.html"
    atomic_write_bytes(copy, page)
    pipe.pages[version_dir / "report.html"] = copy
    return page


def publish_serving_files(
    pipe: Build,
    version_dir: Path,
    outcomes: list[VariantOutcome] | None = None,
    sign_key: str | os.PathLike[str] | None = None,
) -> None:
    """A published version's routing.json and version page (every variant of `outcomes`), then its phrase
    cache (warmed through that routing table, an incremental step like the others) and the version
    manifest (publish.version_files), signed."""
    page = version_page(pipe, version_dir, outcomes) if outcomes is not None else None
    if not (version_dir / FALLBACK_VARIANT / "manifest.json").is_file():
        # e.g. a version opened by one re-quantized variant: nothing to fall back to, so no routing
        # (the version page still shows it against its baseline)
        log.info(
            "%s: no %s published in this version, so no routing table or phrase cache",
            version_dir,
            FALLBACK_VARIANT,
        )
        publish_version_files(version_dir, page=page, sign_key=sign_key)
        return
    publish_version_files(
        version_dir, page=page, sign_key=sign_key, sign=False
    )  # signed below, with its phrase cache
    phrases = shipped_phrase_file()
    model, version = version_dir.parent.name, version_dir.name
    out = pipe.work / "phrase_cache" / f"{model}-{version}.bin"
    step = Step(
        f"warm-{model}-{version}",
        "warm",
        [
            "warm",
            *option_args(
                WarmConfig, {"artifact": version_dir, "phrases": phrases, "out": out}, spell_defaults=True
            ),
            *WARM_ARGS,
        ],
        out,
        # routing.json records every variant's manifest and payload hash: it names what the cache is for.
        {"routing": pipe.cache.sha256(version_dir / ROUTING_NAME), "phrases": pipe.cache.sha256(phrases)},
    )
    pipe.run(step)
    listing = {"name": phrases.stem, "version": latest_version(), "sha256": pipe.cache.sha256(phrases)}
    publish_version_files(version_dir, cache_file=out, phrase_list=listing, page=page, sign_key=sign_key)
