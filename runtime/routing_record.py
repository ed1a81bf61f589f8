"""routing.json as a typed record: the one reader and writer of its bytes (runtime.router's docstring
says what each field means; docs/schemas/routing.schema.json is generated from these types).

`encode_routing(table)` gives the canonical bytes (sorted keys, indent 2, trailing newline), the same
bytes `json.dumps` gave before the record: a float keeps its repr, an absent optional key stays absent
(`msgspec.UNSET`) while a recorded null stays null. `decode_routing(data)` checks every field's type
(msgspec decode) and gives a `RoutingTable`; a table written before `passing`/`build_ranking`/`memory`
existed still loads, those fields UNSET. Cross-folder checks (a routed variant is published, its payload
is the one measured) stay in runtime.router.routing_problems. Keys these types do not name are
ignored on reading (a table from another build still routes), so only current tables round-trip.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

ROUTING_SCHEMA = "chattts-forge/routing/1"

# A figure is a float or, in a table written by hand or by an older build, a whole number; None: not measured.
Figure = float | int | None


class VariantFigures(Struct):
    """One variant's figures in one bucket (from its report's ``buckets`` section)."""

    passed: bool | None
    sentences: int
    # only when its report has no per-bucket evaluation (then no figures follow)
    note: str | UnsetType = UNSET
    rtf_p50: Figure | UnsetType = UNSET
    rtf_ratio_vs_reference: Figure | UnsetType = UNSET
    code_agreement: Figure | UnsetType = UNSET
    code_agreement_stream: Figure | UnsetType = UNSET
    hidden_cosine: Figure | UnsetType = UNSET
    mel_snr_db: Figure | UnsetType = UNSET
    wer: Figure | UnsetType = UNSET
    cer: Figure | UnsetType = UNSET


class RoutingBucket(Struct):
    name: str
    min_chars: Annotated[int, Meta(ge=1)]
    max_chars: Annotated[int, Meta(ge=1)] | None  # None: no upper end (the last bucket)
    variant: str
    reason: str | UnsetType = UNSET
    figures: dict[str, VariantFigures] | UnsetType = UNSET
    passing: list[str] | UnsetType = UNSET  # the gate's passing set (absent before it was recorded)
    build_ranking: list[str] | UnsetType = UNSET  # the passing set, fastest first on the build machine


class VariantMemory(Struct):
    """A variant's memory as its report measured it (publish.version_files.memory_figures)."""

    peak_rss_mb_by_batch: dict[str, float | int]
    after_load_mb: float | int | None
    python_baseline_mb: float | int | None
    steps: int | None
    threads: int | None
    provider: str | None
    command: str | list[str] | None


class RoutedVariant(Struct):
    # the router checks payload_sha256 alone; the others are the build's provenance (a table written
    # by hand for a test or a tool may leave them out)
    payload_sha256: str
    manifest_sha256: str | UnsetType = UNSET
    report_sha256: str | UnsetType = UNSET
    evaluated_at: str | None | UnsetType = UNSET
    memory: VariantMemory | UnsetType = UNSET  # since issue 50; absent for reports without it


class RoutingTable(Struct):
    schema: str
    model: str
    version: str
    length: str
    fallback: str
    buckets: Annotated[list[RoutingBucket], Meta(min_length=1)]
    variants: dict[str, RoutedVariant]


def routing_builtins(table: RoutingTable) -> dict[str, Any]:
    """The table as JSON-ready builtins (UNSET fields left out)."""
    return msgspec.to_builtins(table)


def encode_routing(table: RoutingTable) -> bytes:
    """The canonical bytes of a routing table (sorted keys, indented, trailing newline)."""
    text = json.dumps(routing_builtins(table), indent=2, sort_keys=True, ensure_ascii=False)
    return (text + "\n").encode("utf-8")


def routing_from_builtins(table: Any) -> RoutingTable:
    """A decoded JSON document (or a table built in memory) as a checked RoutingTable;
    msgspec.ValidationError names the first field that does not fit."""
    return msgspec.convert(table, RoutingTable, strict=True)


def decode_routing(data: bytes) -> RoutingTable:
    """routing.json's bytes as a checked RoutingTable (msgspec.DecodeError / ValidationError)."""
    return msgspec.json.decode(data, type=RoutingTable, strict=True)


def routing_json_schema() -> dict[str, Any]:
    """The JSON Schema of routing.json, generated from the types (docs/schemas/routing.schema.json)."""
    return msgspec.json.schema(RoutingTable)
