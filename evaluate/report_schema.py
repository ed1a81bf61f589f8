"""The one home of the evaluation report's contract: write (atomic), seal, read (seal verified), strict.

The evaluate stage writes `REPORT_DIR/report.json` through `write_report`; the publish stage (and
the build driver) read it through `read_report`. Nothing else knows the format.

report.json (schema ``chattts-forge/report/1``); every top-level key is required and no other is
accepted (`report_record.ReportRecord`):

- ``schema``, ``created_at`` (UTC, ISO 8601), ``passed`` (bool, the gate's verdict);
- ``artifact`` / ``reference`` (`ARTIFACT_KEYS`): ``{"dir", "name", "variant", "files": {relative path:
  {"sha256", "bytes"}}, "bytes_total", "manifest_mismatches": [..], "source": {"kind", ...},
  "precisions", "quantization_method", "quantization_search"}``: the exact bytes judged (every file under the folder, as
  `chattts_forge.folder_files.hash_tree` lists them);
- ``gate`` (`GATE_KEYS`): ``{"passed", "path", "sha256", "schema", "thresholds": {"min_code_agreement":
  x, ...}, "checks": [{"section", "metric", "rule", "threshold", "value", "unit", "status", "passed",
  "margin", "message"}] (`CHECK_KEYS`), "failed": [metric], "waived": {metric: reason}, "regression":
  {figure: tolerance} (the gate file's [regression] section; since issue 38, absent before)}`` (see gate.py);
- ``metrics`` (flat name -> value, the gate's inputs), ``headline`` (`HEADLINE_KEYS`: the figures to
  compare variants by; since issue 50 also `HEADLINE_OPTIONAL_METRICS`, absent before, and
  ``peak_rss_mb`` is the variant's own batch-1 peak, measured in a process of its own; before, the
  peak of a process shared with the build's other variants), ``notes`` (plain sentences, e.g. why
  intelligibility was not measured);
- ``intelligibility``: ``{"measured": false, "reason", "note"}`` on synthetic checkpoints, else
  ``{"measured": true, "wer"/"cer", "reference_wer"/..., "wer_delta"/"cer_delta", "languages":
  {lang: {"asr", "variants": {"artifact"|"reference": {"corpus", "utterances"}}}}}``;
- ``fidelity``: `chattts_forge.quantize.measure_fidelity`'s record;
- ``latency``: ``{"artifact", "reference", "pytorch" (or null), "ratios": {"vs_reference",
  "vs_pytorch", "reference_vs_pytorch", "vs_reference_interleaved" (evaluate.step_ratio; null for
  FP32 against itself), "vs_reference_rtf_interleaved" (since issue 27; absent in earlier reports,
  null for FP32 against itself)}, "method"}`` (records of `latency.measure_against`, or
  `latency.measure_artifact` for FP32 against itself). ``vs_reference_rtf_interleaved`` is the
  gate's RTF ratio measured with the two interleaved: ``{"ratio", "low", "high", "spread",
  "artifact_rtf", "reference_rtf", "rounds", "sentences", "stopped", "converged", "bound",
  "time_cap_s", "seconds", "method"}``; ``vs_reference.rtf_p50`` (the gate's
  ``rtf_ratio_vs_reference``) is its ``ratio``, the ratio of the two p50s kept as
  ``vs_reference.rtf_p50_of_p50s``; utterance records then carry ``runs`` (their seconds the
  median of those runs);
- ``size`` (`SIZE_KEYS`), ``corpus``, ``settings``, ``machine``, ``versions``, ``toolchain``, ``timing``;
- ``memory`` (optional, since issue 50): ``{"artifact", "reference": the fresh-process probe of each
  (runtime.memory_probe.measure_memory: "peak_rss_mb_by_batch" {"1", "8"}, "peak_rss_mb" (batch 1),
  "after_load_mb", "load_peak_mb", "python_baseline_mb", "steps", "batches", "threads", "provider",
  "text", "warmup_steps", "gpt_engine", "rss_method", "method", "command" (repeats it from the version
  folder), "seconds", "probe_seconds"; "error" when it failed), "ratio_vs_reference": {batch: the
  artifact's peak over the reference's}, "definition"}``; the latency records carry no memory then;
- ``buckets``: per length bucket of the held-out corpus, fidelity/intelligibility/latency and the
  bucket's gate verdict (`evaluate.buckets`; the routing table is made from it);
- ``phrase_cache``: latency with and without a warm phrase cache at a stated hit ratio
  (`evaluate.serving`), or null when not measured;
- optional (`OPTIONAL_TOP_LEVEL`, written by evaluate since issue 25; absent in earlier reports):
  ``speaker``, ``naturalness`` (evaluate.listening), ``streaming`` (evaluate.seams), ``listen``
  (``{"format", "mime", "sentences": [{"id", "text", "artifact"|"reference": {"file", "sha256",
  "seconds"}, "spectrogram": {"file", "sha256"}}], "spectrogram"}``: files beside report.json),
  ``intervals`` and ``sentences`` (evaluate.intervals);
- ``integrity``: sha256 (hex) of the canonical JSON of every *other* top-level field:
  ``json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")``
  (`canonical_json_bytes`, `report_integrity`). Any edit after evaluation breaks it and `read_report`
  refuses it. Non-finite floats are stored as null (`seal`) so the JSON is strict (RFC 8259) and the
  canonical form is stable.

The types are evaluate.report_record's (msgspec; docs/schemas/report.schema.json is generated from
them): artifact, gate, checks, headline, size, latency (evaluate.latency_record), memory, buckets,
listen, intervals and phrase_cache are checked key by key, and so are the sections other modules write
(fidelity, intelligibility, speaker, naturalness, streaming, corpus, settings, machine, toolchain,
timing, sentences, the memory probes' records, the auto search: evaluate.report_sections); the auto
search's final timing and the ASR scores per language (evaluate.score's) are checked for their type only.
`write_report` writes the record's encoding (`report_json_bytes`): its keys in the order the record
declares, which is the order evaluate assembles them in, so the bytes are what they were. A missing or unknown key is a one-line `BadInput` naming it (e.g.
``gate.checks[2].margin``), on writing as on reading, so evaluate cannot write a report publish refuses.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, ForgeError, IntegrityError, NotFound
from chattts_forge.evaluate.report_record import (
    ArtifactSection,
    GateCheck,
    Headline,
    ReportRecord,
    check_report,
    report_builtins,
)
from chattts_forge.fsutil import atomic_output_dir
from chattts_forge.integrity import PUBLISHED_REPORT
from chattts_forge.log import get_logger

log = get_logger(__name__)

REPORT_NAME = PUBLISHED_REPORT
REPORT_SCHEMA = "chattts-forge/report/1"
INTEGRITY_KEY = "integrity"

# ------------------------------------------------------------------ the schema: evaluate.report_record's types
CHECK_STATUSES = ("pass", "fail", "waived", "not_measured")
# The figures a reader compares variants by (copied into the manifest and index.json by publish).
HEADLINE_METRICS = ("rtf_p50", "rtf_ratio_vs_reference", "rtf_ratio_vs_pytorch", "first_audio_seconds",
                    "code_agreement", "hidden_cosine", "mel_snr_db", "wer", "cer", "size_mb", "peak_rss_mb")
# Headline figures evaluate writes since issue 50 (absent in earlier reports): batch-8 peak RSS and the
# batch-1 peak over FP32's, each variant measured in a process of its own (the ``memory`` section).
HEADLINE_OPTIONAL_METRICS = ("peak_rss_b8_mb", "peak_rss_ratio_vs_reference")
# Sections evaluate writes since issue 25 (memory: issue 50); optional so earlier reports of the
# same schema still read: typed when present (report_record.ReportRecord).
OPTIONAL_TOP_LEVEL = ("speaker", "naturalness", "streaming", "listen", "intervals", "sentences", "memory")


def headline(variant: str | None, passed: bool, metrics: Mapping[str, float | None]) -> dict[str, Any]:
    """The report's ``headline`` section from the gate's flat metrics."""
    return {"variant": variant, "passed": passed,
            **{k: metrics.get(k) for k in (*HEADLINE_METRICS, *HEADLINE_OPTIONAL_METRICS)}}


def validate(report: Any) -> ReportRecord:
    """Strict check of a report against the schema (every key known, present and of its type): its record."""
    if not isinstance(report, dict):
        raise BadInput(f"a report must be a JSON object, got {type(report).__name__}")
    if report.get("schema") != REPORT_SCHEMA:
        raise BadInput(f"unknown report schema {report.get('schema')!r} (expected {REPORT_SCHEMA})")
    record = check_report(report)
    for i, check in enumerate(record.gate.checks):
        if check.status not in CHECK_STATUSES:
            raise BadInput(f"report key gate.checks[{i}].status is {check.status!r}, "
                             f"not one of {', '.join(CHECK_STATUSES)}")
    if record.passed != record.gate.passed:
        raise BadInput("report key passed contradicts gate.passed")
    if not record.artifact.files:
        raise BadInput("report key artifact.files names no file")
    return record


# ------------------------------------------------------------------ the seal


def _finite(obj: Any) -> Any:
    """Replace NaN/inf by None (strict JSON), recursively; tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _finite(obj.item())
    return obj


def canonical_json_bytes(obj: Any) -> bytes:
    """The canonical form the report's integrity is computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def report_integrity(report: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of every field except `integrity`."""
    rest = {k: v for k, v in report.items() if k != INTEGRITY_KEY}
    return hashlib.sha256(canonical_json_bytes(rest)).hexdigest()


def seal(report: Mapping[str, Any]) -> dict[str, Any]:
    """A strict-JSON copy of `report` with its integrity field set."""
    clean = _finite({k: v for k, v in report.items() if k != INTEGRITY_KEY})
    clean[INTEGRITY_KEY] = report_integrity(clean)
    return clean


def verify_integrity(report: Mapping[str, Any]) -> bool:
    return report.get(INTEGRITY_KEY) == report_integrity(report)


# ------------------------------------------------------------------ write and read


def report_json_bytes(report: ReportRecord | Mapping[str, Any]) -> bytes:
    """report.json's bytes, encoded from its record (a dict is checked into one first): keys in the
    record's order, indented, UTF-8, strict JSON (no NaN), one trailing newline."""
    record = report if isinstance(report, ReportRecord) else check_report(dict(report))
    return (json.dumps(report_builtins(record), indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def write_report(report: Mapping[str, Any], out_dir: Path, renderings: Mapping[str, str | bytes] | None = None) -> Path:
    """Write a sealed, valid `report` as `out_dir/report.json`, with `renderings` ({relative path: text
    or bytes}) beside it, atomically (one folder rename: all files or none). Returns `out_dir`."""
    if not verify_integrity(report):
        raise BadInput("refusing to write an unsealed report (seal it first)")
    record = validate(report)
    renderings = dict(renderings or {})
    if REPORT_NAME in renderings:
        raise BadInput(f"a rendering may not be named {REPORT_NAME}")
    with atomic_output_dir(Path(out_dir)) as tmp:
        (tmp / REPORT_NAME).write_bytes(report_json_bytes(record))
        for name, content in renderings.items():
            target = tmp / name
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise BadInput(f"a rendering's path must stay inside the report folder, got {name!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
    shown = [n for n in renderings if "/" not in n]
    extra = len(renderings) - len(shown)
    log.info("wrote %s%s", ", ".join(str(Path(out_dir) / n) for n in (REPORT_NAME, *shown)),
             f" and {extra} listening file(s) under {Path(out_dir)}" if extra else "")
    return Path(out_dir)


@dataclass(frozen=True)
class SealedReport:
    """A report.json that was read, its seal verified and its keys validated (`read_report`): `record`
    is the report every reader takes (the properties below are its parts); there is no dict view of it."""

    path: Path
    raw_bytes: bytes
    record: ReportRecord

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw_bytes).hexdigest()

    @property
    def schema(self) -> str:
        return self.record.schema

    @property
    def integrity(self) -> str:
        return self.record.integrity

    @property
    def passed(self) -> bool:
        return self.record.passed

    @property
    def created_at(self) -> str:
        return self.record.created_at

    @property
    def artifact_files(self) -> dict[str, str]:
        """{file name: sha256} of the artifact the report judged."""
        return {name: entry.sha256 for name, entry in self.record.artifact.files.items()}

    @property
    def checks(self) -> list[GateCheck]:
        return self.record.gate.checks

    @property
    def thresholds(self) -> dict[str, int | float]:
        return self.record.gate.thresholds

    @property
    def headline(self) -> Headline:
        return self.record.headline

    @property
    def reference(self) -> ArtifactSection:
        return self.record.reference

    @property
    def notes(self) -> list[str]:
        return self.record.notes

    def failed_checks(self) -> list[GateCheck]:
        """The gate's checks that keep it from passing (failed, or not measured)."""
        return [c for c in self.record.gate.checks if c.status in ("fail", "not_measured")]


def parse_report(path: Path, raw: bytes) -> SealedReport:
    """Parse, authenticate and validate report bytes; ForgeError (naming `path` and why) otherwise."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: not a valid JSON report ({e})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a JSON object")
    if data.get("schema") != REPORT_SCHEMA:
        raise BadInput(f"{path}: unknown report schema {data.get('schema')!r} (expected {REPORT_SCHEMA})")
    stored = data.get(INTEGRITY_KEY)
    if not isinstance(stored, str):
        raise IntegrityError(f"{path}: report has no integrity field; refusing an unsealed report")
    if stored != report_integrity(data):
        raise IntegrityError(f"{path}: report integrity mismatch: it was edited after evaluation; refusing it")
    try:
        record = validate(data)
    except ForgeError as e:
        raise ForgeError(f"{path}: {e}") from None
    return SealedReport(path=path, raw_bytes=raw, record=record)


def read_report(report: str | Path) -> SealedReport:
    """Read REPORT_DIR/report.json (or a report.json path): schema, seal and keys checked."""
    path = Path(report)
    if path.is_dir():
        path = path / REPORT_NAME
    if not path.is_file():
        raise NotFound(f"no evaluation report at {path}: run `chattts-forge evaluate` first")
    return parse_report(path, path.read_bytes())
