"""The report contract end to end: a report written by `evaluate` is read by `publish`, and the HTML page.

One real evaluation (tiny FP16 artifact against its FP32 reference, no PyTorch baseline) is shared by
the module: publish must accept it as written and refuse it, naming why, once it is tampered with.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.markdown_html import to_html
from chattts_forge.evaluate.report_record import report_builtins
from chattts_forge.evaluate.report_schema import (
    OPTIONAL_TOP_LEVEL,
    REPORT_NAME,
    read_report,
    seal,
    verify_integrity,
    write_report,
)
from chattts_forge.publish import publish_artifact, verify_path

FAST = dict(max_sentences=2, max_new_token=24, fidelity_sentences=2, fidelity_steps=24, batch_sizes=(1,), threads=2)
# Code points that need an emoji (or symbol) font: dingbats and misc symbols, the emoji planes,
# variation selector 16 (emoji presentation).
EMOJI = re.compile("[\u2600-\u27bf\u2b00-\u2bff\U0001f000-\U0001faff\ufe0f]")


@pytest.fixture(scope="module")
def evaluated(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report folder `evaluate` wrote for the tiny FP16 artifact (read-only for the tests)."""
    from chattts_forge.evaluate.evaluate import evaluate_artifact

    base = tmp_path_factory.mktemp("real-report")
    corpus = base / "corpus.txt"
    corpus.write_text("您好，请问有什么可以帮您？\nYour order has shipped today.\n", encoding="utf-8")
    out = base / "fp16"
    report = evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], corpus, out=out,
                               baseline_checkpoint=None, progress=False, **FAST)
    assert report["passed"], report["gate"]["failed"]
    return out


def _copy(report_dir: Path, dest: Path, change: Callable[[dict[str, Any]], Any] | None = None,
          reseal: bool = False) -> Path:
    """A copy of a report folder, its report.json changed (and sealed again, when `reseal`)."""
    shutil.copytree(report_dir, dest)
    if change is not None:
        data = json.loads((dest / REPORT_NAME).read_text(encoding="utf-8"))
        change(data)
        # by hand: report_json_bytes encodes through the record, which refuses a report that does not fit
        changed = seal(data) if reseal else data
        (dest / REPORT_NAME).write_text(json.dumps(changed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return dest


def test_a_real_evaluate_report_publishes(evaluated: Path, tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    result = publish_artifact(tiny_artifacts["fp16"], evaluated, root)
    assert result.status == "published" and result.variant == "fp16"
    raw = (evaluated / REPORT_NAME).read_bytes()
    assert (result.path / REPORT_NAME).read_bytes() == raw  # verbatim, still sealed
    report = json.loads(raw)
    manifest = json.loads((result.path / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["gate"]["results"] == report["gate"]["checks"]
    assert manifest["gate"]["headline"] == report["headline"] and manifest["gate"]["headline"]["variant"] == "fp16"
    assert manifest["gate"]["report_integrity"] == report["integrity"]
    assert manifest["created_at"] == report["created_at"]
    card = (result.path / "README.md").read_text(encoding="utf-8")
    agreement = next(c for c in report["gate"]["checks"] if c["metric"] == "code_agreement")
    assert f"| code_agreement | ≥ 0.75 | {agreement['value']:.6g} | pass |" in card
    assert "| wer_delta | ≤ 0.02 | – | waived |" in card  # synthetic: intelligibility not measured
    assert verify_path(root).ok


@pytest.mark.parametrize(
    "case, change, reseal, why",
    [
        ("edited", lambda d: d["gate"]["checks"][0].update(threshold=1.0), False, "edited after evaluation"),
        ("unsealed", lambda d: d.pop("integrity"), False, "no integrity field"),
        ("unknown-key", lambda d: d["gate"].update(approved_by="me"), True, "unknown report key gate.approved_by"),
        ("missing-key", lambda d: d["headline"].pop("rtf_p50"), True, "report key headline.rtf_p50 is missing"),
        ("wrong-type", lambda d: d["artifact"]["files"]["gpt.onnx"].update(bytes="12"), True,
         "report key artifact.files.gpt.onnx.bytes must be int, got str"),
        ("contradiction", lambda d: d.update(passed=not d["passed"]), True, "passed contradicts gate.passed"),
        ("schema", lambda d: d.update(schema="chattts-forge/report/2"), True, "unknown report schema"),
        ("gate-failed", lambda d: (d.update(passed=False), d["gate"].update(passed=False)), True,
         "quality gate failed"),
    ],
)
def test_a_tampered_real_report_is_refused_naming_why(
    case: str, change: Callable[[dict[str, Any]], Any], reseal: bool, why: str,
    evaluated: Path, tiny_artifacts: dict[str, Path], tmp_path: Path,
) -> None:
    report = _copy(evaluated, tmp_path / case, change, reseal)
    root = tmp_path / "artifacts"
    with pytest.raises(ForgeError, match=re.escape(why)):
        publish_artifact(tiny_artifacts["fp16"], report, root)
    assert not root.exists() or list(root.rglob("*")) == []
    res = CliRunner().invoke(main, ["publish", "--artifact", str(tiny_artifacts["fp16"]), "--report", str(report),
                                    "--to", str(root)])
    assert res.exit_code == 2 and why in res.output
    assert len([ln for ln in res.output.splitlines() if ln.startswith("error:")]) == 1


def test_a_real_report_of_another_artifact_is_refused(evaluated: Path, tiny_artifacts: dict[str, Path],
                                                      tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="was not made for artifact"):
        publish_artifact(tiny_artifacts["fp32"], evaluated, tmp_path / "artifacts")


def test_the_writer_refuses_what_the_reader_would(evaluated: Path, tmp_path: Path) -> None:
    data = report_builtins(read_report(evaluated).record)
    assert verify_integrity(data)
    with pytest.raises(ForgeError, match="unsealed"):
        write_report({**data, "passed": not data["passed"]}, tmp_path / "a")
    with pytest.raises(ForgeError, match="unknown report key extra"):
        write_report(seal({**data, "extra": 1}), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    out = write_report(data, tmp_path / "c", {"report.md": "# hi\n"})
    assert (out / REPORT_NAME).read_bytes() == (evaluated / REPORT_NAME).read_bytes()  # one serialization


def test_listening_sections_are_typed_and_optional(evaluated: Path, tmp_path: Path) -> None:
    data = report_builtins(read_report(evaluated).record)
    assert set(OPTIONAL_TOP_LEVEL) <= set(data)
    # a report of the same schema written before issue 25 (without these sections) still reads
    earlier = seal({k: v for k, v in data.items() if k not in OPTIONAL_TOP_LEVEL})
    assert report_builtins(read_report(write_report(earlier, tmp_path / "earlier")).record) == earlier
    with pytest.raises(ForgeError, match="report key sentences must be a list"):
        write_report(seal({**data, "sentences": {}}), tmp_path / "bad")
    with pytest.raises(ForgeError, match="inside the report folder"):
        write_report(data, tmp_path / "escape", {"../x.mp3": b"x"})
    assert not (tmp_path / "bad").exists() and not (tmp_path / "escape").exists()
    # the variant's own page links its listen files, which lie beside it
    page = (evaluated / "report.html").read_text(encoding="utf-8")
    rows = data["listen"]["sentences"]
    assert len(rows) == 2
    for row in rows:
        for key in ("artifact", "reference"):
            assert f"src='{row[key]['file']}'" in page and (evaluated / row[key]["file"]).is_file()
    md = (evaluated / "report.md").read_text(encoding="utf-8")
    assert "What listeners hear" in md and "bootstrap intervals" in md and "synthetic-only" in md


def test_html_report_renders_the_summary_as_html_without_emoji(evaluated: Path) -> None:
    page = (evaluated / "report.html").read_text(encoding="utf-8")
    markdown = (evaluated / "report.md").read_text(encoding="utf-8")
    summary = page.split("<section class=\"summary\">", 1)[1].split("</section>", 1)[0]
    assert "<table>" in summary and "<h3>" in summary and "<strong>PASSED</strong>" in summary
    assert "<td>code_agreement</td>" in summary and "<code>fp16</code>" in summary
    # no raw Markdown left: table rules, pipes opening a row, bold markers, heading hashes
    assert not re.search(r"\|\s*-{3,}|^\s*\||\*\*|^#{1,6} ", summary, flags=re.M), summary
    assert EMOJI.search(page) is None and EMOJI.search(markdown) is None
    assert "<span class='badge pass'>PASSED</span>" in page and "<script" not in page
    # the summary shows the same checks the Markdown lists
    table_lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    rules = [ln for ln in table_lines if re.match(r"\|\s*:?-{3,}", ln)]
    assert summary.count("<tr>") == len(table_lines) - len(rules)


def test_markdown_subset_to_html() -> None:
    md = ("### Gate `int8` **FAILED**\n\nA *short* note <script>.\n\n> quoted `x|y`\n\n"
          "| a | b |\n| --- | ---: |\n| 1 \\| 2 | **x** |\n\n- one\n- two\n\n```\nraw **text**\n```\n")
    assert to_html(md) == (
        "<h3>Gate <code>int8</code> <strong>FAILED</strong></h3>\n"
        "<p>A <em>short</em> note &lt;script&gt;.</p>\n"
        "<blockquote><p>quoted <code>x|y</code></p></blockquote>\n"
        "<table>\n<thead><tr><th>a</th><th style=\"text-align:right\">b</th></tr></thead>\n<tbody>\n"
        "<tr><td>1 | 2</td><td style=\"text-align:right\"><strong>x</strong></td></tr>\n</tbody>\n</table>\n"
        "<ul><li>one</li><li>two</li></ul>\n"
        "<pre><code>raw **text**</code></pre>\n"
    )


def test_markdown_sample_renders_to_its_recorded_html(data_dir: Path) -> None:
    """Every construct of a report summary, plus a link and an ordered list (tests/data/markdown/)."""
    sample = data_dir / "markdown" / "summary_sample.md"
    html = to_html(sample.read_text(encoding="utf-8"))
    assert html == (data_dir / "markdown" / "summary_sample.html").read_text(encoding="utf-8")
    # one line per top-level block (a table's rows each on their own), raw HTML only as text
    lines = html.splitlines()
    assert all(line.startswith("<") and line.endswith(">") for line in lines)
    assert sum(line.startswith("<tr>") for line in lines) == 2 and lines.count("<tbody>") == 1
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_markdown_edge_layouts() -> None:
    """An empty document is one empty line; a header-only table keeps its empty body; soft breaks are spaces."""
    assert to_html("") == "\n"
    assert (
        to_html("| a |\n| --- |\n")
        == "<table>\n<thead><tr><th>a</th></tr></thead>\n<tbody>\n</tbody>\n</table>\n"
    )
    assert to_html("one\ntwo\n") == "<p>one two</p>\n"
