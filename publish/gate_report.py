"""Reading the evaluate stage's `report.json` as the gate evidence `publish` relies on.

The evaluate stage (chattts_forge.evaluate) writes `REPORT_DIR/report.json`, schema-versioned, naming
the exact file hashes of the artifact it judged, and sealed with an `integrity` field: the sha256 of
the canonical JSON (sorted keys, no whitespace, UTF-8) of every other field. This module is the one
place that knows that format; everything else in `publish` works on `GateReport`.

Refusals (each a ForgeError naming the reason): no report, not JSON, unknown schema, integrity
missing or not matching (the report was edited after the fact), gate not passed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError

REPORT_NAME = "report.json"
REPORT_SCHEMA_PREFIX = "chattts-forge/report/"
INTEGRITY_KEY = "integrity"


def canonical_json_bytes(obj: Any) -> bytes:
    """The canonical form the report's integrity is computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def report_integrity(report: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of every field except `integrity`."""
    rest = {k: v for k, v in report.items() if k != INTEGRITY_KEY}
    return hashlib.sha256(canonical_json_bytes(rest)).hexdigest()


@dataclass(frozen=True)
class GateReport:
    """What `publish` needs from one evaluation report."""

    path: Path
    raw_bytes: bytes
    data: dict[str, Any]
    passed: bool
    artifact_files: dict[str, str]  # relative path -> sha256, as the report judged them
    created_at: str
    thresholds: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    corpus: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw_bytes).hexdigest()

    @property
    def schema(self) -> str:
        return str(self.data.get("schema"))

    def failed_checks(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("passed") is False]


def _files_map(node: Any, where: str) -> dict[str, str]:
    """Accept {"files": {path: sha}} or {"files": [{"path", "sha256"}, ...]} (or the bare mapping)."""
    files = node.get("files") if isinstance(node, dict) and "files" in node else node
    out: dict[str, str] = {}
    if isinstance(files, dict):
        for rel, v in files.items():
            sha = v.get("sha256") if isinstance(v, dict) else v
            if not isinstance(sha, str):
                raise ForgeError(f"{where}: file entry {rel!r} has no sha256")
            out[str(rel)] = sha
    elif isinstance(files, list):
        for entry in files:
            if not isinstance(entry, dict) or "path" not in entry or "sha256" not in entry:
                raise ForgeError(f"{where}: file entries must have 'path' and 'sha256'")
            out[str(entry["path"])] = str(entry["sha256"])
    else:
        raise ForgeError(f"{where}: does not name the judged artifact's files")
    if not out:
        raise ForgeError(f"{where}: names no artifact files")
    return out


def _checks(gate: dict[str, Any]) -> list[dict[str, Any]]:
    checks = gate.get("checks", gate.get("results", []))
    if isinstance(checks, dict):  # {metric: {...}} -> [{"metric": metric, ...}]
        checks = [{"metric": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in checks.items()]
    return [c for c in checks if isinstance(c, dict)]


def parse_report(path: Path, raw: bytes) -> GateReport:
    """Parse and authenticate report bytes; raises ForgeError on anything publish must not trust."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ForgeError(f"{path}: not a valid JSON report ({e})") from None
    if not isinstance(data, dict):
        raise ForgeError(f"{path}: not a JSON object")
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith(REPORT_SCHEMA_PREFIX):
        raise ForgeError(f"{path}: unknown report schema {schema!r} (expected {REPORT_SCHEMA_PREFIX}N)")
    stored = data.get(INTEGRITY_KEY)
    if not isinstance(stored, str):
        raise ForgeError(f"{path}: report has no integrity field; refusing an unsealed report")
    if stored != report_integrity(data):
        raise ForgeError(f"{path}: report integrity mismatch: it was edited after evaluation; refusing it")

    gate = data.get("gate") if isinstance(data.get("gate"), dict) else {}
    passed = gate.get("passed", data.get("passed"))
    if not isinstance(passed, bool):
        raise ForgeError(f"{path}: report does not say whether the gate passed")
    artifact = data.get("artifact")
    if not isinstance(artifact, dict):
        raise ForgeError(f"{path}: report has no 'artifact' section")
    created_at = data.get("created_at")
    if not isinstance(created_at, str) or not created_at:
        raise ForgeError(f"{path}: report has no created_at")
    corpus = data.get("corpus") if isinstance(data.get("corpus"), dict) else {}
    reference = data.get("reference") if isinstance(data.get("reference"), dict) else {}
    machine = data.get("machine", gate.get("machine", {}))
    notes = data.get("notes", [])
    return GateReport(
        path=path,
        raw_bytes=raw,
        data=data,
        passed=passed,
        artifact_files=_files_map(artifact, f"{path}: artifact"),
        created_at=created_at,
        thresholds=dict(gate.get("thresholds", {})) if isinstance(gate.get("thresholds"), dict) else {},
        checks=_checks(gate),
        machine=machine if isinstance(machine, dict) else {},
        corpus=corpus,
        reference=reference,
        headline=data.get("headline", {}) if isinstance(data.get("headline"), dict) else {},
        notes=[str(n) for n in notes] if isinstance(notes, list) else [str(notes)],
    )


def load_report(report: str | Path) -> GateReport:
    """Load REPORT_DIR/report.json (or a report.json path) and check schema and integrity."""
    path = Path(report)
    if path.is_dir():
        path = path / REPORT_NAME
    if not path.is_file():
        raise ForgeError(f"no evaluation report at {path}: run `chattts-forge evaluate` first")
    return parse_report(path, path.read_bytes())
