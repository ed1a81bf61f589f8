"""report.json as a typed record: the top level, artifact, gate and its checks, headline, size,
latency (evaluate.latency_record), memory, buckets, listen, intervals and phrase_cache are typed here;
the sections other modules write (fidelity, intelligibility, speaker, naturalness, streaming, corpus,
settings, machine, toolchain, timing, the per-sentence rows, an artifact's source, each side's
memory probe, the listen spectrograms' settings) are evaluate.report_sections' types. Open maps
remain where a key is data (versions: distribution -> version; precisions: component -> precision)
and two payloads another module owns: the auto search's final timing
(`artifact.quantization_search.final_timing`) and the ASR scores inside
`intelligibility.languages` (evaluate.score's corpus and utterance records, the backend's
description).

Fields are declared in the order evaluate writes them, so `report_builtins(record)` gives the keys
back in that order: report_schema.write_report encodes the record and the bytes (and the integrity
hash, computed over sorted keys) are what they were. A section absent in older reports is UNSET
(left out when encoded); every report a published build holds loads and encodes back byte for byte.

`check_report(report)` is evaluate.report_schema's strict check (every key known, present and of its
type): a msgspec conversion with type checks, its error turned into the report's one-line message
naming the dotted path (``report key headline.rtf_p50 is missing``, ``unknown report key
buckets.results.medium.gate.checks[0].approved_by``, ``report key artifact.files.gpt.onnx.bytes must
be int, got str``). docs/schemas/report.schema.json is generated from these types.
"""

from __future__ import annotations

import copy
import re
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType

from chattts_forge.errors import BadInput
from chattts_forge.evaluate.latency_record import LatencySection, Number, OptNumber, Percentiles, Utterance
from chattts_forge.evaluate.report_sections import (
    ArtifactSource,
    AutoSearchSummary,
    CorpusSection,
    FidelityRecord,
    IntelligibilitySection,
    MachineSection,
    MemoryProbe,
    NaturalnessSection,
    SentenceRow,
    SettingsSection,
    SpeakerSection,
    SpectrogramSettings,
    StreamingSection,
    TimingSection,
    ToolchainInfo,
)


class FileRecord(Struct, forbid_unknown_fields=True):
    sha256: str
    bytes: int


class ArtifactSection(Struct, forbid_unknown_fields=True):
    """The exact bytes judged (`artifact` and `reference`)."""

    dir: str
    name: str | None
    variant: str | None
    files: dict[str, FileRecord]
    bytes_total: int
    manifest_mismatches: list[str]
    source: ArtifactSource
    precisions: dict[str, str]  # component -> its precision
    quantization_method: str | None
    quantization_search: AutoSearchSummary | None  # quantize --method auto's search; null for other methods


class GateCheck(Struct, forbid_unknown_fields=True):
    section: str
    metric: str
    rule: str
    threshold: OptNumber
    value: OptNumber
    unit: str
    status: str  # one of report_schema.CHECK_STATUSES (checked there, with its own message)
    passed: bool | None
    margin: OptNumber
    message: str


class GateSection(Struct, forbid_unknown_fields=True):
    path: str
    sha256: str
    schema: str
    passed: bool
    checks: list[GateCheck]
    failed: list[str]
    waived: dict[str, str]
    thresholds: dict[str, Number]
    # the gate file's [regression] tolerances (since issue 38; absent in earlier reports)
    regression: dict[str, Number] | msgspec.UnsetType = msgspec.UNSET


class Headline(Struct, forbid_unknown_fields=True):
    """The figures to compare variants by (report_schema.HEADLINE_METRICS)."""

    variant: str | None
    passed: bool
    rtf_p50: OptNumber
    rtf_ratio_vs_reference: OptNumber
    rtf_ratio_vs_pytorch: OptNumber
    first_audio_seconds: OptNumber
    code_agreement: OptNumber
    hidden_cosine: OptNumber
    mel_snr_db: OptNumber
    wer: OptNumber
    cer: OptNumber
    size_mb: OptNumber
    peak_rss_mb: OptNumber
    # since issue 50 (absent before): batch-8 peak and batch-1 peak over FP32's
    peak_rss_b8_mb: OptNumber | msgspec.UnsetType = msgspec.UNSET
    peak_rss_ratio_vs_reference: OptNumber | msgspec.UnsetType = msgspec.UNSET


class SizeSection(Struct, forbid_unknown_fields=True):
    artifact_bytes: int
    reference_bytes: int
    ratio_vs_reference: OptNumber


class BucketDefinition(Struct, forbid_unknown_fields=True):
    name: str
    min_chars: int
    max_chars: int | None


class BucketLatencySide(Struct, forbid_unknown_fields=True):
    """A bucket's sentences timed on one side (evaluate.buckets.time_sentences)."""

    utterances: list[Utterance]
    rtf: Percentiles
    seconds: Percentiles


class BucketLatency(Struct, forbid_unknown_fields=True):
    artifact: BucketLatencySide
    reference: BucketLatencySide
    ratio_vs_reference: OptNumber


class BucketGate(Struct, forbid_unknown_fields=True):
    passed: bool
    checks: list[GateCheck]
    failed: list[str]
    waived: dict[str, str]


class BucketResult(Struct, forbid_unknown_fields=True, kw_only=True):
    """One length bucket's figures and verdict (evaluate.buckets.measure_buckets); `chars` and the
    measured sections are absent in reports written before them (tests' minimal buckets too)."""

    name: str
    min_chars: int
    max_chars: int | None
    sentences: list[str]
    chars: list[int] | UnsetType = UNSET
    latency: BucketLatency | None | UnsetType = UNSET
    fidelity: FidelityRecord | None | UnsetType = UNSET
    intelligibility: IntelligibilitySection | UnsetType = UNSET
    metrics: dict[str, OptNumber]
    gate: BucketGate | None | UnsetType = UNSET
    passed: bool | None
    note: str | None | UnsetType = UNSET


class BucketsSection(Struct, forbid_unknown_fields=True):
    length: str | UnsetType = UNSET
    per_bucket: int | UnsetType = UNSET
    definition: list[BucketDefinition] | UnsetType = UNSET
    results: dict[str, BucketResult] | UnsetType = UNSET  # bucket name -> its result

    def result_map(self) -> dict[str, BucketResult]:
        return {} if self.results is UNSET else self.results


class MemorySection(Struct, forbid_unknown_fields=True):
    """Each side's fresh-process probe (runtime.memory_probe.measure_memory's record; null when not
    probed) and the artifact's peak over the reference's."""

    artifact: MemoryProbe | None
    reference: MemoryProbe | None
    definition: str
    ratio_vs_reference: dict[str, OptNumber]  # batch size (as text) -> ratio


class IntervalFigure(Struct, forbid_unknown_fields=True):
    value: OptNumber
    low: OptNumber
    high: OptNumber
    n: int
    how: str


class IntervalsSection(Struct, forbid_unknown_fields=True):
    confidence: Number
    resamples: int
    method: str
    figures: dict[str, IntervalFigure]  # figure name -> its interval


class ListenFile(Struct, forbid_unknown_fields=True):
    file: str
    sha256: str
    seconds: OptNumber | UnsetType = UNSET  # audio only


class ListenSentence(Struct, forbid_unknown_fields=True):
    id: str
    text: str
    artifact: ListenFile
    reference: ListenFile
    spectrogram: ListenFile


class ListenSection(Struct, forbid_unknown_fields=True):
    format: str
    mime: str
    sentences: list[ListenSentence]
    spectrogram: SpectrogramSettings


class PhraseCacheSection(Struct, forbid_unknown_fields=True):
    hit_ratio: Number
    phrases: int
    miss_seconds: Percentiles
    hit_seconds: Percentiles
    hit_over_miss: OptNumber
    mean_seconds_no_cache: OptNumber
    mean_seconds_at_hit_ratio: OptNumber
    speedup_at_hit_ratio: OptNumber
    max_abs_diff: OptNumber
    cache_bytes: int
    method: str


class ReportRecord(Struct, forbid_unknown_fields=True, kw_only=True):
    """report.json, its fields in the order evaluate writes them (the encoder keeps that order)."""

    schema: str
    created_at: str
    artifact: ArtifactSection
    reference: ArtifactSection
    corpus: CorpusSection
    settings: SettingsSection
    intelligibility: IntelligibilitySection
    fidelity: FidelityRecord
    # written by evaluate since issue 25 (memory: issue 50); absent in earlier reports of this schema
    speaker: SpeakerSection | UnsetType = UNSET
    naturalness: NaturalnessSection | UnsetType = UNSET
    streaming: StreamingSection | UnsetType = UNSET
    listen: ListenSection | UnsetType = UNSET
    latency: LatencySection
    memory: MemorySection | UnsetType = UNSET
    size: SizeSection
    machine: MachineSection
    versions: dict[str, str | None]  # distribution -> version (None: not installed)
    toolchain: ToolchainInfo
    buckets: BucketsSection
    phrase_cache: PhraseCacheSection | None
    metrics: dict[str, OptNumber]
    intervals: IntervalsSection | UnsetType = UNSET
    sentences: list[SentenceRow] | UnsetType = UNSET
    gate: GateSection
    passed: bool
    headline: Headline
    notes: list[str]
    timing: TimingSection
    integrity: str


# msgspec's names of JSON types -> the ones the report's messages have always used (Python's)
_TYPE_NAMES = {
    "object": "dict",
    "array": "list",
    "null": "null",
    "float": "float",
    "int": "int",
    "str": "str",
    "bool": "bool",
}
_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")


def _parts(path: str) -> list[str | int | None]:
    """`$.a.b[2][...]` -> ["a", "b", 2, None] (None: a key msgspec does not name)."""
    out: list[str | int | None] = []
    for name, index in _PATH_PART.findall(path[1:]):
        out.append(name if name else None if index == "..." else int(index))
    return out


def _name_keys(report: dict[str, Any], parts: list[str | int | None], message: str) -> list[str | int]:
    """Fill in the map keys msgspec leaves out (`[...]`): the first key whose entry alone still fails
    with the same message (only on the error path, so a valid report costs nothing)."""
    named: list[str | int] = []
    node: Any = report
    for i, part in enumerate(parts):
        if part is None and isinstance(node, dict):
            for key in node:
                trial = copy.deepcopy(report)
                target = trial
                for p in named:
                    target = target[p]
                target_map = {key: target[key]}
                target.clear()
                target.update(target_map)
                try:
                    msgspec.convert(trial, ReportRecord, strict=True)
                except msgspec.ValidationError as e:
                    if str(e).split(" - at ")[0] == message:
                        part = key
                        break
            else:
                return [*named, *(p if p is not None else "..." for p in parts[i:])]
        named.append(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return named


def _dotted(parts: list[str | int]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else f".{p}" if text else str(p)
    return text


def check_report(report: dict[str, Any]) -> ReportRecord:
    """The report as its typed record; BadInput naming the first key that is missing, unknown or of
    another type."""
    try:
        return msgspec.convert(report, ReportRecord, strict=True)
    except msgspec.ValidationError as e:
        message, _, at = str(e).partition(" - at `")
        parts = _name_keys(report, _parts(at.rstrip("`")), message) if at else []
        where = _dotted(parts)
        prefix = f"{where}." if where else ""
        if m := re.fullmatch(r"Object missing required field `(.+)`", message):
            raise BadInput(f"report key {prefix}{m.group(1)} is missing") from None
        if m := re.fullmatch(r"Object contains unknown field `(.+)`", message):
            raise BadInput(f"unknown report key {prefix}{m.group(1)}") from None
        if m := re.fullmatch(r"Expected `(.+)`, got `(.+)`", message):
            alone = {"object": "an object", "array": "a list"}
            want = alone.get(m.group(1)) or " or ".join(
                _TYPE_NAMES.get(t, t) for t in m.group(1).split(" | ")
            )
            got = "NoneType" if m.group(2) == "null" else _TYPE_NAMES.get(m.group(2), m.group(2))
            raise BadInput(f"report key {where} must be {want}, got {got}") from None
        raise BadInput(f"report key {where or '(top level)'}: {message}") from None


def report_json_schema() -> dict[str, Any]:
    """The JSON Schema of report.json's typed top level (docs/schemas/report.schema.json)."""
    return msgspec.json.schema(ReportRecord)


def _plain(obj: Any) -> Any:
    """A str subclass (torch's TorchVersion, ...) as the plain str json.dumps writes for it."""
    if isinstance(obj, str):
        return str(obj)
    raise TypeError(f"a report cannot hold a {type(obj).__name__}")


T = TypeVar("T")


def or_none(value: T | UnsetType) -> T | None:
    """A field a report may predate: None when it does (UNSET), what a map's .get gave for an absent key."""
    return None if value is UNSET else value


def section_builtins(section: Struct | None | UnsetType) -> dict[str, Any]:
    """A typed section as the JSON object it was read from ({} when absent or null): for documents that
    embed a section (publish.manifest's gate) and for copying a record keyed by its own key list
    (publish.version_files.memory_figures); readers take the typed attributes."""
    if section is None or section is UNSET:
        return {}
    out: dict[str, Any] = msgspec.to_builtins(section, enc_hook=_plain)
    return out


def report_builtins(record: ReportRecord) -> dict[str, Any]:
    """The record as JSON-ready builtins, keys in the written order (absent optional sections left out)."""
    out: dict[str, Any] = msgspec.to_builtins(record, enc_hook=_plain)
    return out
