"""report.json's sections other modules write (evaluate.report_sections) are typed key by key: a wrong
type or an unknown key inside one is refused naming its dotted path, the stand-ins' empty sections
still load, and readers that take a section's map get the JSON it was read from."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from msgspec import UNSET

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.evaluate.report import render_markdown
from chattts_forge.evaluate.report_record import check_report, section_builtins
from chattts_forge.evaluate.report_schema import read_report, report_json_bytes, seal

RECORDS = Path(__file__).parent / "data" / "records"


def _report(name: str = "report-with-memory.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDS / name).read_bytes())
    return data


def _set(report: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(report)
    node: Any = changed
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("fidelity", "teacher_forced", "top1_agreement", "mean"), "0.99",
         "report key fidelity.teacher_forced.top1_agreement.mean must be int or float or null, got str"),
        (("fidelity", "mel", "frames"), 1.5, "report key fidelity.mel.frames must be int, got float"),
        (("speaker", "sentences", 0, "similarity"), "high",
         "report key speaker.sentences[0].similarity must be int or float or null, got str"),
        (("naturalness", "artifact", "ovrl"), [], "report key naturalness.artifact.ovrl must be int or float or null, got list"),
        (("streaming", "modes", "lookahead", "sentences", 1, "edges"), 3,
         "report key streaming.modes.lookahead.sentences[1].edges must be a list, got int"),
        (("corpus", "sentences_used"), "8", "report key corpus.sentences_used must be int, got str"),
        (("settings", "batch_sizes"), "1,8", "report key settings.batch_sizes must be a list, got str"),
        (("machine", "versions", "numpy"), 2, "report key machine.versions.numpy must be str or null, got int"),
        (("versions", "onnx"), 1.16, "report key versions.onnx must be str or null, got float"),
        (("toolchain", "git_commit"), 7, "report key toolchain.git_commit must be str or null, got int"),
        (("timing", "evaluate_seconds"), "12", "report key timing.evaluate_seconds must be int or float, got str"),
        (("sentences", 2, "rtf"), "fast", "report key sentences[2].rtf must be int or float or null, got str"),
        (("artifact", "source", "seed"), "0", "report key artifact.source.seed must be int or null, got str"),
        (("reference", "precisions", "gpt"), 16, "report key reference.precisions.gpt must be str, got int"),
        (("memory", "reference", "peak_rss_mb_by_batch", "8"), "big",
         "report key memory.reference.peak_rss_mb_by_batch.8 must be int or float or null, got str"),
        (("listen", "spectrogram", "hop"), None, "report key listen.spectrogram.hop must be int, got NoneType"),
        (("buckets", "results", "medium", "fidelity", "hidden_cosine", "min"), "low",
         "report key buckets.results.medium.fidelity.hidden_cosine.min must be int or float or null, got str"),
        (("buckets", "results", "short", "intelligibility", "measured"), "no",
         "report key buckets.results.short.intelligibility.measured must be bool, got str"),
    ],
)
def test_a_wrong_type_inside_a_section_is_refused_naming_its_path(
    path: tuple[str | int, ...], value: Any, message: str,
) -> None:
    report = _report()
    check_report(report)  # the recorded report itself fits
    with pytest.raises(BadInput, match=f"^{re.escape(message)}$"):
        check_report(_set(report, path, value))


@pytest.mark.parametrize(
    "section, message",
    [
        (("speaker", "encoder"), "unknown report key speaker.encoder.approved_by"),
        (("streaming", "recorded"), "unknown report key streaming.recorded.approved_by"),
        (("memory", "artifact"), "unknown report key memory.artifact.approved_by"),
        (("machine",), "unknown report key machine.approved_by"),
    ],
)
def test_an_unknown_key_inside_a_section_is_refused_naming_it(section: tuple[str, ...], message: str) -> None:
    report = _report()
    node: Any = report
    for part in section:
        node = node[part]
    node["approved_by"] = "me"
    with pytest.raises(BadInput, match=f"^{re.escape(message)}$"):
        check_report(report)


def test_the_reader_refuses_a_sealed_report_with_a_wrong_type_inside_a_section(tmp_path: Path) -> None:
    changed = _set(_report(), ("fidelity", "teacher_forced", "steps"), "96")
    path = tmp_path / "report.json"
    path.write_text(json.dumps(seal(changed), indent=2) + "\n", encoding="utf-8")
    with pytest.raises(ForgeError, match=re.escape("report key fidelity.teacher_forced.steps must be int, got str")):
        read_report(path)


def test_stand_in_sections_written_empty_still_load_and_encode_back() -> None:
    report = _report("report-before-memory.json")
    assert report["fidelity"] == {} and report["machine"] == {} and report["versions"] == {}
    record = check_report(report)
    assert record.fidelity.teacher_forced is UNSET and record.machine.cpu_model is UNSET
    assert report_json_bytes(report) == (RECORDS / "report-before-memory.json").read_bytes()


def test_section_builtins_gives_a_section_back_as_written() -> None:
    report = _report()
    record = check_report(report)
    for name in ("fidelity", "speaker", "streaming", "corpus", "settings", "machine", "toolchain", "timing"):
        assert section_builtins(getattr(record, name)) == report[name], name
    assert section_builtins(record.memory.reference) == report["memory"]["reference"]
    assert section_builtins(check_report(_report("report-before-memory.json")).speaker) == {}  # absent: UNSET


def test_the_auto_search_summary_is_typed_as_its_writer_writes_it() -> None:
    from chattts_forge.evaluate.search_report import auto_search_summary

    row = {"candidate": 0, "head_code": "int8", "fp32": 0, "int8": 24, "int4": 0, "bytes": 1000, "step_ms": 2.5,
           "code_agreement": 0.97, "hidden_cosine": 0.999, "mel_snr_db": 30.0, "passed": True, "pareto": True}
    summary = auto_search_summary({"auto": {"gate": {"path": "gates/default.toml", "sha256": "ab" * 32, "headroom": 0.1},
                                            "ranked_by": "step_ms", "block_size": 32, "chosen": 0, "head_code": "int8",
                                            "candidates": [row], "final_timing": None,
                                            "sensitivity": [{"node": "a"}, {"node": "b"}]}})
    report = _set(_report(), ("artifact", "quantization_search"), summary)
    record = check_report(report)
    assert section_builtins(record.artifact.quantization_search) == summary
    assert report_json_bytes(report) == (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    with pytest.raises(BadInput, match=re.escape(
            "report key artifact.quantization_search.candidates[0].step_ms must be int or float or null, got str")):
        check_report(_set(report, ("artifact", "quantization_search", "candidates", 0, "step_ms"), "2.5"))


def _measured_intelligibility() -> dict[str, Any]:
    """evaluate's measured intelligibility section, its hypotheses given (no ASR model here)."""
    from chattts_forge.evaluate.evaluate import score_intelligibility

    sentences = ["Your order has shipped today.", "您好，请问有什么可以帮您？"]
    waves = {v: {"001": (None, 24000), "002": (None, 24000)} for v in ("artifact", "reference")}

    def transcriber(lang: str, _waves: Any, ids: list[str]) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        heard = "Your order has shipped." if lang == "en" else "您好，请问有什么可以帮您"
        return ({i: heard for i in ids}, {i: {"asr_seconds": 0.1, "audio_seconds": 1.0} for i in ids},
                {"backend": "given", "model_dir": "none"})

    section: dict[str, Any] = score_intelligibility(sentences, waves, "faster-whisper", None, 1, False,
                                                    transcriber=transcriber)
    return section


def test_a_measured_intelligibility_section_is_typed_to_its_language_entries() -> None:
    intel = _measured_intelligibility()
    report = _set(_report(), ("intelligibility",), intel)
    record = check_report(report)
    assert record.intelligibility.measured is True and set(record.intelligibility.languages) == {"en", "zh"}
    assert section_builtins(record.intelligibility) == intel  # every key, in the order written
    assert report_json_bytes(report) == (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    with pytest.raises(BadInput, match=re.escape(
            "report key intelligibility.languages.zh.variants.reference.utterances must be a list, got dict")):
        check_report(_set(report, ("intelligibility", "languages", "zh", "variants", "reference", "utterances"), {}))
    with pytest.raises(BadInput, match=re.escape("report key intelligibility.wer_delta must be int or float or null, got str")):
        check_report(_set(report, ("intelligibility", "wer_delta"), "0"))


def test_markdown_reads_the_typed_memory_and_listening_sections() -> None:
    report = _report()
    markdown = render_markdown(check_report(report))
    probe = report["memory"]["artifact"]
    assert f"load, then {probe['steps']} steps a row" in markdown
    assert f"`{probe['command']}`" in markdown and f"`{report['memory']['reference']['command']}`" in markdown
    for mode in report["streaming"]["modes"]:
        assert f"- stream seams, {mode} (" in markdown
    assert f"{len(report['speaker']['sentences'])} sentences)" in markdown


def test_markdown_of_a_report_without_its_corpus_names_the_missing_key() -> None:
    record = check_report(_report("report-before-memory.json"))  # its corpus section is empty
    with pytest.raises(BadInput, match=r"report key corpus\.name is missing"):
        render_markdown(record)
