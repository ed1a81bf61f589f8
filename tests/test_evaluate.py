"""End to end: `evaluate` on tiny artifacts passes a healthy dynamic-INT8 artifact, fails a damaged one.

The gate used here is the shipped default without its [latency] section: timed thresholds belong in
benchmarks, not tests (the latency figures are still measured and reported).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.cli import evaluate as evaluate_cmd
from chattts_forge.evaluate.degrade import damage_quantization_scales
from chattts_forge.evaluate.evaluate import evaluate_artifact
from chattts_forge.evaluate.gate import DEFAULT_GATE
from chattts_forge.evaluate.report_assembly import describe_artifact
from chattts_forge.evaluate.report_schema import verify_integrity

FAST = dict(max_sentences=2, max_new_token=24, fidelity_sentences=2, fidelity_steps=24, batch_sizes=(1, 2), threads=2)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small corpus of our own (not a shipped one)."""
    path = tmp_path_factory.mktemp("corpus") / "mine.txt"
    path.write_text("您好，请问有什么可以帮您？\nYour order has shipped today.\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gate_without_latency(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = DEFAULT_GATE.read_text(encoding="utf-8")
    text = re.sub(r"\[latency\][^\[]*", "", text)
    path = tmp_path_factory.mktemp("gate") / "gate.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def int8_artifacts(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    root = tmp_path_factory.mktemp("int8")
    healthy = quantize_artifact(tiny_artifacts["fp32"], root / "int8-dynamic", QuantizeConfig("dynamic", fidelity=False,
                                threads=2, progress=False))
    damaged = root / "int8-dynamic-x3"
    files = damage_quantization_scales(healthy, damaged, factor=3.0)
    assert "gpt.onnx" in files
    return {"healthy": Path(healthy), "damaged": damaged}


def test_healthy_int8_passes_with_reports_hashes_and_pytorch_ratio(
    tiny_artifacts, tiny_ckpt, int8_artifacts, corpus_file, gate_without_latency, tmp_path
) -> None:
    out = tmp_path / "report-ok"
    report = evaluate_artifact(
        int8_artifacts["healthy"], tiny_artifacts["fp32"], corpus_file, gate=gate_without_latency, out=out,
        baseline_checkpoint=tiny_ckpt, progress=False, **FAST,
    )
    assert report["passed"], report["gate"]["failed"]
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.html", "listen"}
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert data["schema"] == "chattts-forge/report/1" and data["passed"] is True
    assert verify_integrity(data)
    # The JSON names the exact bytes judged.
    judged = data["artifact"]["files"]
    assert judged == describe_artifact(int8_artifacts["healthy"])["files"]
    assert {"gpt.onnx", "vocos.onnx", "artifact.json"} <= set(judged)
    assert all(re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) for f in judged.values())
    # Synthetic checkpoint: intelligibility said to be unmeasurable, thresholds waived, fidelity decides.
    assert data["intelligibility"]["measured"] is False
    assert "cannot be measured" in data["notes"][0]
    statuses = {c["metric"]: c["status"] for c in data["gate"]["checks"]}
    assert statuses["wer_delta"] == "waived" and statuses["code_agreement"] == "pass"
    # Latency from the same run: artifact, FP32 reference and ChatTTS's PyTorch pipeline, with ratios.
    lat = data["latency"]
    assert lat["pytorch"] is not None and lat["ratios"]["vs_pytorch"]["rtf_p50"] > 0
    # A report travels with the published artifact: the baseline checkpoint by its folder's name only
    assert lat["pytorch"]["checkpoint"] == data["settings"]["baseline_checkpoint"] == Path(tiny_ckpt).name
    assert str(Path(tiny_ckpt).parent) not in (out / "report.json").read_text(encoding="utf-8")
    assert lat["artifact"]["rtf"]["p50"] > 0 and lat["artifact"]["first_audio_seconds"]["p50"] > 0
    assert set(lat["artifact"]["throughput"]) == {"1", "2"}
    assert data["machine"]["threads"] == 2 and data["machine"]["cpu_model"]
    assert data["metrics"]["rtf_ratio_vs_pytorch"] is not None
    # What listeners hear: SIM and DNSMOS computed on the noise, shown as synthetic-only and waived like WER;
    # stream seams measured and gated (the default chunking is exact).
    assert data["speaker"]["measured"] and data["speaker"]["synthetic_only"]
    assert [r["id"] for r in data["speaker"]["sentences"]] == ["001", "002"]
    assert statuses["similarity"] == statuses["similarity_worst"] == statuses["ovrl_drop"] == "waived"
    assert "synthetic-only" in data["gate"]["waived"]["similarity"]
    assert any("synthetic-only" in n for n in data["notes"])
    assert statuses["stream_snr_db"] == "pass" and data["metrics"]["stream_snr_db"] > 60
    # the lookahead mode streams at the artifact's recorded look-ahead, which the gate judges on these sentences
    lookahead, recorded = data["streaming"]["modes"]["lookahead"], data["streaming"]["recorded"]
    assert lookahead["source"] == "recorded" and lookahead["lookahead_frames"] == recorded["lookahead_frames"]
    assert data["metrics"]["stream_recorded_lookahead_snr_db"] == lookahead["snr_db_min"]
    assert statuses["stream_recorded_lookahead_snr_db"] == "pass"
    if lookahead["lookahead_frames"] < recorded["exact_frames"]:  # inexact at the chunk edges, by design
        assert lookahead["snr_db_min"] < data["metrics"]["stream_snr_db"]
    # A 95% interval per corpus figure, and per-sentence rows.
    figures = data["intervals"]["figures"]
    assert {"similarity", "code_agreement", "mel_snr_db", "rtf_p50"} <= set(figures)
    for name in ("similarity", "code_agreement"):
        assert figures[name]["low"] <= figures[name]["value"] <= figures[name]["high"], name
    rows = data["sentences"]
    assert [r["id"] for r in rows] == ["001", "002"] and all(r["similarity"] is not None for r in rows)
    assert all(r["code_agreement"] is not None and r["stream_snr_db"] is not None for r in rows)
    # The audio beside the report, as the report records it.
    for row in data["listen"]["sentences"]:
        for key in ("artifact", "reference", "spectrogram"):
            blob = (out / row[key]["file"]).read_bytes()
            assert hashlib.sha256(blob).hexdigest() == row[key]["sha256"]
    # The reports people read.
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "PASSED" in md and "| code_agreement |" in md and "ChatTTS PyTorch FP32" in md
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") >= 4
    assert "Latency CDF" in page and "Fidelity per stream" in page and "<script" not in page


def test_damaged_int8_fails_and_names_the_metric(
    tiny_artifacts, int8_artifacts, corpus_file, gate_without_latency, tmp_path
) -> None:
    out = tmp_path / "report-bad"
    args = ["--artifact", str(int8_artifacts["damaged"]), "--reference", str(tiny_artifacts["fp32"]),
            "--corpus", str(corpus_file), "--gate", str(gate_without_latency), "--out", str(out),
            "--max-sentences", "2", "--max-new-token", "24", "--fidelity-sentences", "2", "--fidelity-steps", "24",
            "--batch", "1", "--no-baseline"]
    res = CliRunner().invoke(evaluate_cmd, args)
    assert res.exit_code == 1, res.output
    assert "gate FAILED" in res.output and "code_agreement" in res.output
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert data["passed"] is False
    assert {"code_agreement", "hidden_cosine", "mel_snr_db"} <= set(data["gate"]["failed"])
    # The loss is named by the fidelity rules; the stream seams rule still passes (streaming the damaged
    # artifact is as exact as synthesizing it whole) and SIM/DNSMOS stay synthetic-only.
    statuses = {c["metric"]: c["status"] for c in data["gate"]["checks"]}
    assert statuses["stream_snr_db"] == "pass" and statuses["similarity"] == "waived"
    check = next(c for c in data["gate"]["checks"] if c["metric"] == "code_agreement")
    assert check["margin"] < 0 and "violates" in check["message"]
    assert "FAILED" in (out / "report.md").read_text(encoding="utf-8")


def test_tampered_artifact_is_named(tiny_artifacts, int8_artifacts, tmp_path) -> None:
    """Files that no longer match their artifact.json are reported (the gate cannot pass on them)."""
    import shutil

    copy = tmp_path / "tampered"
    shutil.copytree(int8_artifacts["healthy"], copy)
    with open(copy / "head_code.onnx", "ab") as f:
        f.write(b"\0")
    desc = describe_artifact(copy)
    assert any("head_code.onnx" in m for m in desc["manifest_mismatches"])


def test_bad_inputs_are_clear_errors(tiny_artifacts, tmp_path, corpus_file) -> None:
    with pytest.raises(ForgeError, match="does not exist"):
        evaluate_artifact(tmp_path / "nope", tiny_artifacts["fp32"], corpus_file)
    with pytest.raises(ForgeError, match="not an artifact folder"):
        evaluate_artifact(tmp_path, tiny_artifacts["fp32"], corpus_file)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ForgeError, match="empty"):
        evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], empty)
    bad_gate = tmp_path / "g.toml"
    bad_gate.write_text("[x]\nmin_nothing = 1\n")
    with pytest.raises(ForgeError, match="unknown threshold"):
        evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], corpus_file, gate=bad_gate)
    assert not (tmp_path / "report").exists()


def test_evaluate_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import chattts_forge.evaluate.evaluate, chattts_forge.evaluate.cli, chattts_forge.evaluate.score\n"
        "import chattts_forge.evaluate.report, chattts_forge.evaluate.report_schema, chattts_forge.evaluate.latency\n"
        "import chattts_forge.evaluate.asr\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fp16_artifact_is_judged_with_memory_and_fidelity(tiny_artifacts, corpus_file, gate_without_latency) -> None:
    report = evaluate_artifact(
        tiny_artifacts["fp16"], tiny_artifacts["fp32"], corpus_file, gate=gate_without_latency,
        baseline_checkpoint=None, progress=False, **{**FAST, "batch_sizes": (1,)},
    )
    assert report["passed"], report["gate"]["failed"]
    assert report["metrics"]["code_agreement"] > 0.95 and report["metrics"]["size_ratio_vs_reference"] < 1.0
    # each side's memory in a process of its own, under one name (issue 50): report["memory"]
    memory = report["memory"]
    assert "memory" not in report["latency"]["artifact"] and "memory" not in report["latency"]["reference"]
    art, ref = memory["artifact"], memory["reference"]
    for side in (art, ref):
        by_batch = side["peak_rss_mb_by_batch"]
        assert set(by_batch) == {"1", "8"} and side["peak_rss_mb"] == by_batch["1"]
        assert by_batch["1"] >= side["load_peak_mb"] >= side["after_load_mb"] > side["python_baseline_mb"] > 0
        assert by_batch["8"] >= 0.9 * by_batch["1"]  # more rows hold more (the allocator may give a little back)
        assert side["steps"] == 422 and side["seconds"] > 0
    assert art["command"] == ("python -m chattts_forge.runtime.memory_probe --artifact fp16 --batch 1,8 --steps 422 "
                              "--threads 2")
    assert ref["command"].split()[4] == "fp32"  # the variant, run in the version folder: no path of this machine
    assert str(tiny_artifacts["fp16"].parent) not in json.dumps(memory)
    m = report["metrics"]
    assert (m["peak_rss_mb"], m["peak_rss_b8_mb"], m["rss_after_load_mb"]) == (
        art["peak_rss_mb_by_batch"]["1"], art["peak_rss_mb_by_batch"]["8"], art["after_load_mb"])
    assert m["peak_rss_ratio_vs_reference"] == pytest.approx(art["peak_rss_mb"] / ref["peak_rss_mb"])
    assert memory["ratio_vs_reference"]["1"] == m["peak_rss_ratio_vs_reference"]
    assert report["headline"]["peak_rss_b8_mb"] == m["peak_rss_b8_mb"]
    check = next(c for c in report["gate"]["checks"] if c["metric"] == "peak_rss_ratio_vs_reference")
    assert check["status"] == "pass"
    assert report["latency"]["pytorch"] is None and any("No PyTorch baseline" in n for n in report["notes"])


def test_fp32_judged_against_itself_is_timed_once(tiny_artifacts, corpus_file, monkeypatch) -> None:
    from chattts_forge.evaluate import latency as latency_mod

    calls: list[str] = []
    real = latency_mod.measure_artifact

    def counting(path, *args, **kwargs):
        calls.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(latency_mod, "measure_artifact", counting)
    report = evaluate_artifact(  # the shipped gate, latency section included
        tiny_artifacts["fp32"], tiny_artifacts["fp32"], corpus_file,
        baseline_checkpoint=None, progress=False, **{**FAST, "batch_sizes": (1,)},
    )
    assert calls == [str(tiny_artifacts["fp32"])]
    # a tiny checkpoint's timings are overhead: measured and reported, never gated
    [latency_check] = [c for c in report["gate"]["checks"] if c["metric"] == "rtf_ratio_vs_reference"]
    assert latency_check["status"] == "waived" and "tiny" in latency_check["message"]
    assert report["metrics"]["rtf_p50"] > 0
    assert report["latency"]["ratios"]["vs_reference"]["rtf_p50"] == 1.0
    assert any("its own reference" in n for n in report["notes"])
    assert report["metrics"]["code_agreement"] == 1.0  # fidelity is still measured


def test_fp32_against_itself_reuses_its_recording_with_the_same_figures(tiny_artifacts) -> None:
    """The build's fp32 evaluation: its plain GPT, head and Decoder are the files the FP32 runs were
    recorded with, so fidelity takes the recording instead of replaying them (only the fused graph is
    replayed); the record is the one a replay gives, to the bit, per-tensor table included."""
    import json

    from chattts_forge.calibration_data.corpus import load_corpus
    from chattts_forge.quantize import fidelity as fid

    fp32 = tiny_artifacts["fp32"]
    corpus = load_corpus("builtin:evaluation")
    recording = fid.FidelitySettings(max_sentences=2, max_new_token=12, seed=0, threads=1, progress=False)
    runs = fid.record_trajectories(fp32, corpus, recording)
    records = {}
    for reuse in (True, False):
        sessions = fid.ReplaySessions(fp32, fp32, 1)
        assert sessions.same_plain
        sessions.same_plain = reuse
        replayed: list[object] = []
        real_replay = fid.replay

        def counting(step, head, traj, real_replay=real_replay, replayed=replayed):
            replayed.append(step)
            return real_replay(step, head, traj)

        fid.replay = counting
        try:
            comparisons = [sessions.compare(t) for t in runs]
        finally:
            fid.replay = real_replay
        assert (sessions.q_step in replayed) is not reuse and len(replayed) == (2 if reuse else 4)  # fused: both
        record = fid.summarize_fidelity(fp32, corpus, comparisons, {})
        record["per_tensor"] = sessions.tensor_table(runs, 4, False)
        records[reuse] = json.dumps(record, sort_keys=True)
    assert records[True] == records[False]
    assert not fid.ReplaySessions(fp32, tiny_artifacts["fp16"], 1).same_plain


def test_the_fp16_per_tensor_refusal_names_no_temporary_folder(tiny_artifacts) -> None:
    """The fp16 report records why its per-tensor table is unavailable; the reason travels in the
    published report, so it names the graph and never the temporary folder the exposed copy sat in."""
    import tempfile

    from chattts_forge.calibration_data.corpus import load_corpus
    from chattts_forge.errors import ForgeError
    from chattts_forge.quantize import fidelity as fid

    recording = fid.FidelitySettings(max_sentences=1, max_new_token=8, seed=0, threads=1, progress=False)
    runs = fid.record_trajectories(tiny_artifacts["fp32"], load_corpus("builtin:evaluation"), recording)
    sessions = fid.ReplaySessions(tiny_artifacts["fp32"], tiny_artifacts["fp16"], 1)
    with pytest.raises(ForgeError) as refused:
        sessions.tensor_table(runs, 4, False)
    reason = str(refused.value)
    assert "quantized gpt graph" in reason
    assert tempfile.gettempdir() not in reason and "forge-tensors-" not in reason
