"""The typed records of report.json, routing.json and the regression record: published bytes read and written
back unchanged, older tables still load, wrong types refused, and docs/schemas/ equal to what the
types generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from chattts_forge.errors import BadInput
from chattts_forge.evaluate.latency_record import latency_section
from chattts_forge.evaluate.report_record import check_report
from chattts_forge.evaluate.report_schema import report_json_bytes, seal, validate, verify_integrity
from chattts_forge.publish import regression
from chattts_forge.publish.manifest import manifest_bytes
from chattts_forge.publish.record_schemas import SCHEMA_DIR, SCHEMAS, schema_bytes
from chattts_forge.publish.regression import accept, no_baseline, summary
from chattts_forge.publish.regression_record import regression_builtins, regression_from_builtins
from chattts_forge.runtime.router import routing_bytes
from chattts_forge.runtime.routing_record import UNSET, decode_routing, encode_routing, routing_from_builtins


@pytest.fixture
def records(data_dir: Path) -> Path:
    return data_dir / "records"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_committed_schema_is_what_the_types_generate(name: str) -> None:
    # regenerate with: python -m chattts_forge.publish.record_schemas
    assert (SCHEMA_DIR / name).read_bytes() == schema_bytes(SCHEMAS[name])


@pytest.mark.parametrize("name", ["routing-before-memory.json", "routing-with-memory.json"])
def test_published_routing_tables_read_and_write_back_byte_for_byte(records: Path, name: str) -> None:
    data = (records / name).read_bytes()
    table = decode_routing(data)
    assert encode_routing(table) == data
    assert routing_bytes(json.loads(data)) == data  # the writer the build uses goes through the record


def test_a_table_from_before_memory_loads_without_it(records: Path) -> None:
    old = decode_routing((records / "routing-before-memory.json").read_bytes())
    new = decode_routing((records / "routing-with-memory.json").read_bytes())
    assert all(v.memory is UNSET for v in old.variants.values())
    assert all(v.memory is not UNSET and v.memory.peak_rss_mb_by_batch for v in new.variants.values())
    assert [b.name for b in old.buckets] == [b.name for b in new.buckets]


def test_a_table_without_the_passing_set_still_loads(records: Path) -> None:
    table = json.loads((records / "routing-before-memory.json").read_bytes())
    for bucket in table["buckets"]:
        del bucket["passing"], bucket["build_ranking"]
    loaded = routing_from_builtins(table)
    assert all(b.passing is UNSET and b.build_ranking is UNSET for b in loaded.buckets)
    assert "passing" not in json.loads(encode_routing(loaded))["buckets"][0]


def test_a_wrong_type_in_a_routing_table_is_refused_naming_the_field(records: Path) -> None:
    table = json.loads((records / "routing-with-memory.json").read_bytes())
    table["buckets"][1]["min_chars"] = "11"
    with pytest.raises(msgspec.ValidationError, match=r"buckets\[1\]\.min_chars"):
        routing_from_builtins(table)
    table["buckets"][1]["min_chars"] = 0
    with pytest.raises(msgspec.ValidationError, match=r"buckets\[1\]\.min_chars"):
        routing_from_builtins(table)


@pytest.mark.parametrize("name", ["regression-against-v1.json", "regression-no-baseline.json"])
def test_published_regression_records_read_and_write_back_in_their_order(records: Path, name: str) -> None:
    raw = json.loads((records / name).read_bytes())
    again = regression_builtins(regression_from_builtins(raw))
    assert list(again) == list(raw)
    assert manifest_bytes({"regression": again}) == manifest_bytes({"regression": raw})


def test_no_baseline_and_accept_write_the_record_as_before(records: Path) -> None:
    raw = json.loads((records / "regression-no-baseline.json").read_bytes())
    assert manifest_bytes(no_baseline(raw["note"])) == manifest_bytes(raw)
    against = json.loads((records / "regression-against-v1.json").read_bytes())
    accepted = accept(against, "  known: the tiny model's noise  ")
    assert list(accepted) == list(against)
    assert accepted["accepted"] == {"reason": "known: the tiny model's noise"}
    line = summary("int8-static", accepted)  # the fixture's two regressions, accepted with this reason
    assert line.startswith("int8-static: REGRESSION against v1: ") and "(accepted: known: the tiny" in line


def test_a_wrong_regression_record_is_bad_input_naming_the_field(records: Path) -> None:
    raw = json.loads((records / "regression-against-v1.json").read_bytes())
    raw["figures"]["size_mb"]["status"] = "fine"
    with pytest.raises(BadInput, match=r"figures\[\.\.\.\]\.status"):
        regression_from_builtins(raw)


def _report(records: Path) -> tuple[bytes, dict[str, Any]]:
    data = (records / "report-before-memory.json").read_bytes()
    return data, json.loads(data)


def test_a_published_report_reads_through_its_record_and_writes_back_byte_for_byte(records: Path) -> None:
    data, report = _report(records)
    record = check_report(report)
    assert record.headline.variant == "fp16" and record.gate.checks and record.memory is UNSET
    assert report_json_bytes(report) == data and verify_integrity(report)


def test_reports_without_the_newer_sections_still_load(records: Path) -> None:
    _, report = _report(records)
    first_audio = report["latency"]["artifact"]["first_audio_seconds"]
    del first_audio["stream_lookahead_frames"]  # recorded since issue 52
    for key in ("peak_rss_b8_mb", "peak_rss_ratio_vs_reference"):  # since issue 50
        report["headline"].pop(key, None)
    del report["gate"]["regression"]  # since issue 38
    validate(seal(report))
    memory = {"artifact": {"peak_rss_mb_by_batch": {"1": 300.0}}, "reference": None, "definition": "probe",
              "ratio_vs_reference": {}}
    with_memory = seal({**report, "memory": memory})
    validate(with_memory)
    assert check_report(with_memory).memory != UNSET


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["gate"].update(approved_by="me"), "unknown report key gate.approved_by"),
        (lambda r: r["headline"].pop("rtf_p50"), "report key headline.rtf_p50 is missing"),
        (
            lambda r: r["artifact"]["files"]["artifact.json"].update(bytes="12"),
            "report key artifact.files.artifact.json.bytes must be int, got str",
        ),
        (lambda r: r["gate"]["checks"][2].pop("margin"), "report key gate.checks[2].margin is missing"),
        (lambda r: r.update(sentences={}), "report key sentences must be a list, got dict"),
        (lambda r: r.update(corpus=None), "report key corpus must be an object, got NoneType"),
        (
            lambda r: r["headline"].update(wer=True),
            "report key headline.wer must be int or float or null, got bool",
        ),
        (lambda r: r.update(extra=1), "unknown report key extra"),
    ],
)
def test_the_records_refusals_name_the_key_as_the_hand_written_check_did(
    records: Path, change, message: str
) -> None:
    _, report = _report(records)
    change(report)
    with pytest.raises(BadInput) as e:
        validate(report)
    assert str(e.value) == message


def test_the_latency_record_reads_what_the_regression_gate_pairs_and_older_records_load(
    records: Path,
) -> None:
    _, report = _report(records)
    latency = latency_section(report)
    timed = latency.timed("artifact")
    assert timed is not None and timed.utterances
    first_audio = timed.first_audio_seconds
    assert (
        first_audio is not None and first_audio.stream_lookahead_frames is not UNSET and first_audio.samples
    )
    assert set(regression._first_audio(timed)) == {s.text for s in first_audio.sample_list()}
    # a record from before issue 52 (no look-ahead) and issue 38 (no per-sentence samples)
    raw = report["latency"]["artifact"]["first_audio_seconds"]
    del raw["stream_lookahead_frames"], raw["samples"]
    older = latency_section(report).timed("artifact")
    assert older is not None and older.first_audio_seconds is not None
    assert (
        older.first_audio_seconds.stream_lookahead_frames is UNSET and older.first_audio_seconds.sample_list() == []
    )
    assert regression._first_audio(older) == {}
    assert latency_section({}).timed("artifact") is None  # a report without latency: nothing to pair


def test_a_latency_record_of_the_wrong_type_is_one_line(records: Path) -> None:
    _, report = _report(records)
    report["latency"]["artifact"]["utterances"][0]["rtf"] = "fast"
    with pytest.raises(BadInput, match=r"report key latency: .*utterances\[0\]\.rtf"):
        latency_section(report)


def test_a_report_with_every_section_reads_through_its_typed_sections_and_writes_back(records: Path) -> None:
    data = (records / "report-with-memory.json").read_bytes()
    report = json.loads(data)
    record = validate(report)
    timed = record.latency.timed("artifact")
    assert timed is not None and [u.text for u in timed.utterances] == [s["text"] for s in report["sentences"]]
    assert {b: run.batch for b, run in timed.throughput.items()} == {"1": 1, "4": 4}
    assert record.memory is not UNSET and record.memory.ratio_vs_reference == report["memory"]["ratio_vs_reference"]
    results = record.buckets.result_map()
    assert list(results) == ["short", "medium", "long"]
    assert all(r.gate is not None and r.gate is not UNSET and r.gate.checks for r in results.values())
    assert record.listen is not UNSET and [s.id for s in record.listen.sentences] == [
        s["id"] for s in report["listen"]["sentences"]]
    assert record.intervals is not UNSET and set(record.intervals.figures) == set(report["intervals"]["figures"])
    assert record.phrase_cache is not None and record.phrase_cache.cache_bytes == report["phrase_cache"]["cache_bytes"]
    assert report_json_bytes(record) == data and verify_integrity(report)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda r: r["latency"]["artifact"]["utterances"][1].update(loud=True),
            "unknown report key latency.artifact.utterances[1].loud",
        ),
        (
            lambda r: r["buckets"]["results"]["medium"]["gate"]["checks"][0].update(approved_by="me"),
            "unknown report key buckets.results.medium.gate.checks[0].approved_by",
        ),
        (
            lambda r: r["latency"]["artifact"]["throughput"]["4"].pop("steps"),
            "report key latency.artifact.throughput.4.steps is missing",
        ),
        (
            lambda r: r["memory"]["ratio_vs_reference"].update({"8": "small"}),
            "report key memory.ratio_vs_reference.8 must be int or float or null, got str",
        ),
        (lambda r: r["intervals"]["figures"]["ovrl"].pop("n"), "report key intervals.figures.ovrl.n is missing"),
        (lambda r: r["listen"]["sentences"][2]["artifact"].update(file=3), "report key listen.sentences[2].artifact.file must be str, got int"),
        (lambda r: r["phrase_cache"].update(hits=1), "unknown report key phrase_cache.hits"),
    ],
)
def test_an_inner_sections_refusal_is_one_line_naming_its_dotted_path(records: Path, change, message: str) -> None:
    report = json.loads((records / "report-with-memory.json").read_bytes())
    change(report)
    with pytest.raises(BadInput) as e:
        validate(report)
    assert str(e.value) == message


def test_the_writer_encodes_only_a_report_that_fits_its_record(records: Path) -> None:
    _, report = _report(records)
    report["latency"]["artifact"]["first_audio_seconds"]["warm"] = True
    with pytest.raises(BadInput, match=r"^unknown report key latency\.artifact\.first_audio_seconds\.warm$"):
        report_json_bytes(report)


def test_a_str_subclass_in_the_report_is_written_as_its_text(records: Path) -> None:
    # torch.__version__ (a TorchVersion) reaches the PyTorch latency record: json.dumps wrote it as text
    class Version(str):
        pass

    data, report = _report(records)
    report["versions"] = {**report["versions"], "torch": Version("2.9.1")}
    assert json.loads(report_json_bytes(report))["versions"]["torch"] == "2.9.1"
