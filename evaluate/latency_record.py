"""The latency record (report.json ``latency.artifact`` / ``latency.reference``, evaluate.latency's
`measure_artifact` / `measure_against`) as a typed record, for the fields other stages read deep
into: the per-sentence utterances and the first audio samples (the regression gate pairs them by
sentence). The rest of the record (throughput, memory, ratios, ...) is evaluate.latency's own and is
not typed here; keys these types do not name are ignored on reading.

Older reports still load: `samples` (per-sentence first audio, since issue 38) and
`stream_lookahead_frames` (since issue 52) are absent there, and a report measured without streaming
has no `first_audio_seconds` at all.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from chattts_forge.errors import BadInput

OptNumber = int | float | None


class Utterance(Struct):
    """One sentence, synthesized alone (its seconds the median of its `runs` when interleaved)."""

    text: str
    seconds: OptNumber = None
    audio_seconds: OptNumber = None
    steps: int | None = None
    rtf: OptNumber = None
    id: str | UnsetType = UNSET
    runs: int | UnsetType = UNSET


class FirstAudioSample(Struct):
    text: str
    seconds: OptNumber = None


class FirstAudio(Struct):
    """Seconds to the first streamed audio; `samples` per sentence and run."""

    p50: OptNumber = None
    stream_batch: int | UnsetType = UNSET
    stream_lookahead_frames: int | UnsetType = UNSET  # since issue 52
    samples: list[FirstAudioSample] = msgspec.field(default_factory=list)  # since issue 38


class LatencyRecord(Struct):
    utterances: list[Utterance] = msgspec.field(default_factory=list)
    first_audio_seconds: FirstAudio | None = None


class LatencySection(Struct):
    """report.json ``latency``: the artifact's and the reference's records (null when not timed)."""

    artifact: LatencyRecord | None = None
    reference: LatencyRecord | None = None


def latency_section(report: dict[str, Any]) -> LatencySection:
    """The report's ``latency`` section, its typed fields checked (an empty section when absent);
    a BadInput names the first field that does not fit."""
    try:
        return msgspec.convert(report.get("latency") or {}, LatencySection, strict=True)
    except msgspec.ValidationError as e:
        raise BadInput(f"report key latency: {e}") from None


def latency_json_schema() -> dict[str, Any]:
    """The JSON Schema of the typed part of a latency record (docs/schemas/latency.schema.json)."""
    return msgspec.json.schema(LatencyRecord)
