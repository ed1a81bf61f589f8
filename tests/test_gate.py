"""Gate files and verdicts, and the sealing of reports (no artifacts needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.gate import DEFAULT_GATE, METRICS, judge, load_gate
from chattts_forge.evaluate.report_schema import report_integrity, seal, verify_integrity

HEALTHY = {  # what a healthy dynamic-INT8 artifact measured on a tiny synthetic checkpoint
    "code_agreement": 0.95,
    "code_agreement_stream": 0.91,
    "code_kl": 0.0066,
    "hidden_cosine": 0.9995,
    "mel_snr_db": 29.5,
    "mel_lsd_db": 0.27,
    "rtf_ratio_vs_reference": 0.6,
    "size_ratio_vs_reference": 0.4,
    "wer_delta": None,
    "cer_delta": None,
    # what listeners hear, on the same tiny run: SIM/DNSMOS of noise (waived), stream seams exact
    "similarity": 0.9335,
    "similarity_worst": 0.8157,
    "ovrl_drop": -0.0026,
    "stream_snr_db": 124.6,
    "stream_recorded_lookahead_snr_db": 122.5,  # at the artifact's recorded look-ahead (24 of 30 frames on tiny)
    "peak_rss_ratio_vs_reference": 0.97,  # batch-1 peak RSS over FP32's, each alone (tiny: the runtime is most of it)
}
DAMAGED = {  # the same with its quantization scales multiplied by 3
    **HEALTHY,
    "code_agreement": 0.029,
    "code_agreement_stream": 0.013,
    "code_kl": 27.4,
    "hidden_cosine": 0.158,
    "mel_snr_db": -1.98,
    "mel_lsd_db": 10.7,
}
SYNTHETIC = {"wer_delta": "synthetic checkpoint", "cer_delta": "synthetic checkpoint",
             "similarity": "synthetic-only", "similarity_worst": "synthetic-only", "ovrl_drop": "synthetic-only"}
# A healthy INT8 variant of a real checkpoint: intelligibility, voice and naturalness measured.
REAL_HEALTHY = {**HEALTHY, "wer_delta": 0.004, "cer_delta": 0.01, "similarity": 0.93, "similarity_worst": 0.88,
                "ovrl_drop": 0.05}


def test_default_gate_has_a_threshold_for_each_area() -> None:
    gate = load_gate(None)
    assert gate["path"] == str(DEFAULT_GATE)
    metrics = {metric for _, _, metric, _ in gate["rules"]}
    assert {"wer_delta", "cer_delta", "code_agreement", "hidden_cosine", "mel_snr_db"} <= metrics
    assert {"rtf_ratio_vs_reference", "size_ratio_vs_reference", "peak_rss_ratio_vs_reference"} <= metrics
    assert {"similarity", "similarity_worst", "ovrl_drop", "stream_snr_db"} <= metrics
    sections = {(section, rule, metric) for section, rule, metric, _ in gate["rules"]}
    assert {("speaker", "min", "similarity"), ("naturalness", "max", "ovrl_drop"),
            ("streaming", "min", "stream_snr_db"), ("memory", "max", "peak_rss_ratio_vs_reference")} <= sections
    assert "peak_rss_ratio_vs_reference" in gate["regression"]
    assert all(m in METRICS for m in metrics)


def test_default_gate_passes_healthy_and_fails_damaged_int8() -> None:
    gate = load_gate(None)
    ok = judge(gate, HEALTHY, waived=SYNTHETIC)
    assert ok["passed"] and ok["failed"] == []
    assert {c["metric"] for c in ok["checks"] if c["status"] == "waived"} == set(SYNTHETIC)
    assert all(c["passed"] is None for c in ok["checks"] if c["status"] == "waived")

    bad = judge(gate, DAMAGED, waived=SYNTHETIC)
    assert not bad["passed"]
    assert {"code_agreement", "hidden_cosine", "mel_snr_db", "code_kl"} <= set(bad["failed"])
    agreement = next(c for c in bad["checks"] if c["metric"] == "code_agreement")
    assert agreement["status"] == "fail" and agreement["passed"] is False
    assert agreement["margin"] == pytest.approx(0.029 - 0.75)
    assert "violates >= 0.75" in agreement["message"] and "off by 0.721" in agreement["message"]


@pytest.mark.parametrize(
    "damage, failed",
    [
        ({"similarity": 0.55, "similarity_worst": 0.41}, {"similarity", "similarity_worst"}),  # another voice
        ({"similarity": 0.86, "similarity_worst": 0.52}, {"similarity_worst"}),  # one sentence lost the voice
        ({"ovrl_drop": 0.8}, {"ovrl_drop"}),  # hoarse / noisy: DNSMOS OVRL falls
        ({"stream_snr_db": 10.7}, {"stream_snr_db"}),  # streamed audio breaks at the chunk edges
        # the recorded look-ahead is too short for sentences it was not chosen on
        ({"stream_recorded_lookahead_snr_db": 28.4}, {"stream_recorded_lookahead_snr_db"}),
        # a variant that needs more memory than FP32 by over half (e.g. holding float copies of its weights)
        ({"peak_rss_ratio_vs_reference": 1.62}, {"peak_rss_ratio_vs_reference"}),
    ],
)
def test_listening_rules_fail_on_the_loss_they_name(damage: dict[str, float], failed: set[str]) -> None:
    gate = load_gate(None)
    assert judge(gate, REAL_HEALTHY)["passed"]
    verdict = judge(gate, {**REAL_HEALTHY, **damage})
    assert not verdict["passed"] and set(verdict["failed"]) == failed
    for metric in failed:
        check = next(c for c in verdict["checks"] if c["metric"] == metric)
        assert check["status"] == "fail" and "violates" in check["message"]


def test_the_memory_rule_judges_the_ratio_and_a_failed_probe_is_not_a_pass() -> None:
    gate = load_gate(None)
    threshold = next(t for _, rule, metric, t in gate["rules"] if (rule, metric) == ("max", "peak_rss_ratio_vs_reference"))
    assert 1.0 < threshold <= 2.0  # FP16 (~FP32's memory on a CPU) passes; a doubling never does
    at = judge(gate, {**REAL_HEALTHY, "peak_rss_ratio_vs_reference": threshold})
    assert at["passed"]
    over = judge(gate, {**REAL_HEALTHY, "peak_rss_ratio_vs_reference": threshold + 0.01})
    check = next(c for c in over["checks"] if c["metric"] == "peak_rss_ratio_vs_reference")
    assert over["failed"] == ["peak_rss_ratio_vs_reference"] and check["section"] == "memory" and check["unit"] == "x"
    probe_failed = judge(gate, {**REAL_HEALTHY, "peak_rss_ratio_vs_reference": None},
                         reasons={"peak_rss_ratio_vs_reference": "the memory probe failed: error: boom"})
    check = next(c for c in probe_failed["checks"] if c["metric"] == "peak_rss_ratio_vs_reference")
    assert not probe_failed["passed"] and check["status"] == "not_measured" and "boom" in check["message"]


def test_synthetic_listening_figures_are_shown_but_not_gated() -> None:
    gate = load_gate(None)
    noise = {**HEALTHY, "similarity": 0.2, "similarity_worst": 0.1, "ovrl_drop": 2.0}
    verdict = judge(gate, noise, waived=SYNTHETIC)
    assert verdict["passed"]
    sim = next(c for c in verdict["checks"] if c["metric"] == "similarity")
    assert sim["status"] == "waived" and sim["value"] == 0.2 and "synthetic-only" in sim["message"]
    # stream seams are not waived on random weights: they compare the variant's own audio
    assert judge(gate, {**noise, "stream_snr_db": 10.0}, waived=SYNTHETIC)["failed"] == ["stream_snr_db"]


def test_clone_similarity_without_a_recording_is_not_a_pass(tmp_path: Path) -> None:
    from chattts_forge.evaluate.report_assembly import CLONE_MISSING

    path = tmp_path / "clone.toml"
    path.write_text("[speaker]\nmin_clone_similarity = 0.7\nmin_similarity = 0.8\n")
    verdict = judge(load_gate(path), {"similarity": 0.9, "clone_similarity": None},
                    reasons={"clone_similarity": CLONE_MISSING})
    assert verdict["failed"] == ["clone_similarity"]
    assert "no cloning recording" in next(c for c in verdict["checks"] if c["metric"] == "clone_similarity")["message"]
    assert judge(load_gate(path), {"similarity": 0.9, "clone_similarity": 0.75})["passed"]


def test_unmeasured_metrics_never_pass_unless_waived() -> None:
    gate = load_gate(None)
    verdict = judge(gate, {**HEALTHY, "code_agreement": None}, waived=SYNTHETIC, reasons={"code_agreement": "no fidelity"})
    assert not verdict["passed"] and "code_agreement" in verdict["failed"]
    check = next(c for c in verdict["checks"] if c["metric"] == "code_agreement")
    assert check["status"] == "not_measured" and "no fidelity" in check["message"]
    # Without the waiver, unmeasured intelligibility fails too.
    assert set(judge(gate, HEALTHY)["failed"]) == {"wer_delta", "cer_delta"}
    # NaN is not a measurement; +inf SNR (identical mel) passes a min rule.
    assert "mel_snr_db" in judge(gate, {**HEALTHY, "mel_snr_db": math.nan}, waived=SYNTHETIC)["failed"]
    assert judge(gate, {**HEALTHY, "mel_snr_db": math.inf}, waived=SYNTHETIC)["passed"]


def test_everything_waived_is_not_a_pass(tmp_path: Path) -> None:
    only_wer = tmp_path / "g.toml"
    only_wer.write_text("[intelligibility]\nmax_wer_delta = 0.01\n")
    verdict = judge(load_gate(only_wer), {"wer_delta": None}, waived={"wer_delta": "synthetic"})
    assert not verdict["passed"]  # nothing was measured


def test_custom_gate_tightens_a_threshold(tmp_path: Path) -> None:
    strict = tmp_path / "strict.toml"
    strict.write_text('schema = "chattts-forge/gate/1"\n[fidelity]\nmin_code_agreement = 0.99\nmax_size_mb = 5\n')
    gate = load_gate(strict)
    verdict = judge(gate, {**HEALTHY, "size_mb": 4.0})
    assert verdict["failed"] == ["code_agreement"]
    assert verdict["sha256"] != load_gate(None)["sha256"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("[fidelity]\nmin_code_agrement = 0.9\n", "unknown threshold"),
        ("[fidelity]\nabout_code_agreement = 0.9\n", "unknown threshold"),
        ("[fidelity]\nmin_code_agreement = 'high'\n", "finite number"),
        ("[fidelity]\nmin_code_agreement = true\n", "finite number"),
        ("min_code_agreement = 0.9\n", "must be a \\[section\\]"),
        ('schema = "other/9"\n[fidelity]\nmin_code_agreement = 0.9\n', "schema"),
        ("[fidelity]\n", "no thresholds"),
        ("[fidelity\n", "not valid TOML"),
    ],
)
def test_bad_gate_files_are_clear_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    with pytest.raises(ForgeError, match=match):
        load_gate(path)


def test_missing_gate_file(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="does not exist"):
        load_gate(tmp_path / "nope.toml")


def test_seal_detects_any_edit() -> None:
    report = seal({"schema": "chattts-forge/report/1", "passed": False, "metrics": {"snr": math.inf, "x": 1.5}})
    assert report["metrics"]["snr"] is None  # strict JSON
    assert verify_integrity(report)
    assert report["integrity"] == report_integrity(report)
    edited = {**report, "passed": True}
    assert not verify_integrity(edited)
