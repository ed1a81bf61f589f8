"""The evaluation report's assembly: the sections evaluate_artifact writes around its measurements
(the judged artifacts' identity, the flat gate metrics, the memory section, the body in its order,
the waivers and the notes) and the folders it names made relative. report_schema seals, checks and
writes what this assembles; evaluate.evaluate runs the measurements.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chattts_forge.artifact import ArtifactMeta, Fidelity
from chattts_forge.evaluate.listening import HEARING_METRICS, SYNTHETIC_REASON
from chattts_forge.evaluate.report_schema import REPORT_SCHEMA
from chattts_forge.evaluate.search_report import auto_search_summary
from chattts_forge.folder_files import hash_tree
from chattts_forge.fsutil import portable_path, recorded_path
from chattts_forge.gate import intelligibility_waivers
from chattts_forge.integrity import verify_files
from chattts_forge.runtime.machine import machine_info
from chattts_forge.versions import library_versions, toolchain_info

if TYPE_CHECKING:  # evaluate.evaluate imports this module: its types for annotations only
    from chattts_forge.evaluate.evaluate import CorpusFigures, EvaluateConfig, Judged
    from chattts_forge.evaluate.reference_run import ReferenceRun

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

def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def latency_ratios(art: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    return {
        "rtf_p50": _ratio(art["rtf"]["p50"], base["rtf"]["p50"]),
        "rtf_p95": _ratio(art["rtf"]["p95"], base["rtf"]["p95"]),
        "seconds_per_step_p50": _ratio(art["seconds_per_step"]["p50"], base["seconds_per_step"]["p50"]),
        "speedup_p50": _ratio(base["rtf"]["p50"], art["rtf"]["p50"]),
        "load_seconds": _ratio(art["load_seconds"], base["load_seconds"]),
    }

def report_body(j: Judged, cfg: EvaluateConfig, ref: ReferenceRun, figures: CorpusFigures,
                latency: dict[str, Any], hearing: dict[str, Any], memory: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The report's measured sections, in their order (the gate, buckets and seal come after)."""
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
