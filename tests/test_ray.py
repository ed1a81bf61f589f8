"""evaluate on a real local Ray cluster (the `scale` extra): same figures as one process, worker loss.

The cluster is started inside the suite (`ray.init(address="local")`, 2 CPUs, no dashboard, loopback
only) and stopped at the end of the module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.evaluate import evaluate_artifact

ray = pytest.importorskip("ray", reason="the scale extra (Ray) is not installed")

FAST = dict(max_sentences=4, max_new_token=16, fidelity_sentences=4, fidelity_steps=16, batch_sizes=(1,),
            threads=1, baseline_checkpoint=None, progress=False)


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "four.txt"
    path.write_text("Your order has shipped today.\n您好，请问有什么可以帮您？\n"
                    "The meeting starts at nine.\n今天天气很好。\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def int8(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dynamic INT8 (with the fused GPT graph): fidelity figures that are not trivially perfect, and
    a per-tensor table (FP16 graphs have none)."""
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    return Path(quantize_artifact(tiny_artifacts["fp32"], tmp_path_factory.mktemp("int8") / "int8-dynamic", QuantizeConfig("dynamic", fidelity=False, threads=1, progress=False)))


@pytest.fixture(scope="module")
def single_process_report(int8: Path, tiny_artifacts: dict[str, Path], corpus4: Path) -> dict[str, Any]:
    return evaluate_artifact(int8, tiny_artifacts["fp32"], corpus4, **FAST)


def kill_worker(marker_dir: Path, shard: int, every_attempt: bool) -> Any:
    """A shard hook that SIGKILLs the worker's own process when it starts `shard` (the first attempt
    only, unless `every_attempt`). Nested so cloudpickle ships it by value to the workers."""

    def hook(kind: str, index: int) -> None:
        if kind != "fidelity" or index != shard:
            return
        marker = Path(marker_dir) / f"killed-{index}-{os.getpid()}"
        if every_attempt or not any(Path(marker_dir).glob(f"killed-{index}-*")):
            marker.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _figures(report: dict[str, Any]) -> tuple[Any, ...]:
    fid = report["fidelity"]
    return (fid["teacher_forced"], fid["hidden_cosine"], fid["mel"], fid["gpt_fast"], fid["per_tensor"],
            fid["corpus"], fid["settings"], report["intelligibility"])


def test_ray_local_two_workers_equal_single_process(ray_cluster, int8, tiny_artifacts, corpus4, single_process_report,
                                                    tmp_path) -> None:
    out = tmp_path / "report"
    report = evaluate_artifact(int8, tiny_artifacts["fp32"], corpus4, out=out, ray="local",
                               ray_workers=2, **FAST)
    assert _figures(report) == _figures(single_process_report)
    assert report["fidelity"]["corpus"]["sentences_used"] == 4
    assert report["fidelity"]["per_tensor"]["samples"] == 4
    assert report["fidelity"]["teacher_forced"]["top1_agreement"]["mean"] < 1.0  # a real comparison
    for key in ("code_agreement", "code_kl", "hidden_cosine", "mel_snr_db", "mel_lsd_db"):
        assert report["metrics"][key] == single_process_report["metrics"][key], key
    # The report names the workers and says where latency was measured.
    where = report["machine"]["ray"]
    assert [w["name"] for w in where["workers"]] == ["ray-worker-0", "ray-worker-1"]
    assert len({w["pid"] for w in where["workers"]}) == 2 and os.getpid() not in {w["pid"] for w in where["workers"]}
    assert where["latency_measured_on"]["pid"] == os.getpid()
    assert any("ray-worker-1" in n and "latency was measured" in n for n in report["notes"])
    assert (out / "report.json").is_file()


def test_killed_worker_shard_is_retried(ray_cluster, int8, tiny_artifacts, corpus4, single_process_report,
                                        tmp_path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    report = evaluate_artifact(int8, tiny_artifacts["fp32"], corpus4, ray="local", ray_workers=2,
                               ray_shard_hook=kill_worker(markers, shard=1, every_attempt=False), **FAST)
    assert len(list(markers.iterdir())) == 1  # the worker really died once
    assert _figures(report) == _figures(single_process_report)


def test_worker_dying_on_every_attempt_fails_naming_the_shard_and_writes_nothing(
    ray_cluster, int8, tiny_artifacts, corpus4, tmp_path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "report"
    with pytest.raises(ForgeError) as err:
        evaluate_artifact(int8, tiny_artifacts["fp32"], corpus4, out=out, ray="local",
                          ray_workers=2, ray_retries=1,
                          ray_shard_hook=kill_worker(markers, shard=1, every_attempt=True), **FAST)
    message = str(err.value)
    assert "\n" not in message
    assert "fidelity shard 1" in message and "ray-worker-1" in message and "1 retry" in message
    assert len(list(markers.iterdir())) == 2  # the first attempt and the retry
    assert not out.exists()  # no report, so nothing can be published from it


def test_without_ray_installed_ray_is_a_one_line_error(int8, tiny_artifacts, corpus4, monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ForgeError, match=r"needs Ray, which is not installed \(pip install 'chattts-forge\[scale\]'\)"):
        evaluate_artifact(int8, tiny_artifacts["fp32"], corpus4, out=tmp_path / "r", ray="local",
                          **FAST)
    assert not (tmp_path / "r").exists()


def test_nothing_imports_ray_unless_asked() -> None:
    code = (
        "import sys\n"
        "import chattts_forge.cli, chattts_forge.evaluate.evaluate, chattts_forge.evaluate.cli\n"
        "import chattts_forge.evaluate.ray_shards, chattts_forge.driver.pipeline, chattts_forge.raycluster\n"
        "import chattts_forge.driver.ray_steps\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_driver_runs_variant_steps_as_ray_tasks_with_unchanged_keys(ray_cluster, tmp_path) -> None:
    """`make artifacts RAY=local` on tiny: the variants' steps run as Ray tasks (side by side, 1 CPU each
    here), the same records are written, so a run without Ray finds everything up to date."""
    from chattts_forge.driver.config import parse_stage_args
    from chattts_forge.driver.pipeline import run_pipeline
    from chattts_forge.publish import verify_path

    kwargs = dict(build=tmp_path / "build", to=tmp_path / "artifacts", preset="tiny", variants=("fp32", "int8-dynamic"),
                  extra=parse_stage_args([
                      "quantize=--fidelity-sentences 1 --fidelity-steps 16",
                      "evaluate=--max-sentences 1 --max-new-token 24 --fidelity-sentences 1 --fidelity-steps 16 --batch 1",
                  ]))
    outcomes = run_pipeline(**kwargs, ray="local", ray_step_cpus=1)
    assert {o.variant: o.status for o in outcomes} == {"fp32": "published", "int8-dynamic": "published"}
    records = sorted((tmp_path / "build").glob("*/.steps/*-*.json"))
    assert {r.stem for r in records} >= {"quantize-int8-dynamic", "evaluate-fp32", "evaluate-int8-dynamic"}
    before = {r: (r.read_bytes(), r.stat().st_mtime_ns) for r in records}
    again = run_pipeline(**kwargs)  # no Ray: the keys are the same, nothing re-runs
    assert {o.variant: o.status for o in again} == {"fp32": "already-published", "int8-dynamic": "already-published"}
    assert {r: (r.read_bytes(), r.stat().st_mtime_ns) for r in records} == before
    assert verify_path(tmp_path / "artifacts").ok


def test_asr_sharded_over_ray_scores_like_one_process(ray_cluster, data_dir, tiny_artifacts) -> None:
    """Intelligibility (real speech, real ASR): transcribed on 2 Ray workers, merged in corpus order, the
    WER figures equal the single-process ones (only the timings differ)."""
    from chattts_forge.evaluate.asr import load_audio
    from chattts_forge.evaluate.degrade import white_noise
    from chattts_forge.evaluate.evaluate import score_intelligibility
    from chattts_forge.evaluate.ray_shards import RayShards
    from chattts_forge.evaluate.score import read_transcripts

    folder = data_dir / "speech" / "en"
    refs = read_transcripts(folder / "transcripts.tsv")
    chosen = ["003", "030", "011"]
    sentences = [refs[k] for k in chosen]
    clean = {f"{i + 1:03d}": (load_audio(folder / f"{k}.wav"), 16000) for i, k in enumerate(chosen)}
    noisy = {k: (white_noise(a, snr_db=0.0), sr) for k, (a, sr) in clean.items()}
    waves = {"artifact": noisy, "reference": clean}
    local = score_intelligibility(sentences, waves, "faster-whisper", None, 1, False)
    with RayShards("local", 2, tiny_artifacts["fp32"], tiny_artifacts["fp32"], threads=1) as shards:
        sharded = score_intelligibility(sentences, waves, "faster-whisper", None, 1, False,
                                        transcriber=shards.transcriber("faster-whisper", None))

    def without_timings(result: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in result.items() if k != "languages"}
        for lang, entry in result["languages"].items():
            for variant, scored in entry["variants"].items():
                out[(lang, variant)] = (scored["corpus"], [
                    {k: v for k, v in u.items() if k not in ("asr_seconds", "audio_seconds")} for u in scored["utterances"]])
            out[(lang, "asr")] = entry["asr"]
        return out

    assert local["measured"] and local["wer_delta"] > 0
    assert without_timings(sharded) == without_timings(local)
