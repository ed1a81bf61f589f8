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
live in `report_schema`; `report.write_reports` writes it with its Markdown and HTML renderings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, ArtifactMeta, Fidelity
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.evaluate import intervals as intervals_mod
from chattts_forge.evaluate import latency as latency_mod
from chattts_forge.evaluate import textnorm
from chattts_forge.evaluate.buckets import BucketSettings, CorpusGate, measure_buckets
from chattts_forge.evaluate.evaluate_config import EvaluateConfig
from chattts_forge.evaluate.listening import HEARING_METRICS, SYNTHETIC_REASON
from chattts_forge.evaluate.reference_run import ReferenceRun
from chattts_forge.evaluate.search_report import auto_search_summary
from chattts_forge.evaluate.serving import measure_cache_effect
from chattts_forge.evaluate.step_ratio import interleaved_step_ratio
from chattts_forge.folder_files import hash_tree
from chattts_forge.fsutil import portable_path, recorded_path
from chattts_forge.gate import intelligibility_waivers, judge, load_gate
from chattts_forge.integrity import verify_files
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.runtime.machine import machine_info
from chattts_forge.runtime.providers import resolve_provider

log = get_logger(__name__)

TINY_LATENCY_REASON = (
    "tiny synthetic checkpoint: its timings are call overhead, not model compute, so speed ratios are noise"
)
# Gate metrics that are timings (waived on tiny checkpoints).
LATENCY_METRICS = ("rtf_p50", "rtf_p95", "rtf_p99", "first_audio_seconds", "rtf_ratio_vs_reference",
                   "rtf_ratio_vs_pytorch")
SYNTHETIC_NOTE = (
    "Intelligibility cannot be measured: the checkpoint is synthetic (random weights), so its speech "
    "is noise for any ASR. The WER/CER thresholds are waived and the gate decides on fidelity against "
    "the FP32 reference instead."
)
SYNTHETIC_HEARING_NOTE = (
    "Speaker similarity (SIM) and DNSMOS are synthetic-only: the checkpoint's random weights make noise, so "
    "they describe noise, not a voice. They are shown and waived like WER; stream seams are measured and gated "
    "(they compare the variant's own streamed and whole-text audio)."
)
CLONE_MISSING = "no cloning recording was given (evaluate_artifact(clone_reference=WAV))"
Waves = dict[str, tuple[np.ndarray, int]]  # utterance id "001", ... -> (waveform, sample rate)




def relative_folders(report: dict[str, Any], out: Path) -> None:
    """The folders a report names (the artifact, its reference, their checkpoint) made relative to the
    report's own folder `out`, as artifact.json records its paths: a build's reports then hold the
    same bytes wherever the build sits, and never name the build machine's folders."""
    def rel(value: Any) -> Any:
        return portable_path(value, out) if isinstance(value, str) and Path(value).is_absolute() else value

    for side in ("artifact", "reference"):
        desc = report.get(side) or {}
        desc["dir"] = rel(desc.get("dir"))
        if isinstance(desc.get("source"), dict) and desc["source"].get("asset_dir"):
            desc["source"]["asset_dir"] = rel(desc["source"]["asset_dir"])
    fidelities = [report.get("fidelity")] + [r.get("fidelity") for r in
                                             ((report.get("buckets") or {}).get("results") or {}).values()]
    for fid in fidelities:
        if isinstance(fid, dict) and fid.get("reference"):
            fid["reference"] = rel(fid["reference"])
    for record in (report.get("latency") or {}).values():
        if isinstance(record, dict) and record.get("artifact"):
            record["artifact"] = rel(record["artifact"])


def describe_artifact(path: Path) -> dict[str, Any]:
    """Identity of an artifact folder: every file's sha256/bytes and its artifact.json summary."""
    meta = ArtifactMeta.load(path)
    hashed = hash_tree(path)
    files = {rel: {"sha256": e.sha256, "bytes": e.bytes} for rel, e in hashed.items()}
    mismatches = [m.describe() for m in verify_files(path, meta, hashed=hashed).mismatches]
    source = dict(meta.source or {})
    if source.get("asset_dir"):  # recorded relative to the artifact folder
        source["asset_dir"] = str(recorded_path(source["asset_dir"], path))
    return {
        "dir": str(path.resolve()),
        "name": meta.name,
        "variant": meta.variant,
        "files": files,
        "bytes_total": sum(f["bytes"] for f in files.values()),
        "manifest_mismatches": mismatches,
        "source": {k: source.get(k) for k in ("kind", "preset", "seed", "asset_dir") if k in source},
        "precisions": {name: comp.get("precision") for name, comp in meta.components.items()},
        "quantization_method": (meta.quantization or {}).get("method"),
        # `quantize --method auto`'s candidates (the report shows them as a Pareto table).
        "quantization_search": auto_search_summary(meta.quantization),
    }


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
    from chattts_forge.evaluate.asr import get_backend
    from chattts_forge.evaluate.score import score_hypotheses, score_waveforms

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
    from chattts_forge.evaluate.intervals import fidelity_sentences

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


def flat_metrics(report: dict[str, Any]) -> tuple[dict[str, float | None], dict[str, str]]:
    """The gate's metric values (see gate.METRICS) from a report in progress, and why any is missing."""
    m: dict[str, float | None] = {}
    why: dict[str, str] = {}
    intel = report["intelligibility"]
    for key in ("wer", "cer", "wer_delta", "cer_delta"):
        m[key] = intel.get(key) if intel.get("measured") else None
        if m[key] is None:
            why[key] = intel.get("reason") or f"no {'Mandarin' if 'cer' in key else 'English'} sentence in the corpus"
    if report.get("fidelity"):
        m.update(Fidelity.from_dict(report["fidelity"]).gate_metrics())  # the worse of gpt / gpt_fast
    lat = report["latency"]
    art, pt = lat["artifact"], lat.get("pytorch")
    m["rtf_p50"], m["rtf_p95"], m["rtf_p99"] = (art["rtf"][k] for k in ("p50", "p95", "p99"))
    m["first_audio_seconds"] = art["first_audio_seconds"]["p50"]
    m["rtf_ratio_vs_reference"] = lat["ratios"]["vs_reference"].get("rtf_p50")
    m["rtf_ratio_vs_pytorch"] = (lat["ratios"].get("vs_pytorch") or {}).get("rtf_p50")
    if pt is None:
        why["rtf_ratio_vs_pytorch"] = "no PyTorch baseline was run (pass --baseline-checkpoint)"
    m["size_ratio_vs_reference"] = report["size"]["ratio_vs_reference"]
    m["size_mb"] = report["size"]["artifact_bytes"] / 1e6
    m.update(memory_metrics(report.get("memory"), why))
    speaker, nat = report.get("speaker") or {}, report.get("naturalness") or {}
    m["similarity"] = speaker.get("mean") if speaker.get("measured") else None
    m["similarity_worst"] = speaker.get("min") if speaker.get("measured") else None
    m["clone_similarity"] = (speaker.get("clone") or {}).get("mean")
    m["ovrl_drop"] = nat.get("ovrl_drop") if nat.get("measured") else None
    for key, section in (("similarity", speaker), ("similarity_worst", speaker), ("ovrl_drop", nat)):
        if m[key] is None:
            why[key] = section.get("reason") or "not measured"
    if m["clone_similarity"] is None:
        why["clone_similarity"] = speaker.get("reason") if not speaker.get("measured") else CLONE_MISSING
    modes = (report.get("streaming") or {}).get("modes") or {}
    m["stream_snr_db"] = (modes.get("default") or {}).get("snr_db_min")
    m["stream_lookahead_snr_db"] = (modes.get("lookahead") or {}).get("snr_db_min")
    for key in ("stream_snr_db", "stream_lookahead_snr_db"):
        if m[key] is None:
            why[key] = (report.get("streaming") or {}).get("reason") or "stream seams were not measured"
    from chattts_forge.evaluate.seams import recorded_lookahead_snr_db

    m["stream_recorded_lookahead_snr_db"], recorded_why = recorded_lookahead_snr_db(report.get("streaming"))
    if recorded_why is not None:
        why["stream_recorded_lookahead_snr_db"] = recorded_why
    return m, why


def memory_metrics(memory: dict[str, Any] | None, why: dict[str, str]) -> dict[str, float | None]:
    """The gate's memory metrics from the report's ``memory`` section (`memory_section`): batch-1 and
    batch-8 peak RSS, resident size after load, and batch-1 peak over the FP32 reference's; a missing
    one gets its reason in `why`."""
    memory = memory or {}
    art = memory.get("artifact") or {}
    by_batch = art.get("peak_rss_mb_by_batch") or {}
    out = {"peak_rss_mb": by_batch.get("1"), "peak_rss_b8_mb": by_batch.get("8"),
           "rss_after_load_mb": art.get("after_load_mb"),
           "peak_rss_ratio_vs_reference": (memory.get("ratio_vs_reference") or {}).get("1")}
    reason = (f"the memory probe failed: {art['error']}" if art.get("error") else
              "the memory probe did not run" if not art else None)
    for key, value in out.items():
        if value is None:
            why[key] = reason or ("the FP32 reference's memory probe did not run or failed"
                                  if key == "peak_rss_ratio_vs_reference" else "not measured at this batch size")
    return out


MEMORY_DEFINITION = (
    "Each variant measured in a process of its own, as `chattts-forge bench` measures it: load + a 16-step warm-up, "
    "then its text at a fixed number of steps a row (EOS masked) at batch 1, then at batch 8; peak_rss_mb_by_batch[B] "
    "is the process's peak RSS (kernel VmHWM, MiB) through load and batch B, after_load_mb its resident size once "
    "loaded; ratio_vs_reference: the same figure over the FP32 reference's. `command` repeats it from the version "
    "folder (docs/bench.md, \"Memory\")."
)


def memory_section(art_lat: dict[str, Any], ref_lat: dict[str, Any]) -> dict[str, Any] | None:
    """The report's ``memory`` section from the artifact's and the reference's latency records (their
    fresh-process probes, latency.LatencyConfig.isolate_memory); None when neither was probed."""
    art, ref = art_lat.get("memory"), ref_lat.get("memory")
    if art is None and ref is None:
        return None
    a, r = (art or {}).get("peak_rss_mb_by_batch") or {}, (ref or {}).get("peak_rss_mb_by_batch") or {}
    return {"artifact": art, "reference": ref, "definition": MEMORY_DEFINITION,
            "ratio_vs_reference": {b: _ratio(a[b], r.get(b)) for b in sorted(a, key=int)}}


def resolve_baseline(
    requested: str | os.PathLike[str] | None, art: dict[str, Any], ref: dict[str, Any]
) -> tuple[Path | None, str | None]:
    """(checkpoint to time ChatTTS's PyTorch pipeline on, or None; a note when it is skipped)."""
    import importlib.util

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


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ratios(art: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    return {
        "rtf_p50": _ratio(art["rtf"]["p50"], base["rtf"]["p50"]),
        "rtf_p95": _ratio(art["rtf"]["p95"], base["rtf"]["p95"]),
        "seconds_per_step_p50": _ratio(art["seconds_per_step"]["p50"], base["seconds_per_step"]["p50"]),
        "speedup_p50": _ratio(base["rtf"]["p50"], art["rtf"]["p50"]),
        "load_seconds": _ratio(art["load_seconds"], base["load_seconds"]),
    }



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
    from chattts_forge.calibration_data.corpus import load_corpus

    for p, what in ((artifact, "artifact"), (reference, "reference")):
        if not p.is_dir():
            raise NotFound(f"{what} folder {p} does not exist")
    cfg.check()
    if cfg.ray is not None:
        from chattts_forge.raycluster import import_ray

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
    from chattts_forge.evaluate.reference_run import measure_reference_run, read_reference_run, run_settings

    if cfg.reference_run is not None:
        run = read_reference_run(Path(cfg.reference_run), run_settings(j.ref_desc["files"], j.corpus, cfg, j.provider))
        log.info("reference run read from %s (measured once for the build)", cfg.reference_run)
        return run
    return measure_reference_run(j.reference, j.ref_desc, j.art_desc, j.corpus, cfg, j.synthetic, score_asr=False)


def latency_section(j: Judged, cfg: EvaluateConfig, ref: ReferenceRun
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
            from chattts_forge.evaluate.latency_run import latency_settings, read_latency_pair

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
            "vs_reference": latency_mod.interleaved_ratios(_ratios(art_lat, ref_lat), pair),
            "vs_pytorch": _ratios(art_lat, pt_lat) if pt_lat else None,
            "reference_vs_pytorch": _ratios(ref_lat, pt_lat) if pt_lat else None,
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
            from chattts_forge.evaluate.ray_shards import RayShards

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
    from chattts_forge.evaluate import listening, seams

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


def report_body(j: Judged, cfg: EvaluateConfig, ref: ReferenceRun, figures: CorpusFigures,
                latency: dict[str, Any], hearing: dict[str, Any], memory: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The report's measured sections, in their order (the gate, buckets and seal come after)."""
    from chattts_forge.evaluate.report_schema import REPORT_SCHEMA
    from chattts_forge.versions import library_versions, toolchain_info

    art_desc, ref_desc, distributed = j.art_desc, j.ref_desc, figures.distributed
    return {
        "schema": REPORT_SCHEMA,
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "artifact": art_desc,
        "reference": ref_desc,
        "corpus": {**j.corpus.describe(), "sentences_used": len(j.sentences),
                   "spec": str(cfg.corpus)},
        "settings": {"max_sentences": cfg.max_sentences, "max_new_token": cfg.max_new_token, "threads": cfg.threads,
                     "bucket_sentences": cfg.bucket_sentences, "cache_phrases": cfg.cache_phrases,
                     "seed": cfg.seed, "batch_sizes": list(cfg.batch_sizes), "fidelity_sentences": cfg.fidelity_sentences,
                     "fidelity_steps": cfg.fidelity_steps, "asr": cfg.asr,
                     "asr_model": str(cfg.asr_model) if cfg.asr_model else None,
                     # the folder's name, never this machine's path (a report travels with the artifact)
                     "baseline_checkpoint": Path(ref.baseline_checkpoint).name if ref.baseline_checkpoint else None},
        "intelligibility": figures.intelligibility,
        "fidelity": figures.fidelity,
        "speaker": hearing["speaker"],
        "naturalness": hearing["naturalness"],
        "streaming": hearing["streaming"],
        "listen": hearing["listen"],
        "latency": latency,
        **({"memory": memory} if memory is not None else {}),
        "size": {
            "artifact_bytes": art_desc["bytes_total"],
            "reference_bytes": ref_desc["bytes_total"],
            "ratio_vs_reference": art_desc["bytes_total"] / ref_desc["bytes_total"],
        },
        "machine": {**machine_info(cfg.threads, j.provider), **({"ray": distributed} if distributed else {})},
        "versions": library_versions(),
        "toolchain": toolchain_info(),
    }


def waivers(j: Judged, metrics: dict[str, float | None], reasons: dict[str, str]) -> dict[str, str]:
    """What the gate does not judge here, and why: intelligibility (and hearing) on synthetic
    checkpoints, a language the corpus lacks, timings on tiny checkpoints."""
    waived = intelligibility_waivers(metrics, j.synthetic, reasons)
    if j.synthetic:
        waived.update(dict.fromkeys(HEARING_METRICS, SYNTHETIC_REASON))
    from chattts_forge.evaluate.seams import NO_RECORDED_LOOKAHEAD

    if metrics.get("stream_recorded_lookahead_snr_db") is None and reasons.get(
            "stream_recorded_lookahead_snr_db") == NO_RECORDED_LOOKAHEAD:
        waived["stream_recorded_lookahead_snr_db"] = NO_RECORDED_LOOKAHEAD  # older artifacts stream exactly
    if j.tiny:
        # A tiny model's step takes well under a millisecond: its timings are Python and onnxruntime
        # call overhead, so a ratio between two of them is machine noise, not a property of the variant.
        for key in LATENCY_METRICS:
            if key in metrics:
                waived[key] = TINY_LATENCY_REASON
    return waived


def report_notes(j: Judged, cfg: EvaluateConfig, ref: ReferenceRun, distributed: dict[str, Any] | None) -> list[str]:
    """The report's notes: what was not measured or judged, and how the run was arranged."""
    notes = []
    if j.synthetic:
        notes += [SYNTHETIC_NOTE, SYNTHETIC_HEARING_NOTE]
    if ref.baseline_note:
        notes.append(ref.baseline_note)
    if j.tiny:
        notes.append(f"Latency is measured and reported but not gated: {TINY_LATENCY_REASON}.")
    if distributed:
        notes.append(f"Fidelity and ASR ran on {len(distributed['workers'])} Ray worker(s) at {cfg.ray} ("
                     + ", ".join(f"{w['name']}: {w['hostname']} pid {w['pid']}" for w in distributed["workers"])
                     + f"); latency was measured in the evaluating process on {distributed['latency_measured_on']['hostname']}"
                     " before the workers started.")
    if cfg.reference_run is not None:
        from chattts_forge.evaluate.reference_run import reference_run_key, run_settings

        key = reference_run_key(run_settings(j.ref_desc["files"], j.corpus, cfg, j.provider))
        notes.append("The FP32 reference's latency run, its audio, the PyTorch baseline, the ASR of the reference's "
                     f"audio and the FP32 runs fidelity replays were measured once for the build (reference run {key}, "
                     "the sha256 of its settings) with these settings and shared by every variant's evaluation.")
    if cfg.latency_run is not None and not j.self_reference:
        notes.append("Latency: the artifact was timed against the FP32 reference in the build's latency run, in the same "
                     "interleaved rounds as the build's other variants (the reference synthesized once per round for "
                     "all of them; first audio and throughput once per side, in turn; memory: each variant in a "
                     "process of its own).")
    if j.self_reference:
        notes.append("The artifact is its own reference: its latency was measured once and serves as both "
                     "(ratio vs reference 1 by construction); fidelity is still measured (it checks the fused GPT graph, "
                     "when present, against the plain one).")
    for mismatch in j.art_desc["manifest_mismatches"]:
        notes.append(f"artifact file does not match its artifact.json: {mismatch}")
    return notes


def bucket_settings(cfg: EvaluateConfig, provider: str, synthetic: bool,
                    score: Callable[[list[str], dict[str, Any]], dict[str, Any]] | None = None) -> BucketSettings:
    """How the length buckets are measured (the same for the shared reference run and each evaluation)."""
    return BucketSettings(per_bucket=cfg.bucket_sentences, max_new_token=cfg.max_new_token,
                          fidelity_steps=cfg.fidelity_steps, seed=cfg.seed, threads=cfg.threads,
                          provider=provider, synthetic=synthetic, score=score)


def serving_sections(j: Judged, cfg: EvaluateConfig, metrics: dict[str, float | None],
                     waived: dict[str, str], shared_buckets: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's ``buckets`` (per length bucket, the routing table's input) and ``phrase_cache`` sections."""
    from chattts_forge.calibration_data.corpus import load_corpus

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
            from chattts_forge.calibration_data.phrases import shipped_phrases

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
    from chattts_forge.evaluate.report import write_reports
    from chattts_forge.evaluate.report_schema import headline, seal

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
    latency, memory, art_waves = latency_section(j, cfg, ref)
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
