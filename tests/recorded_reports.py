"""Real published reports for tests of what reads them (publish.regression's comparison, ...).

`recorded_report` gives tests/data/records' tiny fp16 report.json (`report-with-memory.json`, every
section; `report-before-memory.json`, a report from before issue 50's memory section) as its typed
record, edited first on a decoded copy when a test needs other figures: the edited report is sealed
again and goes through the same strict check (`check_report`) as a real one, so a test cannot
compare a report publish would refuse. `publish_report` writes one where a published variant keeps it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from chattts_forge.evaluate.report_record import ReportRecord, check_report
from chattts_forge.evaluate.report_schema import report_json_bytes, seal

RECORDS = Path(__file__).parent / "data" / "records"
WITH_MEMORY = "report-with-memory.json"
BEFORE_MEMORY = "report-before-memory.json"


@cache
def _decoded(name: str) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads((RECORDS / name).read_bytes())
    return decoded


def recorded_report(name: str = WITH_MEMORY, edit: Callable[[dict[str, Any]], None] | None = None) -> ReportRecord:
    """The recorded report `name` as its record, after `edit` changed a decoded copy of it in place
    (then sealed again, as evaluate would have sealed those figures)."""
    report = copy.deepcopy(_decoded(name))
    if edit is not None:
        edit(report)
        report = seal(report)
    return check_report(report)


def publish_report(folder: Path, report: ReportRecord) -> None:
    """Write `report` as the report.json of a published variant folder, as publish copies it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_bytes(report_json_bytes(report))
