"""A stand-in evaluation report for tests of publish's mechanics and of the build driver's stand-in stages.

It is a report the strict schema (`chattts_forge.evaluate.report_schema`) accepts, not a copy of
evaluate's output: the artifact is described by evaluate's own `describe_artifact` and judged by the
shipped gate (`gate.judge`) on metric values placed at their thresholds (or below one, to fail),
while the measurement sections (latency, fidelity, ...) are empty. The contract between the two
stages, a report written by `evaluate` and read by `publish`, is tested on real reports in
tests/test_report.py.

Paths are recorded by folder name, not absolute, so two runs in different temporary folders give
the same report bytes (the driver's tests compare published trees across runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chattts_forge.evaluate.gate import judge, load_gate
from chattts_forge.evaluate.report_assembly import describe_artifact
from chattts_forge.evaluate.report_schema import REPORT_SCHEMA, headline, seal, write_report


def stand_in_report(
    artifact: Path, *, passed: bool = True, corpus: dict[str, Any] | None = None,
    created_at: str = "2026-11-30T02:00:00Z",
    buckets: dict[str, tuple[bool, float]] | None = None,
) -> dict[str, Any]:
    """A sealed report judging `artifact` (against itself), passing or failing on code_agreement.

    `buckets`: {bucket name: (passed, median RTF)} of the default length buckets; the ``buckets``
    section then holds those verdicts and figures (what the routing table is made from)."""
    gate = load_gate(None)
    metrics: dict[str, float | None] = {metric: threshold for _, _, metric, threshold in gate["rules"]}
    if not passed:
        metrics["code_agreement"] = 0.0
    verdict = judge(gate, metrics)
    described = {**describe_artifact(Path(artifact)), "dir": Path(artifact).name}
    size = described["bytes_total"]
    report = {
        "schema": REPORT_SCHEMA,
        "created_at": created_at,
        "artifact": described,
        "reference": described,
        "corpus": corpus or {"name": "stand-in", "sentences_used": 0},
        "settings": {},
        "intelligibility": {"measured": False, "reason": "stand-in report", "note": ""},
        "fidelity": {},
        "latency": {},
        "size": {"artifact_bytes": size, "reference_bytes": size, "ratio_vs_reference": 1.0},
        "machine": {"cpu_model": "stand-in cpu", "logical_cores": 2},
        "versions": {},
        "toolchain": {},
        "metrics": metrics,
        "gate": {**verdict, "thresholds": {f"{rule}_{metric}": t for _, rule, metric, t in gate["rules"]},
                 "regression": gate["regression"]},
        "passed": verdict["passed"],
        "headline": headline(described["variant"], verdict["passed"], metrics),
        "notes": ["stand-in report written by the test suite"],
        "timing": {},
        "buckets": _buckets_section(buckets or {}),
        "phrase_cache": None,
    }
    return seal(report)


def _buckets_section(verdicts: dict[str, tuple[bool, float]]) -> dict[str, Any]:
    from chattts_forge.runtime.router import DEFAULT_BUCKETS, LENGTH_DEFINITION

    results = {}
    for b in DEFAULT_BUCKETS:
        if b.name in verdicts:
            passed, rtf = verdicts[b.name]
            results[b.name] = {**b.to_dict(), "sentences": ["stand-in"], "passed": passed,
                               "metrics": {"rtf_p50": rtf, "code_agreement": 1.0 if passed else 0.0}}
    return {"length": LENGTH_DEFINITION, "per_bucket": 1, "definition": [b.to_dict() for b in DEFAULT_BUCKETS],
            "results": results}


def write_stand_in_report(report_dir: Path, artifact: Path, **kwargs: Any) -> Path:
    """`stand_in_report` written as `report_dir/report.json` (through the schema's writer)."""
    return write_report(stand_in_report(artifact, **kwargs), Path(report_dir))


def publish_stand_in_version(artifacts: dict[str, Path], work: Path,
                             verdicts: dict[str, dict[str, tuple[bool, float]]]) -> Path:
    """Publish each variant of `verdicts` ({variant: {bucket: (passed, build RTF)}}) from `artifacts`
    with a stand-in report into `work/artifacts`, then its routing table; the version folder."""
    from chattts_forge.publish import publish_artifact
    from chattts_forge.publish.version_files import publish_version_files

    for variant, buckets in verdicts.items():
        rdir = work / "reports" / variant
        write_stand_in_report(rdir, artifacts[variant], buckets=buckets)
        result = publish_artifact(artifacts[variant], rdir, work / "artifacts")
    version_dir = result.path.parent
    publish_version_files(version_dir)  # routing.json (a phrase cache is warmed through it)
    return version_dir
