"""The regression record (``regression`` in a published variant's manifest) as a typed record.

publish.regression's docstring says what each field means; docs/schemas/regression.schema.json is
generated from these types. The manifest is written unsorted, so the fields are declared in the order
the record has always been written in: `regression_builtins(record)` gives the same dict, key for key
and value for value (an absent optional key stays absent: `msgspec.UNSET`; a recorded null stays
null), and the manifest's bytes do not change. Free-form leaves (a re-timing's details, the FP32's
measurement against the baseline's, the values in `changed`) stay plain JSON.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from chattts_forge.errors import BadInput

REGRESSION_SCHEMA = "chattts-forge/regression/1"

Number = float | int
Status = Literal["regression", "worse", "same", "improved", "waived", "not judged"]
Verdict = Literal["regression", "no regression", "no baseline"]


class BaselineRef(Struct):
    """The published variant a build was compared with."""

    version: str
    variant: str
    manifest_sha256: str
    report_integrity: Any  # its sealed report's integrity record, as recorded


class RegressionFigure(Struct):
    value: Number | None
    baseline: Number | None
    delta: Number | None
    low: Number | None
    high: Number | None
    relative: bool
    n: int
    identical: bool | UnsetType = UNSET  # rtf_vs_baseline of the same bytes: not re-timed
    timing: dict[str, Any] | UnsetType = UNSET  # rtf_vs_baseline: the re-timing's rounds and bounds
    how: str | UnsetType = UNSET
    tolerance: Number | None | UnsetType = UNSET  # from here: set when judged
    worse_is: Literal["lower", "higher"] | UnsetType = UNSET
    status: Status | UnsetType = UNSET
    message: str | UnsetType = UNSET


class Changed(Struct):
    what: str
    baseline: Any
    now: Any


class Accepted(Struct):
    reason: str


class RegressionRecord(Struct):
    schema: str
    baseline: BaselineRef | None
    note: str | UnsetType = UNSET  # why there is no baseline, when there is none
    figures: dict[str, RegressionFigure] = msgspec.field(default_factory=dict)
    changed: list[Changed] = msgspec.field(default_factory=list)
    regressions: list[str] = msgspec.field(default_factory=list)
    improvements: list[str] = msgspec.field(default_factory=list)
    verdict: Verdict = "no baseline"
    accepted: Accepted | None = None
    fp32_against_baseline: dict[str, Any] | UnsetType = UNSET  # FP32's record only
    already_published: str | UnsetType = UNSET  # a refused variant whose bytes a version holds (driver)


def regression_from_builtins(record: Any) -> RegressionRecord:
    """A regression record read from a manifest (or built in memory), every field's type checked;
    a BadInput names the first field that does not fit."""
    try:
        return msgspec.convert(record, RegressionRecord, strict=True)
    except msgspec.ValidationError as e:
        raise BadInput(f"regression record: {e}") from None


def regression_builtins(record: RegressionRecord) -> dict[str, Any]:
    """The record as the manifest holds it (declared order, UNSET fields left out)."""
    return msgspec.to_builtins(record)


def regression_json_schema() -> dict[str, Any]:
    """The JSON Schema of the regression record (docs/schemas/regression.schema.json)."""
    return msgspec.json.schema(RegressionRecord)
