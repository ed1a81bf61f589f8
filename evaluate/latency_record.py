"""The latency record (report.json ``latency``: evaluate.latency's `measure_artifact` /
`measure_against` records for the artifact and the reference, the PyTorch baseline's, the ratios) as
typed records, in the order evaluate writes their keys (a record encodes back to the same bytes).

Older reports still load: `runs` (interleaved medians, since issue 27), `samples` (per-sentence first
audio, since issue 38), `stream_lookahead_frames` (since issue 52), `rtf_p50_of_p50s` and the
interleaved ratios are absent there; `rss_mb`, `peak_rss_process_mb` and `memory` were written before
issue 50 moved memory to a process of its own; a report measured without latency has ``{}``.
An unknown key is refused (a new figure is a new field here, in the same commit as its writer).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from chattts_forge.errors import BadInput

Number = int | float
OptNumber = int | float | None


class Percentiles(Struct, forbid_unknown_fields=True):
    """runtime.timing.percentiles: all null for an empty sample."""

    p50: OptNumber
    p95: OptNumber
    p99: OptNumber
    mean: OptNumber
    min: OptNumber
    max: OptNumber


class Utterance(Struct, forbid_unknown_fields=True, kw_only=True):
    """One sentence, synthesized alone (its seconds the median of its `runs` when interleaved)."""

    id: str | UnsetType = UNSET  # absent in a bucket's records
    text: str
    seconds: OptNumber
    audio_seconds: OptNumber
    steps: int | None
    rtf: OptNumber
    runs: int | UnsetType = UNSET


class FirstAudioSample(Struct, forbid_unknown_fields=True):
    text: str
    seconds: OptNumber


class FirstAudio(Percentiles, forbid_unknown_fields=True):
    """Seconds to the first streamed audio; `samples` per sentence and run."""

    stream_batch: int | None
    stream_lookahead_frames: int | None | UnsetType = UNSET  # since issue 52
    runs: int | UnsetType = UNSET
    samples: list[FirstAudioSample] | UnsetType = UNSET  # since issue 38

    def sample_list(self) -> list[FirstAudioSample]:
        return [] if self.samples is UNSET else self.samples


class BatchThroughput(Struct, forbid_unknown_fields=True):
    batch: int
    seconds: OptNumber
    audio_seconds: OptNumber
    steps: int
    aggregate_rtf: OptNumber  # wall seconds per second of audio
    realtime_streams: OptNumber  # seconds of audio per wall second
    steps_per_second: OptNumber


class LatencyRecord(Struct, forbid_unknown_fields=True):
    """One ONNX artifact's timings (evaluate.latency._Measured.record)."""

    artifact: str
    threads: int | None
    max_new_token: int
    gpt_engine: str | None
    load_seconds: OptNumber
    warmup_runs: int
    warmup_seconds: OptNumber
    utterances: list[Utterance]
    rtf: Percentiles
    seconds: Percentiles
    seconds_per_step: Percentiles
    steps_per_second: OptNumber
    total_seconds: OptNumber
    total_audio_seconds: OptNumber
    total_steps: int
    first_audio_seconds: FirstAudio | None
    throughput: dict[str, BatchThroughput]  # batch size (as text) -> its run
    # before issue 50 (memory measured in the timing process; absent since)
    rss_mb: dict[str, OptNumber] | UnsetType = UNSET
    peak_rss_process_mb: OptNumber | UnsetType = UNSET
    memory: dict[str, Any] | None | UnsetType = UNSET
    bytes_on_disk: int | UnsetType = UNSET


class PytorchRecord(Struct, forbid_unknown_fields=True):
    """The PyTorch pipeline's timings (evaluate.latency.measure_pytorch)."""

    checkpoint: str
    pipeline: str
    threads: int | None
    torch: str
    load_seconds: OptNumber
    warmup_runs: int
    utterances: list[Utterance]
    rtf: Percentiles
    seconds: Percentiles
    seconds_per_step: Percentiles
    steps_per_second: OptNumber
    total_seconds: OptNumber
    total_audio_seconds: OptNumber
    total_steps: int


class RatioSet(Struct, forbid_unknown_fields=True):
    rtf_p50: OptNumber
    rtf_p95: OptNumber
    seconds_per_step_p50: OptNumber
    speedup_p50: OptNumber
    load_seconds: OptNumber
    rtf_p50_of_p50s: OptNumber | UnsetType = UNSET  # since issue 27: the gate's rtf_p50 is interleaved


class LatencyRatios(Struct, forbid_unknown_fields=True):
    vs_reference: RatioSet | None
    vs_pytorch: RatioSet | None
    reference_vs_pytorch: RatioSet | None
    # evaluate.step_ratio's record and the interleaved RTF ratio (report_schema's docstring)
    vs_reference_interleaved: dict[str, Any] | None | UnsetType = UNSET
    vs_reference_rtf_interleaved: dict[str, Any] | None | UnsetType = UNSET


class LatencySection(Struct, forbid_unknown_fields=True):
    """report.json ``latency``: the artifact's and the reference's records (``{}`` when not timed)."""

    artifact: LatencyRecord | None | UnsetType = UNSET
    reference: LatencyRecord | None | UnsetType = UNSET
    pytorch: PytorchRecord | None | UnsetType = UNSET
    ratios: LatencyRatios | UnsetType = UNSET
    method: str | UnsetType = UNSET

    def timed(self, side: str) -> LatencyRecord | None:
        """The artifact's or the reference's record, None when it was not timed."""
        record = getattr(self, side)
        return None if record is UNSET else record


def latency_section(report: dict[str, Any]) -> LatencySection:
    """A report dict's ``latency`` section, its fields checked (an empty section when absent);
    a BadInput names the first field that does not fit."""
    try:
        return msgspec.convert(report.get("latency") or {}, LatencySection, strict=True)
    except msgspec.ValidationError as e:
        raise BadInput(f"report key latency: {e}") from None


def latency_json_schema() -> dict[str, Any]:
    """The JSON Schema of report.json's latency section (docs/schemas/latency.schema.json)."""
    return msgspec.json.schema(LatencySection)
