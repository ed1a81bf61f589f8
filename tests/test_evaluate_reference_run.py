"""The FP32 reference's side of an evaluation, measured once (evaluate.reference_run): an evaluation
that reads it neither synthesizes the reference again nor records its fidelity runs again, and reports
the same figures as one that measures them itself; a run measured with other settings is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate import latency as latency_mod
from chattts_forge.evaluate.cli import evaluate_reference as evaluate_reference_cmd
from chattts_forge.evaluate.evaluate import evaluate_artifact
from chattts_forge.evaluate.evaluate_config import EvaluateConfig
from chattts_forge.quantize import fidelity as fidelity_mod

# Figures that are timings or memory (each variant's probe runs again in every evaluation): measured again by
# every run.
TIMED = ("rtf_p50", "rtf_p95", "rtf_p99", "first_audio_seconds", "rtf_ratio_vs_reference", "rtf_ratio_vs_pytorch",
         "peak_rss_mb", "peak_rss_b8_mb", "rss_after_load_mb", "peak_rss_ratio_vs_reference")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "mine.txt"
    path.write_text("您好，请问有什么可以帮您？\nYour order has shipped today.\n", encoding="utf-8")
    return path


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    """Every figure of a report that does not depend on a clock."""
    return {
        "metrics": {k: v for k, v in report["metrics"].items() if k not in TIMED},
        # (an FP16 graph has no per-tensor table: the reason names a temporary file)
        "fidelity": {k: v for k, v in report["fidelity"].items() if k != "per_tensor_unavailable"},
        "speaker": report["speaker"],
        "naturalness": report["naturalness"],
        "listen": report["listen"],
        "audio": [(u["text"], u["audio_seconds"], u["steps"]) for u in report["latency"]["reference"]["utterances"]],
        "buckets": {n: {k: v for k, v in b["metrics"].items() if k not in TIMED}
                    for n, b in report["buckets"]["results"].items()},
        "gate": [(c["metric"], c["status"]) for c in report["gate"]["checks"] if c["metric"] not in TIMED],
    }


def test_a_shared_reference_run_is_read_not_measured_again_and_gives_the_same_figures(
    tiny_artifacts, corpus_file, tmp_path, monkeypatch
) -> None:
    fp32, fp16 = tiny_artifacts["fp32"], tiny_artifacts["fp16"]
    cfg = EvaluateConfig(corpus=corpus_file, max_sentences=2, max_new_token=24, fidelity_sentences=2, fidelity_steps=24,
                         batch_sizes=(1,), threads=2, baseline_checkpoint=None, progress=False, bucket_sentences=1,
                         cache_phrases=0)
    calls: list[str] = []
    real = latency_mod.measure_artifact

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(latency_mod, "measure_artifact", counting)
    # the gate's RTF ratio times the artifact beside its reference, interleaved (issue 27): the only
    # time an evaluation runs the reference again, for its clock, never for its audio or fidelity
    timed_pairs: list[tuple[str, str]] = []
    real_against = latency_mod.measure_against

    def counting_pairs(path: Any, reference: Any, *args: Any, **kwargs: Any) -> Any:
        timed_pairs.append((Path(path).name, Path(reference).name))
        return real_against(path, reference, *args, **kwargs)

    monkeypatch.setattr(latency_mod, "measure_against", counting_pairs)
    recorded: list[str] = []  # the FP32 runs fidelity replays (the buckets record their own sentences')
    real_record = fidelity_mod.record_trajectories

    def recording(fp32: Any, corpus: Any, *args: Any, **kwargs: Any) -> Any:
        if not corpus.name.startswith("bucket-"):
            recorded.append(Path(fp32).name)
        return real_record(fp32, corpus, *args, **kwargs)

    monkeypatch.setattr(fidelity_mod, "record_trajectories", recording)
    run = tmp_path / "reference_run"
    options = ["--reference", str(fp32), "--corpus", str(corpus_file), "--out", str(run), "--max-sentences", "2",
               "--max-new-token", "24", "--fidelity-sentences", "2", "--fidelity-steps", "24", "--batch", "1",
               "--threads", "2", "--no-baseline"]
    result = CliRunner().invoke(evaluate_reference_cmd, options)
    assert result.exit_code == 0, result.output
    assert calls == ["fp32"] and recorded == ["fp32"]
    assert {p.name for p in run.iterdir()} == {"reference_run.json", "reference_waves.npz", "trajectories.npz",
                                               "buckets.npz"}

    shared = evaluate_artifact(fp16, fp32, dataclasses.replace(cfg, reference_run=run))
    # the reference's own run (audio, record, fidelity replays) was not made again
    assert calls == ["fp32"] and recorded == ["fp32"] and timed_pairs == [("fp16", "fp32")]
    assert any("measured once for the build" in n for n in shared["notes"])
    assert not any(str(run) in n for n in shared["notes"])  # named by its key, not by a folder of this machine
    own = evaluate_artifact(fp16, fp32, cfg)
    assert calls == ["fp32", "fp32"] and recorded == ["fp32", "fp32"] and timed_pairs == [("fp16", "fp32")] * 2
    assert _figures(shared) == _figures(own)
    assert shared["passed"] == own["passed"]
    recorded = json.loads((run / "reference_run.json").read_text(encoding="utf-8"))
    # the report's reference timings are those of the interleaved run (the ratios' own clock); what it
    # generated is the shared run's, step for step
    steps = [(u["text"], u["steps"], u["audio_seconds"]) for u in recorded["latency"]["utterances"]]
    assert [(u["text"], u["steps"], u["audio_seconds"]) for u in shared["latency"]["reference"]["utterances"]] == steps


def test_a_reference_run_measured_with_other_settings_is_refused(tiny_artifacts, corpus_file, tmp_path) -> None:
    from chattts_forge.evaluate.reference_run import evaluate_reference

    cfg = EvaluateConfig(corpus=corpus_file, max_sentences=1, max_new_token=8, batch_sizes=(1,), threads=1,
                         baseline_checkpoint=None, progress=False)
    run = tmp_path / "run"
    evaluate_reference(tiny_artifacts["fp32"], run, cfg)
    other = dataclasses.replace(cfg, max_new_token=16, seed=3, reference_run=run, out=tmp_path / "report")
    with pytest.raises(ForgeError, match=r"other settings \(max_new_token, seed\)"):
        evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], other)
    assert not (tmp_path / "report").exists()
    (run / "reference_waves.npz").write_bytes(b"not a zip")
    with pytest.raises(ForgeError, match="unreadable"):
        evaluate_artifact(tiny_artifacts["fp16"], tiny_artifacts["fp32"], dataclasses.replace(cfg, reference_run=run))
