"""The one gate judge (chattts_forge.gate) as quantize's auto search, evaluate and its buckets use it:
the fidelity rules, the waivers, the integrity check, and the typed fidelity record's gate metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from chattts_forge.artifact import Fidelity
from chattts_forge.errors import ForgeError
from chattts_forge.gate import (
    DEFAULT_GATE,
    FIDELITY_METRICS,
    METRICS,
    fidelity_rules,
    intelligibility_waivers,
    judge,
    load_gate,
)
from chattts_forge.quantize.auto import fidelity_targets, judge_fidelity


def _graph(agreement: float, worst: float, kl: float, cosine: float) -> dict:
    return {"teacher_forced": {"top1_agreement": {"mean": agreement, "min_stream": worst},
                               "kl": {"mean": kl, "max_stream": 2 * kl}},
            "hidden_cosine": {"mean": cosine, "min": cosine - 0.01}}


def _record(plain: dict, fast: dict | None = None) -> dict:
    return {"reference": "fp32", "method": "teacher-forced", **plain, "mel": {"snr_db": 20.0, "lsd_db": 1.0, "frames": 9},
            **({"gpt_fast": fast} if fast else {})}


def test_gate_metrics_are_the_worse_graph_or_the_plain_one() -> None:
    fid = Fidelity.from_dict(_record(_graph(0.9, 0.8, 0.01, 0.99), _graph(0.85, 0.82, 0.02, 0.995)))
    both = fid.gate_metrics()
    assert list(both) == list(FIDELITY_METRICS) and set(FIDELITY_METRICS) <= set(METRICS)
    assert (both["code_agreement"], both["code_agreement_stream"], both["code_kl"], both["code_kl_stream"]) == (
        0.85, 0.8, 0.02, 0.04)
    assert both["hidden_cosine"] == 0.99 and both["mel_snr_db"] == 20.0
    plain = fid.gate_metrics(fused=False)
    assert plain["code_agreement"] == 0.9 and plain["code_kl"] == 0.01
    # a fused graph that could not be replayed has no figures: the plain graph's count
    broken = Fidelity.from_dict(_record(_graph(0.9, 0.8, 0.01, 0.99), {"error": "could not replay"}))
    assert broken.gate_metrics() == plain
    # written back, a record keeps its keys and their order
    doc = _record(_graph(0.9, 0.8, 0.01, 0.99))
    assert list(Fidelity.from_dict(doc).to_dict()) == list(doc)
    with pytest.raises(ForgeError, match="unknown key"):
        Fidelity.from_dict({**doc, "agreement": 1.0})
    with pytest.raises(ForgeError, match="missing key"):
        Fidelity.from_dict({k: v for k, v in doc.items() if k != "mel"})


def test_auto_searches_against_the_fidelity_rules_of_the_one_parser(tmp_path: Path) -> None:
    gate = load_gate(None)
    rules = fidelity_rules(gate)
    assert rules == [[r, m, t] for _, r, m, t in gate["rules"] if m in FIDELITY_METRICS] and rules
    targets = fidelity_targets(None)
    assert targets["path"] == str(DEFAULT_GATE) and targets["rules"] == rules
    # a key evaluate refuses is refused by the search too (it used to be skipped silently)
    typo = tmp_path / "typo.toml"
    typo.write_text("[fidelity]\nmin_code_agreement = 0.7\nmin_code_agrement = 0.9\n")
    with pytest.raises(ForgeError, match="unknown threshold 'fidelity.min_code_agrement'"):
        fidelity_targets(typo)
    none = tmp_path / "none.toml"
    none.write_text("[size]\nmax_size_ratio_vs_reference = 1.0\n")
    with pytest.raises(ForgeError, match="no fidelity thresholds"):
        fidelity_targets(none)


def test_auto_judges_a_candidate_with_the_gate_judge() -> None:
    rules = [["min", "code_agreement", 0.75], ["max", "code_kl", 0.25], ["min", "mel_snr_db", 12.0]]
    good = _record(_graph(0.9, 0.8, 0.01, 0.99))
    assert judge_fidelity(rules, good) == (True, [])
    bad = _record(_graph(0.7, 0.6, 0.3, 0.99))
    assert judge_fidelity(rules, bad) == (False, ["code_agreement", "code_kl"])
    nan = _record(_graph(math.nan, 0.8, 0.01, 0.99))
    assert judge_fidelity(rules, nan) == (False, ["code_agreement"])  # a NaN is never a pass


def test_waivers_and_the_integrity_check() -> None:
    metrics = {"wer": 0.1, "wer_delta": 0.01, "cer": None, "cer_delta": None}
    assert intelligibility_waivers(metrics, False, {"cer": "no Mandarin sentence"}) == {
        "cer": "no Mandarin sentence", "cer_delta": "not applicable"}
    assert set(intelligibility_waivers(metrics, True)) == {"wer", "cer", "wer_delta", "cer_delta"}
    gate = {"path": "g.toml", "sha256": "0" * 64, "schema": "chattts-forge/gate/1",
            "rules": [("fidelity", "min", "code_agreement", 0.75)]}
    ok = judge(gate, {"code_agreement": 0.9})
    assert ok["passed"] and ok["failed"] == []
    broken = judge(gate, {"code_agreement": 0.9}, integrity=["gpt: gpt.onnx sha256 differs from artifact.json"])
    assert not broken["passed"] and broken["failed"] == ["artifact_integrity"]
    [check] = [c for c in broken["checks"] if c["metric"] == "artifact_integrity"]
    assert check["status"] == "fail" and "gpt.onnx sha256 differs" in check["message"]
