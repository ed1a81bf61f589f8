"""The evaluate stage: judge one artifact against its FP32 reference and write the gate reports.

Library::

    from chattts_forge.evaluate.evaluate import EvaluateConfig, evaluate_artifact
    cfg = EvaluateConfig(corpus="builtin:evaluation", gate=None, out="reports/int8-dynamic")
    report = evaluate_artifact("artifacts/int8-dynamic", "artifacts/fp32", cfg)
    report["passed"]    # the gate's verdict; report.json / report.md / report.html are in `out`

With `EvaluateConfig(reference_run=DIR)` the FP32 reference's side (its latency run and audio, the
PyTorch baseline, the ASR of its audio) is read from a folder `evaluate-reference` wrote, once for a
whole build (`reference_run`), instead of measured here; the figures are the same.

What one run measures (all on the same machine, in the same process; with `ray=ADDRESS|local`,
fidelity and the ASR transcription run sharded over Ray actors instead, with the same figures:
`ray_shards`):

1. the exact files judged: sha256 and bytes of every file of the artifact and of the reference,
   and whether they match the hashes their artifact.json records;
2. latency with the runtime (`latency.measure_artifact`) for the artifact *and* the FP32 reference:
   load time, warm-up, per-utterance time, RTF p50/p95/p99, steps/s, first-audio latency when
   streaming, throughput at batch 1/4/8, bytes on disk, and memory (each side in a process of its own,
   as `bench` measures it: the report's ``memory`` section); with `baseline_checkpoint`, ChatTTS's
   PyTorch FP32 pipeline too (`latency.measure_pytorch`), so every speed figure is also a ratio.
   Both measure with bench's engines (`chattts_forge.runtime.timing`): the gate's RTF is bench's
   end-to-end RTF at batch 1, on the corpus sentences with EOS free (docs/bench.md "Definitions");
3. intelligibility: the utterances of both are transcribed by the ASR (`score.score_waveforms`),
   WER (English) / CER (Mandarin) absolute and as a delta against the reference's own audio.
   On a synthetic checkpoint (artifact.json ``source.kind == "synthetic"``) random weights make
   noise, so intelligibility is *not measured*: the report says so and the gate waives those
   thresholds, leaving fidelity to decide (never a fake pass);
4. fidelity against the FP32 reference (`chattts_forge.quantize.measure_fidelity`: teacher-forced
   code top-1 agreement and KL per stream, hidden-state cosine, mel SNR / log-spectral distance,
   worst tensors);
5. what listeners hear (`listening`): per sentence the speaker similarity (SIM) of the artifact's
   audio to the reference's audio of the same sentence (the latency run's audio: the FP32 audio
   costs no extra synthesis), DNSMOS of both and the OVRL drop, SIM of cloned output to a cloning
   recording when one is given; on synthetic checkpoints shown as synthetic-only and waived like
   WER. The first `listen_sentences` sentences' audio (MP3) and mel spectrograms go beside the
   report (``listen/``) for the version page;
6. stream seams (`seams`): streamed against whole-text audio of the artifact, default chunking and
   with a stream lookahead, on the first `seam_sentences` sentences;
7. a 95% bootstrap interval per corpus figure and per-sentence rows (`intervals`);
8. the gate (`chattts_forge.gate.judge`, waivers and the integrity check included) on the flat
   `metrics`, then the reports (`report.write_reports`).

The report's JSON layout (schema ``chattts-forge/report/1``), its seal and its strict validation
live in `report_schema` (its types in `report_record`); the sections around the measurements are
assembled by `report_assembly`; `report.write_reports` writes it with its Markdown and HTML renderings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT
from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.calibration_data.phrases import shipped_phrases
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.evaluate import intervals as intervals_mod
from chattts_forge.evaluate import latency as latency_mod
from chattts_forge.evaluate import listening, seams, textnorm
from chattts_forge.evaluate.asr import get_backend
from chattts_forge.evaluate.buckets import BucketSettings, CorpusGate, measure_buckets
from chattts_forge.evaluate.evaluate_config import EvaluateConfig
from chattts_forge.evaluate.intervals import fidelity_sentences
from chattts_forge.evaluate.latency_run import latency_settings, read_latency_pair
from chattts_forge.evaluate.ray_shards import RayShards
from chattts_forge.evaluate.reference_run import (
    ReferenceRun,
    measure_reference_run,
    read_reference_run,
    run_settings,
)
from chattts_forge.evaluate.report import write_reports
from chattts_forge.evaluate.report_assembly import (
    SYNTHETIC_NOTE,
    describe_artifact,
    flat_metrics,
    latency_ratios,
    memory_section,
    relative_folders,
    report_body,
    report_notes,
    waivers,
)
from chattts_forge.evaluate.report_schema import headline, seal
from chattts_forge.evaluate.score import score_hypotheses, score_waveforms
from chattts_forge.evaluate.serving import measure_cache_effect
from chattts_forge.evaluate.step_ratio import interleaved_step_ratio
from chattts_forge.gate import judge, load_gate
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.raycluster import import_ray
from chattts_forge.runtime.providers import resolve_provider

log = get_logger(__name__)

Waves = dict[str, tuple[np.ndarray, int]]  # utterance id "001", ... -> (waveform, sample rate)


def score_languages(
    sentences: list[str],
    waves: dict[str, dict[str, tuple[np.ndarray, int]]],
    asr: str,
    asr_model: str | os.PathLike[str] | None,
    threads: int | None,
    progress: bool,
    transcriber: Callable[..., Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """ASR scores of each variant's audio per language of the sentences: {lang: {"asr": the backend's
    description, "variants": {variant: {"corpus", "utterances"}}}}, languages sorted.

    `waves` is {variant: {id: (wav, sr)}} with ids "001", "002", ... in sentence order; each sentence
    is scored in its own language (`textnorm.detect_lang`). `transcriber(lang, waves, ids) ->
    (hypotheses, timing, asr description)` transcribes elsewhere (`RayShards.transcriber`); the scores
    are computed here from the hypotheses either way.
    """

    ids = [f"{i + 1:03d}" for i in range(len(sentences))]
    by_lang: dict[str, dict[str, str]] = {}
    for utt_id, text in zip(ids, sentences, strict=True):
        by_lang.setdefault(textnorm.detect_lang([text]), {})[utt_id] = text
    out: dict[str, dict[str, Any]] = {}
    for lang, refs in sorted(by_lang.items()):
        backend = get_backend(asr, lang, asr_model, threads) if transcriber is None else None
        per_variant, asr_desc = {}, None
        for variant, wv in waves.items():
            if backend is not None:
                res = score_waveforms(wv, refs, backend, lang, progress=progress, desc=f"ASR {variant} {lang}")
                asr_desc = backend.describe()
            else:
                t0 = time.perf_counter()
                hyps, timing, asr_desc = transcriber(lang, wv, list(refs))
                res = score_hypotheses(refs, hyps, timing, asr_desc, lang, time.perf_counter() - t0)
            per_variant[variant] = {"corpus": res["corpus"], "utterances": res["utterances"]}
        out[lang] = {"asr": asr_desc, "variants": per_variant}
    return out


def score_intelligibility(
    sentences: list[str],
    waves: dict[str, dict[str, tuple[np.ndarray, int]]],
    asr: str,
    asr_model: str | os.PathLike[str] | None,
    threads: int | None,
    progress: bool,
    transcriber: Callable[..., Any] | None = None,
    reference_scores: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """ASR scores of the artifact's and the reference's audio per language (`score_languages`), and
    the deltas. `waves` is {"artifact": ..., "reference": ...}; with `reference_scores` (a
    `score_languages` result of the reference's audio: the build's shared reference run) the
    reference's audio is not transcribed again and `waves` needs only "artifact"."""
    langs = score_languages(sentences, waves, asr, asr_model, threads, progress, transcriber)
    out: dict[str, Any] = {"measured": True, "languages": {}}
    for lang, entry in langs.items():
        per_variant, asr_desc = entry["variants"], entry["asr"]
        if reference_scores is not None:  # scored last before, so its backend description is the one kept
            per_variant["reference"] = reference_scores[lang]["variants"]["reference"]
            asr_desc = reference_scores[lang]["asr"]
        out["languages"][lang] = {"asr": asr_desc, "variants": per_variant}
        art, ref = per_variant["artifact"]["corpus"], per_variant["reference"]["corpus"]
        key = "cer" if lang == "zh" else "wer"
        out[key] = art[key]
        out[f"reference_{key}"] = ref[key]
        out[f"{key}_delta"] = art[key] - ref[key]
    return out


def _fidelity(j: Judged, cfg: EvaluateConfig, trajectories: list[Any] | None = None,
              ) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """`measure_fidelity`'s record on the first `cfg.fidelity_sentences` sentences, made of its own
    steps so the per-sentence comparisons are kept too (the intervals' input): (record, per-sentence
    agreement and mel energies). `trajectories`: the FP32 runs already recorded (the build's shared
    reference run); None: recorded here."""
    try:
        from chattts_forge.quantize.fidelity import FidelitySettings, record_trajectories, summarize_fidelity
    except ImportError as e:
        raise BadInput(f"fidelity needs chattts_forge.quantize ({e})") from None

    reference, artifact, corpus, threads = j.reference, j.artifact, j.corpus, cfg.threads
    sentences, steps, seed = min(cfg.fidelity_sentences, len(j.sentences)), cfg.fidelity_steps, cfg.seed
    sessions = j.replay_sessions(threads)
    if trajectories is None:
        recording = FidelitySettings(max_sentences=sentences, max_new_token=steps, seed=seed, threads=threads,
                                     progress=cfg.show)
        trajectories = record_trajectories(reference, corpus, recording)
    comparisons = [sessions.compare(t) for t in trajectories]
    result = summarize_fidelity(reference, corpus, comparisons,
                                {"max_sentences": sentences, "max_new_token": steps, "seed": seed})
    try:
        result["per_tensor"] = sessions.tensor_table(trajectories, 8, False)
    except ForgeError as e:
        # The per-tensor table exposes float32 intermediates; an FP16 graph's are float16, so it
        # cannot be built there. The fidelity figures themselves do not depend on it.
        log.info("per-tensor error table unavailable for %s (%s); fidelity is measured without it", artifact, e)
        result["per_tensor_unavailable"] = str(e)
    # The gate judges the worse GPT graph (flat_metrics): the per-sentence rows follow that one.
    fast = (result.get(FAST_GPT) or {}).get("teacher_forced")
    use_fast = bool(fast) and fast["top1_agreement"]["mean"] < result["teacher_forced"]["top1_agreement"]["mean"]
    return result, fidelity_sentences(comparisons, use_fast)


def resolve_baseline(
    requested: str | os.PathLike[str] | None, art: dict[str, Any], ref: dict[str, Any]
) -> tuple[Path | None, str | None]:
    """(checkpoint to time ChatTTS's PyTorch pipeline on, or None; a note when it is skipped)."""

    if requested is None:
        return None, "No PyTorch baseline in this run (disabled); speed ratios are against the FP32 artifact only."
    if str(requested) != "auto":
        if not Path(requested).exists():
            raise NotFound(f"baseline checkpoint {requested} does not exist")
        return Path(requested), None
    source = art["source"].get("asset_dir") or ref["source"].get("asset_dir")
    if importlib.util.find_spec("torch") is None:
        return None, "No PyTorch baseline: torch is not installed (pip install -e '.[export]')."
    if not source or not Path(source).is_dir():
        return None, (f"No PyTorch baseline: the source checkpoint {source or '(unknown)'} is not on this machine; "
                      "pass --baseline-checkpoint DIR.")
    return Path(source), None


@dataclass
class Judged:
    """What one evaluation judges, described once: the two folders, their descriptions, the corpus,
    the gate and where the artifacts run."""

    artifact: Path
    reference: Path
    art_desc: dict[str, Any]
    ref_desc: dict[str, Any]
    corpus: Any  # calibration_data.corpus.Corpus
    gate: dict[str, Any]
    provider: str
    _replay: Any = None  # replay_sessions()

    @property
    def sentences(self) -> list[str]:
        return self.corpus.sentences

    @property
    def synthetic(self) -> bool:
        return (self.art_desc["source"].get("kind") or self.ref_desc["source"].get("kind")) == "synthetic"

    @property
    def tiny(self) -> bool:
        presets = (self.art_desc["source"].get("preset"), self.ref_desc["source"].get("preset"))
        return self.synthetic and "tiny" in presets

    def replay_sessions(self, threads: int | None) -> Any:
        """The fidelity replay's sessions (quantize.fidelity.ReplaySessions), loaded once for the corpus
        and every length bucket."""
        from chattts_forge.quantize.fidelity import ReplaySessions

        if self._replay is None:
            self._replay = ReplaySessions(self.reference, self.artifact, threads)
        return self._replay

    @property
    def self_reference(self) -> bool:
        """The FP32 artifact judged against itself (the build's fp32 step): timed once, not twice."""
        return self.artifact.resolve() == self.reference.resolve()


def prepare(artifact: Path, reference: Path, cfg: EvaluateConfig) -> Judged:
    """Check everything that can fail before any work (folders, settings, Ray, gate file, provider,
    corpus) and describe both artifacts."""

    for p, what in ((artifact, "artifact"), (reference, "reference")):
        if not p.is_dir():
            raise NotFound(f"{what} folder {p} does not exist")
    cfg.check()
    if cfg.ray is not None:

        import_ray()  # fail before any work when the extra is missing
    gate_cfg = load_gate(cfg.gate)  # fail early on a bad gate file
    provider = resolve_provider(cfg.provider)  # likewise a `cuda` without a usable GPU
    corp = load_corpus(cfg.corpus, max_sentences=cfg.max_sentences)
    judged = Judged(artifact, reference, describe_artifact(artifact), describe_artifact(reference), corp, gate_cfg,
                    provider)
    if judged.ref_desc["variant"] not in (None, "fp32"):
        log.warning("reference %s is variant %s, not fp32", reference, judged.ref_desc["variant"])
    return judged


def latency_config(cfg: EvaluateConfig, provider: str, progress: bool) -> latency_mod.LatencyConfig:
    """How this evaluation times an artifact (and its reference, with the same settings)."""
    return latency_mod.LatencyConfig(threads=cfg.threads, max_new_token=cfg.max_new_token, seed=cfg.seed,
                                     batch_sizes=tuple(cfg.batch_sizes), progress=progress, provider=provider)


def reference_side(j: Judged, cfg: EvaluateConfig) -> ReferenceRun:
    """The FP32 reference's run: read from `cfg.reference_run` (the build's shared step), else measured
    here (its audio is then transcribed with the artifact's, in the corpus phase)."""

    if cfg.reference_run is not None:
        run = read_reference_run(Path(cfg.reference_run), run_settings(j.ref_desc["files"], j.corpus, cfg, j.provider))
        log.info("reference run read from %s (measured once for the build)", cfg.reference_run)
        return run
    return measure_reference_run(j.reference, j.ref_desc, j.art_desc, j.corpus, cfg, j.synthetic, score_asr=False)


def measure_latency(j: Judged, cfg: EvaluateConfig, ref: ReferenceRun
                    ) -> tuple[dict[str, Any], dict[str, Any] | None, Waves]:
    """The report's ``latency`` section (the artifact timed with the reference's settings), its
    ``memory`` section (each side's fresh-process figures, `memory_section`) and the artifact's audio
    (the input of ASR and hearing)."""
    pair = None
    ref_lat, pt_lat = ref.latency, ref.pytorch
    if j.self_reference:
        art_lat, art_waves = ref.latency, ref.waves
    else:  # sentence by sentence in turn with the reference until the RTF ratio's spread is within its
        # bound (issue 27): the ratio needs both on one clock, so the reference is timed again here
        # (its audio, ASR and fidelity stay the shared run's), or read from the build's latency run,
        # where every variant was timed in the same rounds as the reference
        if cfg.latency_run is not None:

            pair = read_latency_pair(Path(cfg.latency_run), str(j.art_desc["variant"]),
                                     latency_settings(j.ref_desc["files"], j.corpus, cfg, j.provider),
                                     j.art_desc["files"])
            log.info("latency read from %s (timed with the build's other variants)", cfg.latency_run)
        else:
            with quiet_logger(enabled=j.synthetic):
                pair = latency_mod.measure_against(j.artifact, j.reference, j.sentences,
                                                   latency_config(cfg, j.provider, cfg.show),
                                                   desc=f"synth {j.art_desc['variant']}")
        art_lat, art_waves, ref_lat = pair.artifact, pair.artifact_waves, pair.reference
    memory = memory_section(art_lat, ref.latency)  # the reference's memory: its own run's (probed once)
    # the memory figures have one place in the report (its ``memory`` section), not one per latency record
    art_lat, ref_lat = ({k: v for k, v in rec.items() if k != "memory"} for rec in (art_lat, ref_lat))
    latency = {
        "artifact": art_lat,
        "reference": ref_lat,
        "pytorch": pt_lat,
        "ratios": {
            "vs_reference": latency_mod.interleaved_ratios(latency_ratios(art_lat, ref_lat), pair),
            "vs_pytorch": latency_ratios(art_lat, pt_lat) if pt_lat else None,
            "reference_vs_pytorch": latency_ratios(ref_lat, pt_lat) if pt_lat else None,
            # the same comparison on one clock (issue 27): decode steps interleaved, with its interval
            "vs_reference_interleaved": None if j.self_reference else interleaved_step_ratio(
                j.artifact, j.reference, threads=cfg.threads, provider=j.provider),
            "vs_reference_rtf_interleaved": pair.ratio if pair else None,  # the gate's rtf_p50 ratio, with spread
        },
        "method": f"runtime.timing engines, one sentence per run (synthesize's path) after {art_lat['warmup_runs']} "
        f"warm-up run(s); {cfg.threads} threads; max_new_token {cfg.max_new_token}; RTF = end-to-end seconds / audio "
        "seconds of the generated codes (docs/bench.md)",
    }
    log.info("latency done: RTF p50 %.3f (artifact) vs %.3f (fp32 reference)", art_lat["rtf"]["p50"] or 0,
             ref_lat["rtf"]["p50"] or 0)
    return latency, memory, art_waves


@dataclass
class CorpusFigures:
    """The corpus-level figures of the corpus phase."""

    intelligibility: dict[str, Any]
    fidelity: dict[str, Any]
    fidelity_rows: list[dict[str, float]] | None  # per sentence (None when sharded over Ray)
    distributed: dict[str, Any] | None  # the Ray workers, when sharded


def corpus_phase(j: Judged, cfg: EvaluateConfig, ref: ReferenceRun, art_waves: Waves) -> CorpusFigures:
    """Intelligibility (ASR) and fidelity on the corpus, here or (ray) on a pool of Ray actors started
    only now, after latency."""
    with contextlib.ExitStack() as stack:
        shards = None
        if cfg.ray is not None:

            shards = stack.enter_context(RayShards(cfg.ray, cfg.ray_workers, j.reference, j.artifact, cfg.threads,
                                                   retries=cfg.ray_retries, hook=cfg.ray_shard_hook))
        if j.synthetic:
            intelligibility: dict[str, Any] = {"measured": False, "reason": "synthetic checkpoint (random weights)",
                                               "note": SYNTHETIC_NOTE}
        else:
            waves = {"artifact": art_waves} if ref.asr is not None else {"artifact": art_waves, "reference": ref.waves}
            intelligibility = score_intelligibility(
                j.sentences, waves, cfg.asr, cfg.asr_model, cfg.threads, cfg.show,
                transcriber=shards.transcriber(cfg.asr, cfg.asr_model) if shards else None, reference_scores=ref.asr,
            )
        log.info("measuring teacher-forced fidelity against %s", j.reference)
        fid_sentences = min(cfg.fidelity_sentences, len(j.sentences))
        with quiet_logger(enabled=j.synthetic):
            if shards is None:
                fidelity, rows = _fidelity(j, cfg, ref.trajectories)
            else:  # the shards return corpus figures only: no per-sentence fidelity rows
                fidelity, rows = shards.fidelity(j.corpus, fid_sentences, cfg.fidelity_steps, cfg.seed), None
        return CorpusFigures(intelligibility, fidelity, rows, shards.describe() if shards else None)


def _hear(j: Judged, cfg: EvaluateConfig, art_waves: Waves, ref_waves: Waves) -> dict[str, Any]:
    """The report's speaker / naturalness / streaming / listen sections and the listen files."""

    texts = {f"{i + 1:03d}": t for i, t in enumerate(j.sentences)}
    clone = None
    if cfg.clone_reference is not None:
        log.info("voice cloning from %s with %s", cfg.clone_reference, j.artifact)
        with quiet_logger(enabled=j.synthetic):
            clone = listening.clone_waves(j.artifact, j.sentences, cfg.clone_reference, cfg.clone_transcript,
                                          max_new_token=cfg.max_new_token, seed=cfg.seed, threads=cfg.threads,
                                          provider=j.provider)
    log.info("scoring speaker similarity and DNSMOS of %d sentences against the fp32 reference's audio", len(texts))
    speaker = listening.speaker_section(art_waves, ref_waves, texts, synthetic=j.synthetic, clone=clone)
    naturalness = listening.naturalness_section(art_waves, ref_waves, texts, synthetic=j.synthetic, threads=cfg.threads)
    log.info("measuring stream seams on %d sentence(s)", min(cfg.seam_sentences, len(j.sentences)))
    with quiet_logger(enabled=j.synthetic):
        streaming = seams.measure_seams(j.artifact, j.sentences[:cfg.seam_sentences], max_new_token=cfg.max_new_token,
                                        seed=cfg.seed, threads=cfg.threads, provider=j.provider,
                                        lookahead_frames=cfg.seam_lookahead)
    listen, files = listening.listen_files(art_waves, ref_waves, texts, str(j.art_desc["variant"]),
                                           cfg.listen_sentences)
    return {"speaker": speaker, "naturalness": naturalness, "streaming": streaming, "listen": listen, "files": files}


def bucket_settings(cfg: EvaluateConfig, provider: str, synthetic: bool,
                    score: Callable[[list[str], dict[str, Any]], dict[str, Any]] | None = None) -> BucketSettings:
    """How the length buckets are measured (the same for the shared reference run and each evaluation)."""
    return BucketSettings(per_bucket=cfg.bucket_sentences, max_new_token=cfg.max_new_token,
                          fidelity_steps=cfg.fidelity_steps, seed=cfg.seed, threads=cfg.threads,
                          provider=provider, synthetic=synthetic, score=score)


def serving_sections(j: Judged, cfg: EvaluateConfig, metrics: dict[str, float | None],
                     waived: dict[str, str], shared_buckets: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's ``buckets`` (per length bucket, the routing table's input) and ``phrase_cache`` sections."""

    log.info("measuring per length bucket (%d sentences each) against %s", cfg.bucket_sentences, j.reference)
    settings = bucket_settings(cfg, j.provider, j.synthetic,
                               score=lambda texts, waves: score_intelligibility(texts, waves, cfg.asr, cfg.asr_model,
                                                                                cfg.threads, False))
    with quiet_logger(enabled=j.synthetic):
        buckets = measure_buckets(
            j.artifact, j.reference, load_corpus(cfg.corpus).sentences, CorpusGate(j.gate, metrics, waived),
            settings=settings, shared=shared_buckets, replay=j.replay_sessions(cfg.threads))
        phrase_cache = None
        if cfg.cache_phrases:

            phrase_cache = measure_cache_effect(j.artifact, shipped_phrases()[:cfg.cache_phrases],
                                                max_new_token=cfg.max_new_token, seed=cfg.seed, threads=cfg.threads,
                                                provider=j.provider)
    return {"buckets": buckets, "phrase_cache": phrase_cache}


def evaluate_artifact(
    artifact: str | os.PathLike[str],
    reference: str | os.PathLike[str],
    config: EvaluateConfig | str | os.PathLike[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Evaluate `artifact` against the FP32 `reference` as `config` says; write reports to `config.out`.

    `config` is an `EvaluateConfig`; the shorthand `evaluate_artifact(art, ref, CORPUS, **options)`
    (options: EvaluateConfig's fields) builds one. Returns the sealed report dict (see
    report_schema.py); ``report["passed"]`` is the gate's verdict.
    """

    if not isinstance(config, EvaluateConfig):
        config = EvaluateConfig(**({"corpus": config} if config is not None else {}), **options)
    elif options:
        config = dataclasses.replace(config, **options)
    cfg = config
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    j = prepare(Path(artifact), Path(reference), cfg)
    t_start = time.perf_counter()
    log.info("evaluating %s (%s) against %s on %d sentences of %s", j.artifact, j.art_desc["variant"],
             j.reference, len(j.sentences), j.corpus.name)
    # Latency (and the audio for ASR): the reference's side first, then the artifact, same settings.
    ref = reference_side(j, cfg)
    latency, memory, art_waves = measure_latency(j, cfg, ref)
    figures = corpus_phase(j, cfg, ref, art_waves)
    hearing = _hear(j, cfg, art_waves, ref.waves)
    report = report_body(j, cfg, ref, figures, latency, hearing, memory)
    metrics, reasons = flat_metrics(report)
    waived = waivers(j, metrics, reasons)
    verdict = judge(j.gate, metrics, waived=waived, reasons=reasons, integrity=j.art_desc["manifest_mismatches"])
    notes = report_notes(j, cfg, ref, figures.distributed)
    report.update(serving_sections(j, cfg, metrics, waived, ref.buckets))
    report["metrics"] = metrics
    report["intervals"], report["sentences"] = intervals_mod.build(report, figures.fidelity_rows)
    # the [regression] tolerances travel with the report: a build and a later `publish` of it judge alike
    report["gate"] = {**verdict, "thresholds": {f"{r[1]}_{r[2]}": r[3] for r in j.gate["rules"]},
                      "regression": j.gate["regression"]}
    report["passed"] = verdict["passed"]
    report["headline"] = headline(j.art_desc["variant"], verdict["passed"], metrics)
    report["notes"] = notes
    report["timing"] = {"evaluate_seconds": time.perf_counter() - t_start}
    if cfg.out is not None:
        relative_folders(report, Path(cfg.out))
    report = seal(report)
    if cfg.out is not None:
        write_reports(report, Path(cfg.out), files=hearing["files"])
    failed = ", ".join(verdict["failed"]) or "none"
    log.info("gate %s for %s (failed: %s)", "PASSED" if report["passed"] else "FAILED", j.artifact, failed)
    return report
