"""The version page (evaluate.version_page): every variant with its verdict, players that play in a
headless browser, and `verify` covering the page in a published version folder."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from browser import dump_dom
from stand_in_report import stand_in_report

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.listening import listen_files, read_listen_file
from chattts_forge.evaluate.report_record import check_report, report_builtins
from chattts_forge.evaluate.report_schema import read_report, seal, validate, write_report
from chattts_forge.evaluate.version_page import (
    PAGE_NAME,
    VariantEntry,
    pareto_front,
    read_page_data,
    render_version_page,
)

SR = 24000


def _tone(freq: float, seconds: float, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    wav = 0.3 * np.sin(2 * np.pi * freq * t)
    if noise:
        wav = wav + noise * np.random.default_rng(seed).standard_normal(t.size)
    return wav.astype(np.float32)


def _report_with_audio(artifact: Path, out: Path, variant: str, *, passed: bool, noise: float, rtf: float) -> Path:
    """A stand-in report of `variant` with listen files: its 'audio' is FP32's tone plus `noise`."""
    report = stand_in_report(artifact, passed=passed)
    report["artifact"] = {**report["artifact"], "variant": variant}
    report["headline"] = {**report["headline"], "variant": variant}
    report["metrics"] = {**report["metrics"], "rtf_ratio_vs_reference": rtf}
    texts = {"001": "Hello there.", "002": "A second, longer held-out sentence."}
    ref = {i: (_tone(220 + 40 * k, 0.8 + 0.4 * k), SR) for k, i in enumerate(texts)}
    art = {i: (w + noise * np.random.default_rng(1).standard_normal(w.size).astype(np.float32), sr)
           for i, (w, sr) in ref.items()}
    report["listen"], files = listen_files(art, ref, texts, variant, 2)
    report["intervals"] = {"confidence": 0.95, "resamples": 2000, "method": "test", "figures": {
        "code_agreement": {"value": report["metrics"]["code_agreement"], "low": 0.5, "high": 0.99, "n": 2, "how": "test"}}}
    write_report(seal(report), out, files)
    return out


@pytest.fixture(scope="module")
def built(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, VariantEntry]:
    root = tmp_path_factory.mktemp("reports")
    fp32 = tiny_artifacts["fp32"]
    entries = {}
    for variant, passed, noise, rtf in (("fp32", True, 0.0, 1.0), ("int8-dynamic", True, 0.01, 0.6),
                                         ("int4", False, 0.2, 0.5)):
        rdir = _report_with_audio(fp32, root / variant, variant, passed=passed, noise=noise, rtf=rtf)
        entries[variant] = VariantEntry(variant, "published" if passed else "refused", read_report(rdir).record, rdir)
    entries["int8-static"] = VariantEntry("int8-static", "not built", detail="quantize failed: stand-in")
    return entries


def test_page_lists_every_variant_with_its_verdict(built: dict[str, VariantEntry]) -> None:
    page = render_version_page("chattts", "v1", list(built.values()), None).decode("utf-8")
    for variant, word in (("fp32", "PUBLISHED"), ("int8-dynamic", "PUBLISHED"), ("int4", "REFUSED"),
                          ("int8-static", "NOT BUILT")):
        row = re.search(rf"<tr id='variant-{re.escape(variant)}'>(.*?)</tr>", page, re.S)
        assert row is not None, variant
        assert word in row.group(1)
    assert "gate failed: code_agreement" in page  # a refused variant says why
    assert "quantize failed: stand-in" in page
    assert "[0.500, 0.990]" in page  # the interval beside the figure
    data = read_page_data(page.encode())
    assert data["variants"]["int4"]["status"] == "refused"
    assert data["variants"]["fp32"]["report_integrity"] == built["fp32"].report.integrity
    # one FP32 player per sentence, one per variant with audio (refused included), none for the unbuilt one
    assert page.count("<audio") == 2 * 3
    assert page.count("data:image/png;base64,") == 2 * 2 + 1  # spectrograms of the two non-fp32 variants + Pareto


def test_page_is_reproducible(built: dict[str, VariantEntry]) -> None:
    entries = list(built.values())
    assert render_version_page("chattts", "v1", entries, None) == render_version_page("chattts", "v1", entries, None)


def test_players_load_and_play_in_headless_chromium(built: dict[str, VariantEntry], tmp_path: Path) -> None:
    page = tmp_path / "version" / PAGE_NAME
    page.parent.mkdir()
    page.write_bytes(render_version_page("chattts", "v1", list(built.values()), None))
    dom = dump_dom(page, tmp_path / "profile")
    durations = re.findall(r'<audio[^>]*data-duration="([^"]*)"', dom)
    assert len(durations) == 6, dom[:2000]
    seconds = [float(d) for d in durations]  # "error" (a player that failed to load) is not a float
    assert all(s > 0 for s in seconds)
    # the first sentence is 0.8 s long (MP3 pads a little), the second 1.2 s
    assert any(0.7 < s < 1.0 for s in seconds) and any(1.1 < s < 1.4 for s in seconds)


def test_a_listen_file_that_differs_from_its_report_is_refused(built: dict[str, VariantEntry], tmp_path: Path) -> None:
    entry = built["int8-dynamic"]
    copy = tmp_path / "r"
    shutil.copytree(entry.report_dir, copy)
    assert entry.report is not None and entry.report.listen
    row = entry.report.listen.sentences[0]
    assert read_listen_file(copy, row.artifact) == (entry.report_dir / row.artifact.file).read_bytes()
    (copy / row.artifact.file).write_bytes(b"not the audio")
    with pytest.raises(ForgeError, match="differs from the sha256"):
        read_listen_file(copy, row.artifact)
    tampered = VariantEntry("int8-dynamic", "published", entry.report, copy)
    with pytest.raises(ForgeError, match="001-artifact.mp3"):
        render_version_page("chattts", "v1", [built["fp32"], tampered], None)


def test_pareto_front() -> None:
    points = {"fp32": (1.0, 1.0), "a": (0.6, 0.95), "b": (0.7, 0.9), "c": (0.4, 0.5)}
    assert pareto_front(points) == ["c", "a", "fp32"]  # b is beaten by a on both


def test_verify_covers_the_page(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    from chattts_forge.publish.publish import publish_artifact
    from chattts_forge.publish.verify import verify_path
    from chattts_forge.publish.version_files import publish_version_files, routing_table

    fp32 = tiny_artifacts["fp32"]
    rdir = _report_with_audio(fp32, tmp_path / "reports" / "fp32", "fp32", passed=True, noise=0.0, rtf=1.0)
    result = publish_artifact(fp32, rdir, tmp_path / "artifacts")
    version_dir = result.path.parent
    entries = [VariantEntry("fp32", "published", read_report(rdir).record, rdir)]
    page = render_version_page(version_dir.parent.name, version_dir.name, entries, routing_table(version_dir))
    manifest = publish_version_files(version_dir, page=page)
    assert PAGE_NAME in {f["path"] for f in manifest["files"]}
    assert "fp32" in (version_dir / PAGE_NAME).read_text(encoding="utf-8")
    assert verify_path(tmp_path / "artifacts").problems == []
    assert verify_path(version_dir).problems == []

    # an edited page is named by its manifest entry
    (version_dir / PAGE_NAME).write_bytes(page.replace(b"every variant built", b"every variant edited"))
    assert any(PAGE_NAME in p and "changed" in p for p in verify_path(version_dir).problems)

    # a page made for another report of the variant (listed correctly) is named too
    other = stand_in_report(fp32, created_at="2026-12-01T00:00:00Z")
    stale = render_version_page(version_dir.parent.name, version_dir.name,
                                [VariantEntry("fp32", "published", validate(other), None)],
                                routing_table(version_dir))
    publish_version_files(version_dir, page=stale)
    assert any("another report of 'fp32'" in p for p in verify_path(version_dir).problems)

    # no page given: it is removed and no longer listed
    publish_version_files(version_dir)
    assert not (version_dir / PAGE_NAME).exists()
    assert verify_path(version_dir).problems == []


def test_page_shows_each_variants_recorded_look_ahead_and_its_curve(built: dict[str, VariantEntry]) -> None:
    """The recorded stream look-ahead (artifact.json `streaming`, carried by the report's streaming section),
    its held-out SNR with the gate's verdict, and the curve it was chosen on; a variant without one says so."""
    fp32 = built["fp32"]
    record = {"lookahead_frames": 24, "exact_frames": 30, "threshold_db": 60.0, "margin_db": 20.0,
              "curve": [{"lookahead_frames": 8, "snr_db_min": 28.45}, {"lookahead_frames": 24, "snr_db_min": 122.48},
                        {"lookahead_frames": 30, "snr_db_min": 123.56}],
              "sentences": 4, "stream_batch": 24, "max_new_token": 192, "seed": 0}  # artifact.json's whole record
    metric = "stream_recorded_lookahead_snr_db"
    check = {"section": "streaming", "metric": metric, "rule": "min", "threshold": 60.0, "value": 21.3, "unit": "dB",
             "status": "fail", "passed": False, "margin": -38.7, "message": f"{metric} = 21.3 violates >= 60"}
    shown = report_builtins(fp32.report)
    report = {**shown, "streaming": {"measured": True, "recorded": record},
              "metrics": {**shown["metrics"], metric: 21.3},
              "gate": {**shown["gate"], "checks": [*shown["gate"]["checks"], check]}}
    entries = [VariantEntry("fp32", "refused", check_report(report), fp32.report_dir), built["int8-dynamic"]]
    page = render_version_page("chattts", "v1", entries, None).decode("utf-8")
    section = page[page.index("<h2>Stream look-ahead</h2>"):page.index("<h2>Since the previous version</h2>")]
    assert "24 of 30 mel frames" in section and "8: 28.4" in section and "24: 122.5" in section
    assert "21.3" in section and "FAIL" in section  # judged on the held-out sentences
    assert "none recorded: streams exactly" in section  # the stand-in int8-dynamic report carries no record
