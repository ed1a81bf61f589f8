"""The report section of `quantize --method auto`: the candidates its search tried, as a Pareto table.

`auto_search_summary(artifact.json's quantization block)` is what evaluate copies into report.json (`artifact.
quantization_search`, read back as report_sections.AutoSearchSummary); `render_auto_search_markdown(
search)` is the Markdown section from that record (the HTML page shows the Markdown summary too). Artifacts of other methods have no section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chattts_forge.evaluate.report_sections import AutoSearchSummary

_COLUMNS = ("candidate", "head_code", "fp32", "int8", "int4", "bytes", "step_ms", "code_agreement",
            "hidden_cosine", "mel_snr_db", "passed", "pareto")


def auto_search_summary(quantization: dict[str, Any] | None) -> dict[str, Any] | None:
    """The search record of an `auto` artifact (None for other artifacts)."""
    auto = quantization.get("auto") if isinstance(quantization, dict) else None
    if not isinstance(auto, dict):
        return None
    sens = auto.get("sensitivity") or []
    return {
        # The gate file by name and content (its recorded path is relative to the artifact folder).
        "gate": Path((auto.get("gate") or {}).get("path") or "?").name,
        "gate_sha256": (auto.get("gate") or {}).get("sha256"),
        "headroom": (auto.get("gate") or {}).get("headroom"),
        "ranked_by": auto.get("ranked_by"),
        "block_size": auto.get("block_size"),
        "chosen": auto.get("chosen"),
        "head_code": auto.get("head_code"),
        "candidates": [{k: r.get(k) for k in _COLUMNS} | {"step_ms_search": r.get("step_ms_search")}
                       for r in auto.get("candidates") or []],
        "final_timing": auto.get("final_timing"),
        "most_sensitive": [r.get("node") for r in sens[-3:]][::-1],
        "least_sensitive": [r.get("node") for r in sens[:3]],
    }


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def render_auto_search_markdown(s: AutoSearchSummary | None) -> list[str]:
    """Markdown lines of the auto search's table from the report's ``artifact.quantization_search``
    (empty when the artifact is not `auto`)."""
    if not s:
        return []
    lines = [
        "",
        "#### Mixed-precision search (quantize --method auto)",
        "",
        f"Candidates tried against the fidelity thresholds of `{s.gate}` (sha256 "
        f"{(s.gate_sha256 or '')[:12]}; held-out split; agreement and "
        f"cosine thresholds tightened by {_cell(s.headroom)} of their distance to 1), ranked by "
        f"{s.ranked_by}; INT4 block {s.block_size}. Chosen: candidate {s.chosen} (code head "
        f"{s.head_code}). Most INT4-sensitive MatMuls: {', '.join(f'`{n}`' for n in s.most_sensitive)}.",
    ]
    timing = s.final_timing  # quantize.auto.retime's record, as the search wrote it
    if timing:
        ratio = timing.get("chosen_vs_reference")
        lines += ["", (
            f"step_ms of the finalists and of all-INT8 (candidate 0, the fixed dynamic INT8 recipe) timed again "
            f"{timing.get('method')} (marked *; their first timing in brackets)"
            + (f": the chosen step is {ratio:.3f}x all-INT8's." if isinstance(ratio, (int, float)) else ".")
        )]
    lines += [
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "| " + " | ".join("---:" if c not in ("head_code", "passed", "pareto") else "---" for c in _COLUMNS) + " |",
    ]
    for row in s.candidates:
        mark = " **(chosen)**" if (row.candidate, row.head_code) == (s.chosen, s.head_code) else ""
        # the columns are the candidate record's fields, in the table's order
        cells = [_cell(getattr(row, c)) + (mark if c == "candidate" else "") for c in _COLUMNS]
        if row.step_ms_search is not None:
            cells[_COLUMNS.index("step_ms")] += f"* ({_cell(row.step_ms_search)})"
        lines.append("| " + " | ".join(cells) + " |")
    return lines
