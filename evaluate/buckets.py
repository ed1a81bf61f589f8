"""Per-length evaluation: fidelity, intelligibility and latency per length bucket of the held-out corpus.

Quantization error grows with what is spoken, so one verdict over the whole corpus hides where a
variant is good enough. `measure_buckets` sorts the held-out corpus into the gate's length buckets
(`gate["buckets"]`: default <= 10, 11-40, > 40 normalised characters, see runtime.router), takes the
first `per_bucket` sentences of each, and measures on them:

- latency of the artifact and of the FP32 reference (each sentence synthesized alone, after one
  warm-up run of each pipeline before its first bucket; same speakers, seeds and token budget as the
  whole-corpus latency);
- teacher-forced fidelity against the reference (`measure_fidelity` on the bucket's sentences);
- intelligibility through the ASR when it can be measured (not on synthetic checkpoints);
- the gate's verdict with the bucket's rules (the gate's rules, [buckets.NAME] overriding), under the
  same waivers as the whole-corpus gate. Metrics a bucket does not measure on its own (size, memory,
  first audio, the PyTorch ratio) are the whole corpus's.

The FP32 reference's side of every bucket (its timing, its audio, the FP32 runs fidelity replays) is
the same for every variant of a build: `reference_buckets` measures it once in the build's shared
reference run (evaluate.reference_run), and `measure_buckets` reads it from there (`shared`) for the
buckets whose sentences and settings it was measured with, measuring the rest itself.

The bucket verdicts do not change the report's own `passed` (a variant fit for short texts only is
still published); the build's routing table (publish.routing) is made from them.

Report section ``buckets``::

    {"length": str, "per_bucket": int, "definition": [{"name", "min_chars", "max_chars"}],
     "results": {name: {"name", "min_chars", "max_chars", "sentences": [str], "chars": [int],
                        "latency": {"artifact", "reference", "ratio_vs_reference"} | None,
                        "fidelity": {...} | None, "intelligibility": {...}, "metrics": {...},
                        "gate": {"passed", "checks", "failed", "waived"} | None, "passed": bool | None,
                        "note": str | None}}}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import Fidelity
from chattts_forge.calibration_data.corpus import Corpus
from chattts_forge.evaluate.report_record import BucketsSection
from chattts_forge.gate import intelligibility_waivers, judge
from chattts_forge.log import get_logger
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.router import LENGTH_DEFINITION, Bucket, text_length
from chattts_forge.runtime.timing import percentiles, rtf

log = get_logger(__name__)

# Metrics measured per bucket; every other metric of the gate is the whole corpus's.
BUCKET_METRICS = ("wer", "cer", "wer_delta", "cer_delta", "code_agreement", "code_agreement_stream", "code_kl",
                  "code_kl_stream", "hidden_cosine", "hidden_cosine_min", "mel_snr_db", "mel_lsd_db", "rtf_p50",
                  "rtf_p95", "rtf_p99", "rtf_ratio_vs_reference")


def assign_buckets(sentences: list[str], buckets: list[Bucket], normalize: Any, per_bucket: int) -> dict[str, list[tuple[str, int]]]:
    """The first `per_bucket` (sentence, length) of each bucket, in corpus order."""
    chosen: dict[str, list[tuple[str, int]]] = {b.name: [] for b in buckets}
    for s in sentences:
        try:
            length = text_length(normalize(s))
        except Exception:  # noqa: BLE001 - an unspeakable corpus line belongs to no bucket
            continue
        for b in buckets:
            if b.holds(length) and len(chosen[b.name]) < per_bucket:
                chosen[b.name].append((s, length))
        if all(len(v) >= per_bucket for v in chosen.values()):
            break
    return chosen


def time_sentences(pipe: Any, sentences: list[str], max_new_token: int, seed: int,
                   warm: bool = True) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, int]]]:
    """Each sentence synthesized alone (after one warm-up run, unless `warm` is False: the pipeline
    already synthesized, the previous bucket): per-utterance seconds and RTF."""
    def params(i: int) -> SynthParams:
        return SynthParams(code=InferCodeParams(spk_emb=pipe.random_speaker(seed + i), seed=seed + i,
                                                max_new_token=max_new_token))

    if warm:
        pipe.synthesize(sentences[0], params(0))
    utterances, waves = [], {}
    for i, text in enumerate(sentences):
        t0 = time.perf_counter()
        [res] = pipe.synthesize(text, params(i))
        dt = time.perf_counter() - t0
        audio = res.wav.shape[-1] / res.sample_rate
        waves[f"{i + 1:03d}"] = (res.wav, res.sample_rate)
        utterances.append({"text": text, "seconds": dt, "audio_seconds": audio, "steps": int(res.codes.shape[0]),
                           "rtf": rtf(dt, audio)})
    rtfs = [u["rtf"] for u in utterances if u["rtf"] is not None]
    return {"utterances": utterances, "rtf": percentiles(rtfs),
            "seconds": percentiles([u["seconds"] for u in utterances])}, waves


@dataclass(frozen=True)
class BucketSettings:
    """How the buckets are measured: `per_bucket` sentences each, the whole-corpus evaluation's token
    budgets, seed, threads and provider; `synthetic`: no ASR (random weights make noise);
    `score(sentences, waves)`: evaluate's ASR scorer (None: intelligibility not measured)."""

    per_bucket: int = 4
    max_new_token: int = 96
    fidelity_steps: int = 48
    seed: int = 0
    threads: int | None = 2
    provider: str = "cpu"
    synthetic: bool = True
    score: Callable[[list[str], dict[str, Any]], dict[str, Any]] | None = None


@dataclass
class BucketReference:
    """The FP32 reference's side of one bucket: its sentences, timing record, audio and FP32 runs."""

    sentences: list[str]
    latency: dict[str, Any]
    waves: dict[str, tuple[np.ndarray, int]]
    trajectories: list[Any]
    settings: dict[str, Any]


@dataclass(frozen=True)
class CorpusGate:
    """The whole-corpus gate the buckets are judged under: the gate, its metrics and its waivers."""

    gate: dict[str, Any]
    metrics: dict[str, float | None]  # a bucket takes those it does not measure itself (BUCKET_METRICS)
    waived: dict[str, str]


def bucket_settings_key(st: BucketSettings) -> dict[str, Any]:
    """What the reference side of a bucket depends on besides its sentences."""
    return {"max_new_token": st.max_new_token, "fidelity_steps": st.fidelity_steps, "seed": st.seed,
            "threads": st.threads, "provider": st.provider}


def reference_buckets(reference: Path, sentences: list[str], gate: dict[str, Any],
                      settings: BucketSettings = BucketSettings()) -> dict[str, BucketReference]:
    """The FP32 reference's side of every bucket of `gate` (what `measure_buckets` reads as `shared`)."""
    from chattts_forge.quantize.fidelity import FidelitySettings, record_trajectories, recording_pipeline

    st = settings
    buckets = [Bucket(b["name"], b["min_chars"], b["max_chars"]) for b in gate["buckets"]]
    ref_pipe = Pipeline(reference, threads=st.threads, provider=st.provider)
    chosen = assign_buckets(sentences, buckets, ref_pipe.normalize, st.per_bucket)
    recorder = recording_pipeline(reference, st.threads)
    out: dict[str, BucketReference] = {}
    for b in buckets:
        texts = [t for t, _ in chosen[b.name]]
        if not texts:
            continue
        log.info("bucket %s (%s): the FP32 reference's timing and runs, %d sentences", b.name, b.describe(), len(texts))
        lat, waves = time_sentences(ref_pipe, texts, st.max_new_token, st.seed, warm=not out)  # warmed once
        recording = FidelitySettings(max_sentences=len(texts), max_new_token=st.fidelity_steps, seed=st.seed,
                                     threads=st.threads, progress=False)
        trajs = record_trajectories(reference, Corpus(name=f"bucket-{b.name}", sentences=texts), recording,
                                    pipe=recorder)
        out[b.name] = BucketReference(texts, lat, waves, trajs, bucket_settings_key(st))
    return out


def measure_buckets(
    artifact: Path,
    reference: Path,
    sentences: list[str],
    corpus_gate: CorpusGate,
    *,
    settings: BucketSettings = BucketSettings(),
    shared: dict[str, BucketReference] | None = None,
    replay: Any = None,
) -> dict[str, Any]:
    """The report's ``buckets`` section (see module docstring). `sentences`: the whole held-out corpus;
    `corpus_gate`: the whole-corpus gate, its metrics and waivers; `shared`: the reference
    side measured once for the build (`reference_buckets`), used where it fits; `replay`: the
    `ReplaySessions` of this artifact and reference already open (the whole-corpus fidelity's)."""
    from chattts_forge.quantize.fidelity import ReplaySessions, measure_fidelity, recording_pipeline

    st, gate = settings, corpus_gate.gate
    buckets = [Bucket(b["name"], b["min_chars"], b["max_chars"]) for b in gate["buckets"]]
    ref_pipe = Pipeline(reference, threads=st.threads, provider=st.provider)
    same = artifact.resolve() == reference.resolve()
    art_pipe = ref_pipe if same else Pipeline(artifact, threads=st.threads, provider=st.provider)
    chosen = assign_buckets(sentences, buckets, ref_pipe.normalize, st.per_bucket)
    results: dict[str, Any] = {}
    # every bucket's fidelity: the same sessions, loaded once (or the caller's)
    sessions: ReplaySessions | None = replay
    recorder: Any = None
    warmed: set[int] = set()  # pipelines already warmed up (by an earlier bucket's timing)

    def timed(pipe: Any, texts: list[str]) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, int]]]:
        first = id(pipe) not in warmed
        warmed.add(id(pipe))
        return time_sentences(pipe, texts, st.max_new_token, st.seed, warm=first)

    for b, spec in zip(buckets, gate["buckets"], strict=True):
        picked = chosen[b.name]
        record: dict[str, Any] = {**b.to_dict(), "sentences": [s for s, _ in picked], "chars": [n for _, n in picked],
                                  "latency": None, "fidelity": None, "intelligibility": {"measured": False},
                                  "metrics": {}, "gate": None, "passed": None, "note": None}
        if not picked:
            record["note"] = f"no held-out sentence of {b.describe()}: nothing to judge (routing falls back)"
            results[b.name] = record
            continue
        texts = record["sentences"]
        log.info("bucket %s (%s): %d sentences", b.name, b.describe(), len(texts))
        known = (shared or {}).get(b.name)
        if known is not None and (known.sentences != texts or known.settings != bucket_settings_key(st)):
            known = None
        ref_lat, ref_waves = (known.latency, known.waves) if known is not None else timed(ref_pipe, texts)
        art_lat, art_waves = (ref_lat, ref_waves) if same else timed(art_pipe, texts)
        ratio = (art_lat["rtf"]["p50"] / ref_lat["rtf"]["p50"]) if art_lat["rtf"]["p50"] and ref_lat["rtf"]["p50"] else None
        record["latency"] = {"artifact": art_lat, "reference": ref_lat, "ratio_vs_reference": ratio}
        if sessions is None:
            sessions = ReplaySessions(reference, artifact, st.threads)
        if recorder is None and known is None:
            recorder = recording_pipeline(reference, st.threads)
        fid = measure_fidelity(reference, artifact, corpus=Corpus(name=f"bucket-{b.name}", sentences=texts),
                               max_sentences=len(texts), max_new_token=st.fidelity_steps, seed=st.seed, threads=st.threads,
                               per_tensor=False, progress=False, sessions=sessions, recorder=recorder,
                               trajectories=None if known is None else known.trajectories)
        record["fidelity"] = fid
        if st.score is not None and not st.synthetic:
            record["intelligibility"] = st.score(texts, {"artifact": art_waves, "reference": ref_waves})
        else:
            record["intelligibility"] = {"measured": False, "reason": "synthetic checkpoint (random weights)"}
        metrics = bucket_metrics(fid, art_lat, ratio, record["intelligibility"], corpus_gate.metrics)
        # a bucket in one language leaves the other language's metric unmeasured
        bucket_waived = dict(corpus_gate.waived)
        if not st.synthetic:
            bucket_waived.update(intelligibility_waivers(metrics, False,
                                                         unmeasured="no sentence of that language in this bucket"))
        verdict = judge({**gate, "rules": spec["rules"]}, metrics, waived=bucket_waived)
        record["metrics"] = metrics
        record["gate"] = {k: verdict[k] for k in ("passed", "checks", "failed", "waived")}
        record["passed"] = verdict["passed"]
        log.info("bucket %s: gate %s (agreement %.3f, RTF p50 %.3f)", b.name, "PASSED" if verdict["passed"] else "FAILED",
                 metrics["code_agreement"] or 0.0, metrics["rtf_p50"] or 0.0)
        results[b.name] = record
    return {"length": LENGTH_DEFINITION, "per_bucket": st.per_bucket,
            "definition": [b.to_dict() for b in buckets], "results": results}


def bucket_metrics(fid: dict[str, Any], art_lat: dict[str, Any], ratio: float | None, intel: dict[str, Any],
                   overall_metrics: dict[str, float | None]) -> dict[str, float | None]:
    """A bucket's gate metrics: its own fidelity, timings and intelligibility (`BUCKET_METRICS`), the
    whole corpus's for the rest. The buckets judge gpt.onnx's fidelity figures (as they always have;
    the whole corpus judges the worse of gpt and gpt_fast)."""
    measured: dict[str, float | None] = {
        **Fidelity.from_dict(fid).gate_metrics(fused=False),
        "rtf_p50": art_lat["rtf"]["p50"], "rtf_p95": art_lat["rtf"]["p95"], "rtf_p99": art_lat["rtf"]["p99"],
        "rtf_ratio_vs_reference": ratio,
    }
    for key in ("wer", "cer", "wer_delta", "cer_delta"):
        measured[key] = intel.get(key) if intel.get("measured") else None
    return {**{k: v for k, v in overall_metrics.items() if k not in BUCKET_METRICS}, **measured}


def bucket_table_rows(section: BucketsSection) -> list[list[str]]:
    """Rows of the per-bucket table of the Markdown report."""
    rows = []
    for name, r in section.result_map().items():
        def fmt(key: str, spec: str = ".3f", m: dict[str, float | int | None] = r.metrics) -> str:
            v = m.get(key)
            return "-" if v is None else format(v, spec)

        verdict = "n/a" if r.passed is None else ("pass" if r.passed else "FAIL")
        rng = f"{r.min_chars}-{r.max_chars}" if r.max_chars is not None else f">= {r.min_chars}"
        rows.append([name, rng, str(len(r.sentences)), fmt("code_agreement"), fmt("hidden_cosine", ".4f"),
                     fmt("mel_snr_db", ".1f"), fmt("rtf_p50"), fmt("rtf_ratio_vs_reference", ".2f"), verdict])
    return rows
