"""What every evaluation of one build shares, measured once: the FP32 reference's run.

Every variant of a build is judged against the same FP32 reference on the same held-out sentences
with the same settings, so the reference's side of an evaluation is the same for all of them: its
latency run (and the audio of it, which ASR, speaker similarity, DNSMOS and the listen files
compare against), ChatTTS's PyTorch FP32 baseline, the ASR of the reference's audio, and the FP32
runs that fidelity replays the artifact on. The build
driver computes it once per build as its own keyed step (`chattts-forge evaluate-reference`, the
folder `BUILD/<run>/reference_run`), and each `chattts-forge evaluate --reference-run DIR` reads it
instead of measuring it again. Without `--reference-run` evaluate measures it itself, as it always
did, so `chattts-forge evaluate` alone needs nothing else.

The folder: ``reference_run.json`` (schema ``chattts-forge/reference-run/1``: the settings it was
measured with, the latency and baseline records, the reference's ASR scores) and
``reference_waves.npz`` (the reference's audio, float32, exactly as synthesized) and
``trajectories.npz`` (the FP32 runs fidelity teacher-forces the artifact on: every GPT step's inputs,
hidden state and code logits, as `quantize.fidelity.record_trajectories` recorded them). An evaluation
whose settings differ from the recorded ones (another reference, corpus, token budget, seed, threads,
batch sizes, provider, baseline or ASR) refuses the folder with a one-line error, never mixing runs.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.errors import BadInput, NotFound
from chattts_forge.evaluate import textnorm
from chattts_forge.evaluate.buckets import BucketReference, reference_buckets
from chattts_forge.evaluate.report_assembly import describe_artifact
from chattts_forge.fsutil import atomic_output_dir, atomic_write_bytes, atomic_write_json
from chattts_forge.gate import load_gate
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.runtime.providers import resolve_provider

if TYPE_CHECKING:
    from chattts_forge.evaluate.evaluate_config import EvaluateConfig

log = get_logger(__name__)

REFERENCE_RUN_SCHEMA = "chattts-forge/reference-run/1"
RECORD_FILE = "reference_run.json"
WAVES_FILE = "reference_waves.npz"
TRAJECTORIES_FILE = "trajectories.npz"
BUCKETS_FILE = "buckets.npz"  # the reference's side of the length buckets: audio and FP32 runs


@dataclass
class ReferenceRun:
    """The reference's side of an evaluation (see the module docstring)."""

    latency: dict[str, Any]  # latency.measure_artifact's record of the reference
    waves: dict[str, tuple[np.ndarray, int]]  # its audio: id "001".. -> (waveform, sample rate)
    pytorch: dict[str, Any] | None  # latency.measure_pytorch's record, None without a baseline
    baseline_checkpoint: Path | None
    baseline_note: str | None
    asr: dict[str, dict[str, Any]] | None = None  # score_languages of the reference's audio; None: not scored
    trajectories: list[Any] | None = None  # quantize.fidelity.Trajectory of the fidelity sentences; None: not recorded
    fp32_runs_settings: dict[str, Any] | None = None  # what they were recorded with (quantize --fp32-runs checks it)
    buckets: dict[str, Any] | None = None  # evaluate.buckets.BucketReference per length bucket; None: not measured


def run_settings(reference_files: dict[str, Any], corpus: Any, cfg: EvaluateConfig, provider: str) -> dict[str, Any]:
    """What a reference run depends on: the reference's files, the sentences and the settings that
    shape its audio, timings and transcripts (not the artifact's, fidelity's or the buckets')."""
    files = hashlib.sha256(json.dumps(reference_files, sort_keys=True).encode()).hexdigest()
    return {
        "reference_files_sha256": files,
        "corpus_sha256": corpus.sha256,
        "sentences": len(corpus.sentences),
        "max_new_token": cfg.max_new_token,
        "fidelity_sentences": min(cfg.fidelity_sentences, len(corpus.sentences)),
        "fidelity_steps": cfg.fidelity_steps,
        "seed": cfg.seed,
        "threads": cfg.threads,
        "batch_sizes": list(cfg.batch_sizes),
        "provider": provider,
        "baseline_checkpoint": None if cfg.baseline_checkpoint is None else str(cfg.baseline_checkpoint),
        "asr": cfg.asr,
        "asr_model": None if cfg.asr_model is None else str(cfg.asr_model),
        # the text the reference speaks and the form its transcripts are scored in (runtime.spoken)
        "text_normalizer": textnorm.normalizer_key(),
    }


def reference_run_key(settings: dict[str, Any]) -> str:
    """What a report names a reference run by (not its folder): the sha256 of its settings, 16 digits."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def write_reference_run(run: ReferenceRun, folder: Path, settings: dict[str, Any]) -> None:
    """Write the run to `folder` (replaced atomically: a killed run leaves the old folder or none)."""
    buf = io.BytesIO()
    arrays = {f"wav_{k}": np.asarray(w) for k, (w, _) in run.waves.items()}
    arrays |= {f"sr_{k}": np.asarray(sr) for k, (_, sr) in run.waves.items()}
    np.savez(buf, **arrays)
    from chattts_forge.quantize.fidelity import trajectory_arrays

    traj_arrays = trajectory_arrays(run.trajectories or [], run.fp32_runs_settings)
    traj_index = json.loads(bytes(traj_arrays["index"]).decode("utf-8"))["trajectories"]
    traj_buf = io.BytesIO()
    np.savez(traj_buf, **traj_arrays)
    record = {
        "schema": REFERENCE_RUN_SCHEMA,
        "settings": settings,
        "latency": run.latency,
        "pytorch": run.pytorch,
        "baseline_checkpoint": None if run.baseline_checkpoint is None else str(run.baseline_checkpoint),
        "baseline_note": run.baseline_note,
        "asr": run.asr,
        "waves": sorted(run.waves),
        "trajectories": None if run.trajectories is None else traj_index,
        "buckets": None,
    }
    bucket_buf = None
    if run.buckets is not None:
        bucket_arrays: dict[str, np.ndarray] = {}
        record["buckets"] = {}
        for name, b in run.buckets.items():
            arrays_b = trajectory_arrays(b.trajectories)
            index_b = json.loads(bytes(arrays_b.pop("index")).decode("utf-8"))["trajectories"]
            bucket_arrays |= {f"{name}/{k}": v for k, v in arrays_b.items()}
            bucket_arrays |= {f"{name}/wav_{k}": np.asarray(w) for k, (w, _) in b.waves.items()}
            record["buckets"][name] = {"sentences": b.sentences, "latency": b.latency, "settings": b.settings,
                                       "waves": {k: sr for k, (_, sr) in sorted(b.waves.items())},
                                       "trajectories": index_b}
        bucket_buf = io.BytesIO()
        np.savez(bucket_buf, **bucket_arrays)
    with atomic_output_dir(folder) as tmp:
        if bucket_buf is not None:
            atomic_write_bytes(tmp / BUCKETS_FILE, bucket_buf.getvalue())
        atomic_write_bytes(tmp / WAVES_FILE, buf.getvalue())
        atomic_write_bytes(tmp / TRAJECTORIES_FILE, traj_buf.getvalue())
        atomic_write_json(tmp / RECORD_FILE, record)
    log.info("reference run written to %s (%d utterances)", folder, len(run.waves))


def read_reference_run(folder: Path, settings: dict[str, Any]) -> ReferenceRun:
    """The run in `folder`, which must have been measured with `settings` (one-line ForgeError otherwise)."""
    path = Path(folder) / RECORD_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        with np.load(Path(folder) / WAVES_FILE, allow_pickle=False) as z:
            waves = {k: (z[f"wav_{k}"], int(z[f"sr_{k}"])) for k in record["waves"]}
        from chattts_forge.quantize.fidelity import trajectories_from

        trajectories = None
        if record["trajectories"] is not None:
            with np.load(Path(folder) / TRAJECTORIES_FILE, allow_pickle=False) as z:
                trajectories = trajectories_from(z, record["trajectories"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"reference run {folder} is unreadable ({type(e).__name__}: {e}); "
                         "run `chattts-forge evaluate-reference` again") from None
    if record.get("schema") != REFERENCE_RUN_SCHEMA:
        raise BadInput(f"{path}: schema {record.get('schema')!r} is not {REFERENCE_RUN_SCHEMA!r}")
    if record.get("settings") != settings:
        theirs = record.get("settings") or {}
        differ = sorted(k for k in set(settings) | set(theirs) if settings.get(k) != theirs.get(k))
        raise BadInput(f"reference run {folder} was measured with other settings ({', '.join(differ)}); "
                         "evaluate without --reference-run or measure it again with these settings")
    baseline = record["baseline_checkpoint"]
    return ReferenceRun(record["latency"], waves, record["pytorch"], None if baseline is None else Path(baseline),
                        record["baseline_note"], record["asr"], trajectories,
                        buckets=_read_buckets(Path(folder), record.get("buckets")))


def _read_buckets(folder: Path, index: dict[str, Any] | None) -> dict[str, Any] | None:
    from chattts_forge.quantize.fidelity import trajectories_from

    if not index:
        return None
    out = {}
    try:
        with np.load(folder / BUCKETS_FILE, allow_pickle=False) as z:
            for name, rec in index.items():
                view = {k[len(name) + 1:]: z[k] for k in z.files if k.startswith(f"{name}/")}
                out[name] = BucketReference(rec["sentences"], rec["latency"],
                                            {k: (view[f"wav_{k}"], int(sr)) for k, sr in rec["waves"].items()},
                                            trajectories_from(view, rec["trajectories"]), rec["settings"])
    except (OSError, ValueError, KeyError) as e:
        raise BadInput(f"reference run {folder}: {BUCKETS_FILE} is unreadable ({type(e).__name__}: {e})") from None
    return out


def measure_reference_run(reference: Path, ref_desc: dict[str, Any], art_desc: dict[str, Any], corpus: Any,
                          cfg: EvaluateConfig, synthetic: bool, score_asr: bool) -> ReferenceRun:
    """Measure the reference's side: its latency run and audio, the PyTorch baseline, and (with
    `score_asr`, on a checkpoint that is not synthetic) the ASR of its audio."""
    from chattts_forge.evaluate import latency as latency_mod
    from chattts_forge.evaluate.evaluate import latency_config, resolve_baseline, score_languages

    show = True if cfg.progress is None else bool(cfg.progress)
    provider = resolve_provider(cfg.provider)
    with quiet_logger(enabled=synthetic):
        ref_lat, ref_waves = latency_mod.measure_artifact(reference, corpus.sentences,
                                                          latency_config(cfg, provider, show),
                                                          desc="synth fp32 reference")
    baseline, note = resolve_baseline(cfg.baseline_checkpoint, art_desc, ref_desc)
    pt_lat = None
    if baseline is not None:
        log.info("measuring ChatTTS's PyTorch FP32 pipeline on %s", baseline)
        pt_lat = latency_mod.measure_pytorch(baseline, corpus.sentences, threads=cfg.threads,
                                             max_new_token=cfg.max_new_token, seed=cfg.seed, progress=show)
    asr, trajectories = None, None
    if score_asr:  # the shared step: everything the evaluations would otherwise each do again
        if not synthetic:
            asr = score_languages(corpus.sentences, {"reference": ref_waves}, cfg.asr, cfg.asr_model, cfg.threads,
                                  show)
        trajectories = fidelity_trajectories(reference, corpus, cfg, show)
    from chattts_forge.quantize.fidelity import fp32_runs_settings

    settings = fp32_runs_settings(reference, corpus, min(cfg.fidelity_sentences, len(corpus.sentences)),
                                  cfg.fidelity_steps, cfg.seed)
    buckets = None
    if score_asr and cfg.bucket_sentences > 0:  # the length buckets' reference side, for every variant
        from chattts_forge.evaluate.evaluate import bucket_settings

        with quiet_logger(enabled=synthetic):
            buckets = reference_buckets(reference, load_corpus(cfg.corpus).sentences, load_gate(cfg.gate),
                                        bucket_settings(cfg, provider, synthetic))
    return ReferenceRun(ref_lat, ref_waves, pt_lat, baseline, note, asr, trajectories, settings, buckets)


def fidelity_trajectories(reference: Path, corpus: Any, cfg: EvaluateConfig, progress: bool) -> list[Any]:
    """The FP32 runs fidelity replays the artifact on: the first `fidelity_sentences` sentences,
    `fidelity_steps` GPT steps each (what evaluate's fidelity phase records when it is not given them)."""
    from chattts_forge.quantize.fidelity import FidelitySettings, record_trajectories

    sentences = min(cfg.fidelity_sentences, len(corpus.sentences))
    log.info("recording the FP32 runs fidelity replays (%d sentences)", sentences)
    recording = FidelitySettings(max_sentences=sentences, max_new_token=cfg.fidelity_steps, seed=cfg.seed,
                                 threads=cfg.threads, progress=progress)
    return record_trajectories(reference, corpus, recording)


def evaluate_reference(reference: str | Path, out: str | Path, cfg: EvaluateConfig) -> ReferenceRun:
    """`chattts-forge evaluate-reference`: measure the FP32 reference's run once and write it to `out`."""
    reference = Path(reference)
    if not reference.is_dir():
        raise NotFound(f"reference folder {reference} does not exist")
    cfg.check()
    provider = resolve_provider(cfg.provider)
    corp = load_corpus(cfg.corpus, max_sentences=cfg.max_sentences)
    desc = describe_artifact(reference)
    synthetic = desc["source"].get("kind") == "synthetic"
    log.info("measuring the reference run of %s on %d sentences of %s", reference, len(corp.sentences), corp.name)
    with quiet_logger(enabled=synthetic):
        run = measure_reference_run(reference, desc, desc, corp, cfg, synthetic, score_asr=True)
    write_reference_run(run, Path(out), run_settings(desc["files"], corp, cfg, provider))
    return run
