"""What a finished build prints: the steps run and their time per stage, each variant's gate and
publication, the regression gate's verdicts (also written to `reports/regression.json`) and where
the reports, version pages and published folders are."""

from __future__ import annotations

from chattts_forge.driver.publishing import VariantOutcome
from chattts_forge.driver.records import Build
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.publish.regression import summary


def print_summary(pipe: Build, outcomes: list[VariantOutcome], seconds: float) -> None:
    ran = ", ".join(pipe.ran) if pipe.ran else "nothing (everything up to date)"
    print(f"\npipeline finished in {seconds:.1f} s; ran: {ran}")
    per_stage: dict[str, float] = {}
    for name, took in pipe.timings.items():  # step names start with their stage: quantize-int4, evaluate-fp16
        per_stage[name.split("-")[0]] = per_stage.get(name.split("-")[0], 0.0) + took
    if per_stage:
        # publishing, warming the phrase cache, signing (steps side by side counted once)
        rest = max(0.0, seconds - sum(per_stage.values()) + pipe.overlapped_s)
        overlap = f" ({pipe.overlapped_s:.1f} s of it side by side, --jobs)" if pipe.overlapped_s else ""
        print(
            "time per stage (steps run now): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in per_stage.items())
            + f"{overlap}; publish and the rest {rest:.1f} s"
        )
    print(f"{'variant':<14} {'gate':<7} {'published':<60} report")
    for o in outcomes:
        gate = "pass" if o.passed else "FAIL" if o.passed is False else "ERROR"
        pub = (
            f"{o.published} ({o.status})" if o.published else "REGRESSION" if o.refused_as_regression else "-"
        )
        report = next(
            (
                o.report_dir / n
                for n in ("report.html", "report.md", "report.json")
                if (o.report_dir / n).exists()
            ),
            o.report_dir,
        )
        print(f"{o.variant:<14} {gate:<7} {pub:<60} {report if o.passed is not None else o.status}")
    records = {o.variant: o.regression for o in outcomes if o.regression is not None}
    if records:
        print("regression gate (each variant against the same variant of the previous version):")
        for variant, record in records.items():
            print(f"  {summary(variant, record)}")
        atomic_write_json(pipe.work / "reports" / "regression.json", records)
        print(f"  every figure with its interval: {pipe.work / 'reports' / 'regression.json'}")
    print(f"reports: {pipe.work / 'reports'}/<variant>/report.{{json,md,html}}")
    for page, copy in sorted(pipe.pages.items()):
        print(f"version page (every variant, by eye and by ear): {page} (copy: {copy})")
    print(
        f"published: {pipe.to}/ (index: {pipe.to / 'index.json'}); check with: chattts-forge verify {pipe.to}"
        f" --public-key {pipe.to / 'signing-key.pub'}"
    )
    if (pipe.to / "signing-key.pub").is_file():
        print(
            f"signed: every published folder holds model.sig; public key {pipe.to / 'signing-key.pub'} "
            "(model_signing verify key DIR --signature DIR/model.sig --public_key KEY)"
        )
