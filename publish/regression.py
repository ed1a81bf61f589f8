"""The regression gate: every variant of a build against the same variant of the previous version.

The quality gate judges a variant against FP32 of the same build; this judges it against what users
run today: the same variant as published in the baseline version (by default the newest version of
the model in the artifacts folder; `--baseline vN` to choose one, `--no-baseline` to skip). A variant
the baseline version does not hold is compared with its newest copy in an older version.

Most figures are compared from records (`compare`), on the held-out sentences both reports measured
(paired by sentence text; the reports' ``sentences`` rows, evaluate.intervals, and their latency
records), with a 95% paired bootstrap interval (2000 resamples, seed 0), a pure function of the two
reports, each read as its typed record (evaluate.report_record.ReportRecord; the baseline's published
copy by `published_report`, where a section the report predates is UNSET):

- code agreement and KL (each against its own build's FP32, pooled over teacher-forced steps), mel
  SNR, SIM, DNSMOS OVRL and WER/CER (mean of the per-sentence figures): absolute deltas;
- RTF over its own build's FP32 (per-sentence RTF / FP32's, the median): a relative delta. Each ratio
  is of one run on one machine, so two builds on different machines stay comparable;
- first audio: the per-sentence first audio seconds (latency records them since issue 38; the median,
  reported, judged only with a tolerance) and the per-sentence first audio over its own build's FP32
  first audio of the same sentence, timed in turn (`first_audio_ratio_vs_reference`, judged;
  machine-neutral like the RTF ratio). A baseline recorded before per-sentence first audio gives the
  two medians, no interval, not judged;
- size (exact);
- batch-1 peak RSS over its own build's FP32's (`peak_rss_ratio_vs_reference`, since issue 50: each
  variant in a process of its own): a relative delta of one measurement per build, its interval the
  delta +-`MEMORY_REPEATABILITY` (what a fresh-process probe repeats within on one machine). A
  baseline measured before issue 50 has no such figure: not compared.

Two are measured now, by `compare_build_variant`:

- `rtf_vs_baseline`: the variant and the baseline's same variant timed in turn on this machine
  (evaluate.latency.retime_against: a few interleaved rounds, bounded in time), the median of the
  per-round RTF ratios with its 95% bootstrap interval over rounds; identical bytes are not timed
  (delta 0, ``identical``);
- the FP32 reference against the baseline's FP32: its figures against its own FP32 are trivially
  perfect, so this one is measured now (`fp32_against_baseline`: code agreement, KL, mel SNR, both
  replaying the baseline FP32's runs on the report's held-out corpus; not measured when the payloads
  are identical), reported in the FP32 record's ``fp32_against_baseline``, not judged.

A figure is a regression when its change is worse than the gate's ``[regression]`` tolerance over its
whole interval; an improvement when its whole interval is better by more than a tenth of the
tolerance (`_NOISE`); worse within the tolerance when its whole interval is worse by more than that;
otherwise noise ("same"). A figure the variant's own gate waived (timings on tiny synthetic checkpoints,
SIM/DNSMOS/WER on synthetic ones) is reported as waived. Beside the figures: what changed between
the two builds, from their records (checkpoint, toolchain, library versions, quantizer method and
options, calibration corpus, evaluation corpus, gate file).

The record (``regression`` in a published variant's manifest, schema `REGRESSION_SCHEMA`)::

    {"schema", "baseline": null | {"version", "variant", "manifest_sha256", "report_integrity"},
     "note" (why there is no baseline, when there is none),
     "figures": {figure: {"value", "baseline", "delta", "low", "high", "relative", "n", "how", "tolerance",
                          "worse_is", "status" ("regression"|"worse"|"same"|"improved"|"waived"|"not judged"),
                          "message"; rtf_vs_baseline also "identical" or "timing": {"artifact_rtf",
                          "baseline_rtf", "rounds", "stopped", "sentences", "seconds", "threads",
                          "max_new_token", "time_cap_s", "bound"}}},
     "changed": [{"what", "baseline", "now"}], "regressions": [figure], "improvements": [figure],
     "verdict" ("regression"|"no regression"|"no baseline"), "accepted": null | {"reason"},
     "already_published" (a refused variant whose bytes a version already holds: that version; driver only),
     "fp32_against_baseline" (FP32's record only: `fp32_against_baseline`)}
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from msgspec import UNSET

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.evaluate.latency_record import LatencyRecord
from chattts_forge.evaluate.report_record import ReportRecord, check_report, or_none
from chattts_forge.evaluate.report_schema import read_report
from chattts_forge.evaluate.report_sections import SentenceRow, SettingsSection
from chattts_forge.evaluate.stats import bootstrap, bootstrap_ratio_interval
from chattts_forge.gate import REGRESSION_FIGURES
from chattts_forge.publish.index import iter_variant_dirs, version_number
from chattts_forge.publish.manifest import (
    MANIFEST_NAME,
    REPORT_COPY_NAME,
    RESERVED_NAMES,
    build_manifest_core,
    load_manifest,
    manifest_files,
    read_json_document,
    source_fingerprint,
)
from chattts_forge.publish.regression_record import (
    REGRESSION_SCHEMA,
    Accepted,
    RegressionRecord,
    regression_builtins,
    regression_from_builtins,
)
from chattts_forge.runtime.router import FALLBACK_VARIANT

# how a figure is named in a verdict ("worse than v3's int8-static by 0.041 code agreement [...]")
LABELS = {"code_agreement": "code agreement", "code_kl": "code KL (nats)", "mel_snr_db": "dB mel SNR",
          "similarity": "SIM", "ovrl": "DNSMOS OVRL", "wer": "WER", "cer": "CER",
          "rtf_ratio_vs_reference": "RTF over its FP32", "rtf_vs_baseline": "RTF (re-timed against it here)",
          "first_audio_seconds": "first audio", "first_audio_ratio_vs_reference": "first audio over its FP32",
          "size_mb": "size", "peak_rss_ratio_vs_reference": "batch-1 peak RSS over its FP32"}
CONFIDENCE = 0.95
RESAMPLES = 2000
NO_BASELINE = "no baseline: the first version of this model in the artifacts folder"
# A change smaller than this fraction of a figure's tolerance, even over its whole interval, is counted
# as no change (an exact figure such as the size moves by a few bytes between two quantizer options).
_NOISE = 0.1


@dataclass(frozen=True)
class Baseline:
    """The version a build is compared with: {variant: its published folder} (in `version` or older)."""

    model: str
    version: str
    variants: dict[str, Path]


def model_versions(root: Path, model: str) -> list[str]:
    """The model's published versions, oldest first."""
    return sorted({d.parent.name for d in iter_variant_dirs(root) if d.parent.parent.name == model},
                  key=lambda v: (version_number(v), v))


def find_baseline(root: Path, model: str, requested: str | None = None) -> Baseline | None:
    """The baseline of a build of `model` into `root`: version `requested`, else the newest (None when the
    model has no published version). Each variant is its copy in that version or the newest older one."""
    versions = model_versions(root, model)
    if requested is not None:
        if requested not in versions:
            raise NotFound(f"--baseline {requested}: {model} has no such version in {root} "
                             f"(published: {', '.join(versions) or 'none'})")
        versions = versions[: versions.index(requested) + 1]
    if not versions:
        return None
    order = {v: i for i, v in enumerate(versions)}
    variants: dict[str, Path] = {}
    for d in iter_variant_dirs(root):  # oldest version first: a newer copy replaces an older one
        if d.parent.parent.name == model and d.parent.name in order:
            variants[d.name] = d
    return Baseline(model, versions[-1], variants)


# ---- per-sentence figures ----------------------------------------------------------------------


def _finite(x: Any) -> float | None:
    """A finite number as a float; None for anything else (None, UNSET: a figure not recorded)."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _rows(report: ReportRecord) -> dict[str, SentenceRow]:
    """{sentence text: its row} (texts identify a held-out sentence across builds; ids are positions).
    A report written before evaluate.intervals has no rows (UNSET): no sentence to pair."""
    rows = [] if report.sentences is UNSET else report.sentences
    return {r.text: r for r in rows if isinstance(r.text, str)}


def _rtf_over_fp32(report: ReportRecord) -> dict[str, float]:
    """{text: the sentence's RTF / its own build's FP32 RTF on the same sentence}."""
    timed, reference = report.latency.timed("artifact"), report.latency.timed("reference")
    ref = {u.text: _finite(u.rtf) for u in reference.utterances} if reference else {}
    out = {}
    for u in timed.utterances if timed else []:
        mine, theirs = _finite(u.rtf), ref.get(u.text)
        if mine is not None and theirs:
            out[u.text] = mine / theirs
    return out


def _first_audio(record: LatencyRecord | None) -> dict[str, float]:
    """{text: first audio seconds} of one latency record (its per-sentence runs; none before issue 38's
    item 2 recorded them)."""
    samples = record.first_audio_seconds.sample_list() if record and record.first_audio_seconds else []
    return {s.text: value for s in samples if (value := _finite(s.seconds)) is not None}


def _first_audio_over_fp32(report: ReportRecord) -> dict[str, float]:
    """{text: the sentence's first audio / its own build's FP32 first audio, timed in turn in the same run}."""
    mine, ref = _first_audio(report.latency.timed("artifact")), _first_audio(report.latency.timed("reference"))
    return {t: v / ref[t] for t, v in mine.items() if ref.get(t)}


def _pooled(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (values * weights).sum(axis=-1) / weights.sum(axis=-1)


def _mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return values.mean(axis=-1)


def _median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.median(values, axis=-1)


# figure -> (the rows' field (SentenceRow) or _FROM_LATENCY's key, the statistic over sentences, how it is described)
_PER_SENTENCE: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray], str]] = {
    "code_agreement": ("code_agreement", _pooled, "pooled over teacher-forced steps"),
    "code_kl": ("code_kl", _pooled, "pooled over teacher-forced steps"),
    "mel_snr_db": ("mel_snr_db", _mean, "mean of per-sentence dB"),
    "similarity": ("similarity", _mean, "mean of per-sentence SIM"),
    "ovrl": ("ovrl", _mean, "mean of per-sentence OVRL"),
    "wer": ("wer", _mean, "mean of per-sentence WER"),
    "cer": ("cer", _mean, "mean of per-sentence CER"),
    "rtf_ratio_vs_reference": ("rtf_over_fp32", _median, "median of per-sentence RTF / own FP32's RTF"),
    "first_audio_seconds": ("first_audio", _median, "median of per-sentence first audio seconds"),
    "first_audio_ratio_vs_reference": ("first_audio_over_fp32", _median,
                                       "median of per-sentence first audio / own FP32's first audio"),
}
# per-sentence figures read from the latency records rather than the report's sentence rows
_FROM_LATENCY: dict[str, Callable[[ReportRecord], dict[str, float]]] = {
    "rtf_over_fp32": _rtf_over_fp32,
    "first_audio": lambda report: _first_audio(report.latency.timed("artifact")),
    "first_audio_over_fp32": _first_audio_over_fp32,
}


def _paired(new: np.ndarray, old: np.ndarray, w_new: np.ndarray, w_old: np.ndarray,
            stat: Callable[[np.ndarray, np.ndarray], np.ndarray], relative: bool) -> tuple[float, float, float]:
    """(delta, low, high): stat(new) - stat(old) (relative: / stat(old)), sentences resampled in pairs."""
    def delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a - b) / np.abs(b) if relative else a - b

    point = float(delta(stat(new, w_new), stat(old, w_old)))
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = bootstrap(lambda idx: delta(stat(new[idx], w_new[idx]), stat(old[idx], w_old[idx])), new.size,
                           confidence=CONFIDENCE, resamples=RESAMPLES, seed=0, finite_only=True)
    if bounds is None:
        return point, point, point
    return point, bounds[0], bounds[1]


def _sentence_figure(figure: str, new: ReportRecord, old: ReportRecord) -> dict[str, Any] | None:
    """A figure compared per held-out sentence, or None when the two reports share no measured sentence."""
    key, stat, how = _PER_SENTENCE[figure]
    relative = REGRESSION_FIGURES[figure][2] == "relative"
    if key in _FROM_LATENCY:
        a, b = _FROM_LATENCY[key](new), _FROM_LATENCY[key](old)
        pairs = [(a[t], b[t], 1.0, 1.0) for t in sorted(a) if t in b]
    else:
        ra, rb = _rows(new), _rows(old)
        pairs = []
        for text in sorted(ra):
            x, y = _finite(getattr(ra[text], key)), _finite(getattr(rb[text], key)) if text in rb else None
            if x is not None and y is not None:
                # both reports' step counts when both recorded them (evaluate.intervals); else one each
                wa, wb = (_finite(r.fidelity_steps) for r in (ra[text], rb[text]))
                pairs.append((x, y, wa, wb) if wa and wb else (x, y, 1.0, 1.0))
    if not pairs:
        return None
    arr = np.asarray(pairs, np.float64)
    delta, lo, hi = _paired(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], stat, relative)
    return {"value": float(stat(arr[:, 0], arr[:, 2])), "baseline": float(stat(arr[:, 1], arr[:, 3])),
            "delta": delta, "low": lo, "high": hi, "relative": relative, "n": len(pairs),
            "how": f"paired per sentence: {how}"}


# A fresh-process peak RSS repeats within ~2-3% on one machine (bench at full size, two runs each:
# 496/509, 600/611, 1089/1090 MB; docs/measurements/2026-12-01-epyc-vnni/memory): the half-width of the
# interval given to a memory figure, which has one measurement per build.
MEMORY_REPEATABILITY = 0.03
# figures with one value per report that are judged -> (half-width of their interval around the delta, how)
_POINT_JUDGED: dict[str, tuple[float, str]] = {
    "size_mb": (0.0, "bytes on disk (exact)"),
    "peak_rss_ratio_vs_reference": (MEMORY_REPEATABILITY, "one measurement per build, each side in a process of its "
                                    f"own; interval: the delta +-{MEMORY_REPEATABILITY:.0%}, the probe's repeatability"),
}


def _point_figure(figure: str, new: ReportRecord, old: ReportRecord) -> dict[str, Any] | None:
    """A figure with one value per report (first audio's median, the size, the memory ratio): no
    interval of its own; those of `_POINT_JUDGED` are judged on their delta within their stated noise."""
    a, b = _finite(new.metrics.get(figure)), _finite(old.metrics.get(figure))
    if a is None or b is None or b == 0:
        return None
    delta = (a - b) / abs(b)
    if figure in _POINT_JUDGED:
        noise, how = _POINT_JUDGED[figure]
        return {"value": a, "baseline": b, "delta": delta, "low": delta - noise, "high": delta + noise,
                "relative": True, "n": 0, "how": how}
    return {"value": a, "baseline": b, "delta": delta, "low": None, "high": None, "relative": True, "n": 0,
            "how": "median of the latency run (no per-run values recorded)"}


def _judge(figure: str, entry: dict[str, Any], tolerance: float | None, waived: dict[str, str],
           baseline_name: str) -> dict[str, Any]:
    what, better, _, waiver = REGRESSION_FIGURES[figure]
    sign = -1.0 if better == "higher" else 1.0  # worsening = sign * delta
    entry = {**entry, "tolerance": tolerance, "worse_is": "lower" if better == "higher" else "higher"}
    delta, lo, hi = entry["delta"], entry["low"], entry["high"]
    shown = _fmt_delta(entry)
    if waiver is not None and waiver in waived:
        return {**entry, "status": "waived", "message": f"{what}: {shown}; not judged ({waived[waiver]})"}
    if lo is None or hi is None:
        return {**entry, "status": "not judged", "message": f"{what}: {shown}; not judged (no interval)"}
    worst, best = sorted((sign * lo, sign * hi))[::-1]  # the worsening interval: [best, worst]
    if tolerance is not None and best > tolerance:
        status = "regression"
        def shown_abs(x: float) -> str:
            return f"{abs(x) * 100:.1f}%" if entry["relative"] else f"{abs(x):.3g}"
        msg = (f"worse than {baseline_name} by {shown_abs(delta)} {LABELS[figure]} "
               f"[{shown_abs(min(abs(lo), abs(hi)))}, {shown_abs(max(abs(lo), abs(hi)))}] "
               f"(tolerance {shown_abs(tolerance)})")
    elif worst < -_NOISE * (tolerance or 0.0):
        status, msg = "improved", f"{LABELS[figure]} better than {baseline_name}: {shown}"
    elif best > _NOISE * (tolerance or 0.0):
        status, msg = "worse", f"{LABELS[figure]} worse than {baseline_name} within the tolerance: {shown}"
    else:
        status, msg = "same", f"{LABELS[figure]} within noise of {baseline_name}: {shown}"
    return {**entry, "status": status, "message": msg}


def _fmt_delta(entry: dict[str, Any]) -> str:
    d = entry["delta"]
    text = f"{d * 100:+.1f}%" if entry["relative"] else f"{d:+.4g}"
    if entry["low"] is not None and entry["high"] is not None:
        lo, hi = entry["low"], entry["high"]
        text += f" [{lo * 100:+.1f}%, {hi * 100:+.1f}%]" if entry["relative"] else f" [{lo:+.4g}, {hi:+.4g}]"
    return text


# ---- what changed ------------------------------------------------------------------------------


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(_flat(f"{prefix}.{k}", value[k]))
        return out
    return {prefix: value}


def _provenance(manifest: dict[str, Any], report: ReportRecord) -> dict[str, Any]:
    """The records a build's difference is read from, flattened to `what -> value`."""
    quant = manifest.get("quantization") or {}
    gate, corpus = report.gate, report.corpus
    out: dict[str, Any] = {
        "checkpoint": source_fingerprint(manifest["source_checkpoint"])[:16],
        "toolchain version": (manifest.get("toolchain") or {}).get("version"),
        "toolchain commit": (manifest.get("toolchain") or {}).get("git_commit"),
        "quantizer method": quant.get("method"),
        "gate file": f"{gate.path} (sha256 {gate.sha256[:12]})",
        "evaluation corpus": f"{or_none(corpus.name)} (sha256 {str(or_none(corpus.sha256))[:12]})",
    }
    out.update(_flat("quantizer option", quant.get("options") or {}))
    out.update(_flat("calibration corpus", manifest.get("calibration_corpus") or {}))
    out.update(_flat("version of", manifest.get("versions") or {}))
    out.update(_flat("text normalizer", manifest.get("text_normalizer") or {}))
    return out


def what_changed(baseline: tuple[dict[str, Any], ReportRecord], now: tuple[dict[str, Any], ReportRecord]
                 ) -> list[dict[str, Any]]:
    """[{"what", "baseline", "now"}] of the records that differ ((manifest, report) of each build)."""
    a, b = _provenance(*baseline), _provenance(*now)
    return [{"what": k.replace("quantizer option.", "quantizer option ").replace("version of.", "version of ")
             .replace("calibration corpus.", "calibration corpus ").replace("text normalizer.", "text normalizer "),
             "baseline": a.get(k), "now": b.get(k)}
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


# ---- the comparison ----------------------------------------------------------------------------


def published_report(variant_dir: Path) -> ReportRecord:
    """The report a published variant holds, as its typed record (reports published before a section
    existed load with it UNSET); BadInput naming the file and the first key that does not fit."""
    path = variant_dir / REPORT_COPY_NAME
    try:
        return check_report(read_json_document(path, "report"))
    except BadInput as e:
        raise BadInput(f"{path}: {e}") from None


def compare(report: ReportRecord, manifest_core: dict[str, Any], baseline_dir: Path, baseline_version: str,
            tolerances: dict[str, float]) -> dict[str, Any]:
    """The regression record of one variant (its sealed report's record and manifest core) against its
    published copy in `baseline_dir`."""
    old_manifest = load_manifest(baseline_dir / MANIFEST_NAME)
    old_report = published_report(baseline_dir)
    variant = manifest_core["variant"]
    name = f"{baseline_version}'s {variant}"
    waived = dict(report.gate.waived)
    figures: dict[str, Any] = {}
    for figure in REGRESSION_FIGURES:
        if figure == "rtf_vs_baseline":
            continue  # measured now, not read from records (`retimed_figure`)
        entry = _sentence_figure(figure, report, old_report) if figure in _PER_SENTENCE else None
        if entry is None and figure in ("first_audio_seconds", *_POINT_JUDGED):
            # a baseline published before per-sentence first audio: the two medians, no interval
            entry = _point_figure(figure, report, old_report)
        if entry is not None:
            figures[figure] = _judge(figure, entry, tolerances.get(figure), waived, name)
    regressions = [f for f, e in figures.items() if e["status"] == "regression"]
    return {
        "schema": REGRESSION_SCHEMA,
        "baseline": {"version": baseline_version, "variant": variant,
                     "manifest_sha256": hashlib.sha256((baseline_dir / MANIFEST_NAME).read_bytes()).hexdigest(),
                     "report_integrity": old_report.integrity},
        "figures": figures,
        "changed": what_changed((old_manifest, old_report), (manifest_core, report)),
        "regressions": regressions,
        "improvements": [f for f, e in figures.items() if e["status"] == "improved"],
        "verdict": "regression" if regressions else "no regression",
        "accepted": None,
    }


def fp32_against_baseline(new_fp32: Path, baseline_fp32: Path, corpus: str, settings: SettingsSection,
                          threads: int | None = None) -> dict[str, Any]:
    """The build's FP32 against the baseline's FP32, measured now (the one figure not read from
    records): both replay the baseline FP32's own runs of the held-out sentences (teacher-forced, with
    the FP32 report's fidelity settings), so a change of exporter or onnxruntime shows here first."""
    from chattts_forge.calibration_data.corpus import load_corpus
    from chattts_forge.evaluate.intervals import fidelity_sentences
    from chattts_forge.quantize.fidelity import FidelitySettings, ReplaySessions, record_trajectories

    sentences, steps, seed = (int(or_none(v) or d) for v, d in
                              ((settings.fidelity_sentences, 8), (settings.fidelity_steps, 48), (settings.seed, 0)))
    corp = load_corpus(corpus, max_sentences=or_none(settings.max_sentences))
    recording = FidelitySettings(max_sentences=min(sentences, len(corp.sentences)), max_new_token=steps,
                                 seed=seed, threads=threads)
    trajectories = record_trajectories(baseline_fp32, corp, recording)
    sessions = ReplaySessions(baseline_fp32, new_fp32, threads)
    rows = fidelity_sentences([sessions.compare(t) for t in trajectories], use_fast=False)
    steps_of = [r["steps"] for r in rows]
    out: dict[str, Any] = {"identical": False, "sentences": len(rows),
                           "how": "measured now: teacher-forced on the baseline FP32's runs, pooled over steps, "
                                  "95% bootstrap interval over sentences"}
    for key in ("code_agreement", "code_kl"):
        num = [r[key] * r["steps"] for r in rows]
        lo, hi = bootstrap_ratio_interval(num, steps_of, confidence=CONFIDENCE, resamples=RESAMPLES, seed=0)
        out[key] = {"value": sum(num) / sum(steps_of), "low": lo, "high": hi}
    noise, signal = sum(r["mel_noise"] for r in rows), sum(r["mel_signal"] for r in rows)
    out["mel_snr_db"] = {"value": 150.0 if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise)}
    return out


def no_baseline(note: str = NO_BASELINE) -> dict[str, Any]:
    return regression_builtins(RegressionRecord(schema=REGRESSION_SCHEMA, baseline=None, note=note))


def _bootstrap_median(ratios: list[float]) -> tuple[float, float, float]:
    """(median, low, high): the median of the per-round ratios and its 95% bootstrap interval (seed 0)."""
    arr = np.asarray([r for r in ratios if math.isfinite(r)], np.float64)
    if arr.size == 0:
        return math.inf, math.inf, math.inf
    bounds = bootstrap(lambda idx: np.median(arr[idx], axis=-1), arr.size,
                       confidence=CONFIDENCE, resamples=RESAMPLES, seed=0)
    assert bounds is not None  # every resample of finite ratios has a finite median
    return float(np.median(arr)), bounds[0], bounds[1]


def retimed_figure(artifact_dir: Path, baseline_dir: Path, report: ReportRecord, identical: bool,
                   time_cap_s: float | None = None) -> dict[str, Any] | None:
    """The `rtf_vs_baseline` figure: the variant and the baseline's same variant timed now, interleaved
    on this machine (evaluate.latency.retime_against) on the report's timed sentences with its
    settings; identical bytes are not timed (the same graphs: no cost, delta 0). None when the report
    timed no sentence (nothing to re-time them on)."""
    if identical:
        return {"value": None, "baseline": None, "delta": 0.0, "low": 0.0, "high": 0.0, "relative": True, "n": 0,
                "identical": True, "how": "the same bytes as the baseline's variant: not re-timed (no cost)"}
    from chattts_forge.evaluate.latency import RETIME_TIME_CAP_S, LatencyConfig, retime_against
    from chattts_forge.log import get_logger, quiet_logger

    timed = report.latency.timed("artifact")
    sentences = [u.text for u in timed.utterances] if timed else []
    if not sentences:
        return None
    settings = report.settings  # evaluate's options the report was measured with
    provider = "cuda" if "CUDA" in str(or_none(report.machine.provider)) else "cpu"
    cfg = LatencyConfig(threads=or_none(settings.threads), max_new_token=or_none(settings.max_new_token) or 96,
                        seed=or_none(settings.seed) or 0, progress=False, provider=provider, isolate_memory=False)
    synthetic = report.artifact.source.kind == "synthetic"
    with quiet_logger(enabled=synthetic):  # random weights rarely emit EOS: one warning per synthesis
        timing = retime_against(artifact_dir, baseline_dir, sentences, cfg,
                                RETIME_TIME_CAP_S if time_cap_s is None else time_cap_s)
    ratio, lo, hi = _bootstrap_median(timing.pop("ratios"))
    get_logger(__name__).info("regression gate: %s re-timed against %s on this machine: RTF ratio %.3f [%.3f, %.3f] "
                              "(%d interleaved rounds, %s, %.1f s)", artifact_dir, baseline_dir, ratio, lo, hi,
                              timing["rounds"], timing["stopped"], timing["seconds"])
    return {"value": timing["artifact_rtf"], "baseline": timing["baseline_rtf"], "delta": ratio - 1, "low": lo - 1,
            "high": hi - 1, "relative": True, "n": timing["rounds"], "timing": timing,
            "how": "timed now on this machine: the variant and the baseline's in turn, sentence by sentence, the order "
                   "rotated per round; median of the per-round RTF ratios, 95% bootstrap interval over rounds"}


def _eval_corpus(report: ReportRecord) -> str | None:
    """The report's held-out corpus as `load_corpus` reads it, when it still loads with the same sha256."""
    from chattts_forge.calibration_data.corpus import load_corpus

    spec = report.corpus.spec
    if not isinstance(spec, str):
        return None
    try:
        loaded = load_corpus(spec, max_sentences=or_none(report.settings.max_sentences))
        return spec if loaded.sha256 == report.corpus.sha256 else None
    except (ForgeError, OSError):
        return None


def compare_build_variant(artifact_dir: Path, report_dir: Path, baseline: Baseline | None,
                          tolerances: dict[str, float], note: str = NO_BASELINE,
                          retime_cap_s: float | None = None) -> dict[str, Any]:
    """The regression record of a built variant (its artifact folder and evaluation report folder):
    `compare` of the records, the RTF re-timed against the baseline's same variant (`retimed_figure`)
    and, for FP32, its fidelity to the baseline's FP32 on the report's held-out corpus
    (`fp32_against_baseline`). Identical payloads are measured by neither (same logits, same speed)."""
    sealed = read_report(report_dir)
    meta = ArtifactMeta.load(artifact_dir)
    if baseline is None or meta.variant not in baseline.variants:
        why = note if baseline is None else f"no baseline: {baseline.version} and older hold no {meta.variant}"
        return no_baseline(why)
    core = build_manifest_core(model=baseline.model, version="", variant=meta.variant, meta=meta, report=sealed)
    old = baseline.variants[meta.variant]
    record = compare(sealed.record, core, old, baseline.version, tolerances)
    published = {p: e.sha256 for p, e in manifest_files(load_manifest(old / MANIFEST_NAME)).items()
                 if p not in RESERVED_NAMES}
    identical = published == sealed.artifact_files
    waived = dict(sealed.record.gate.waived)
    retimed = retimed_figure(artifact_dir, old, sealed.record, identical, retime_cap_s)
    if retimed is not None:
        record["figures"]["rtf_vs_baseline"] = _judge("rtf_vs_baseline", retimed, tolerances.get("rtf_vs_baseline"),
                                                      waived, f"{baseline.version}'s {meta.variant}")
    record["regressions"] = [f for f, e in record["figures"].items() if e["status"] == "regression"]
    record["improvements"] = [f for f, e in record["figures"].items() if e["status"] == "improved"]
    record["verdict"] = "regression" if record["regressions"] else "no regression"
    if meta.variant == FALLBACK_VARIANT:
        corpus = _eval_corpus(sealed.record)
        record["fp32_against_baseline"] = (
            {"identical": True, "how": "the same FP32 bytes as the baseline's: not measured (same logits)"}
            if identical else
            {"identical": False, "how": "not measured: the report's held-out corpus does not load here with its "
                                        "recorded sha256"} if corpus is None else
            fp32_against_baseline(artifact_dir, old, corpus, sealed.record.settings))
    return regression_builtins(regression_from_builtins(record))  # every field's type checked as written


def accept(record: dict[str, Any], reason: str) -> dict[str, Any]:
    """A regression the build was told to publish anyway, with why (recorded in the manifest)."""
    if not reason or not reason.strip():
        raise BadInput("--accept-regression needs --reason: why this regression may ship")
    accepted = regression_from_builtins(record)
    accepted.accepted = Accepted(reason=reason.strip())
    return regression_builtins(accepted)


def summary(variant: str, record: dict[str, Any]) -> str:
    """One line for the build's summary."""
    rec = regression_from_builtins(record)
    if rec.baseline is None:
        return f"{variant}: {rec.note or NO_BASELINE}"
    base = rec.baseline.version
    changed = ", ".join(c.what for c in rec.changed[:6]) or "nothing in the records"
    if rec.regressions:
        what = "; ".join(str(rec.figures[f].message) for f in rec.regressions)
        if rec.accepted:
            what += f" (accepted: {rec.accepted.reason})"
        elif rec.already_published:
            what += f" (these bytes are already published in {rec.already_published})"
        return f"{variant}: REGRESSION against {base}: {what}; changed: {changed}"
    if rec.improvements:
        how = "improved: " + ", ".join(rec.improvements)
    elif all(e.status in ("same", "waived", "not judged") for e in rec.figures.values()):
        how = "every figure within noise"
    else:
        how = "worse within the tolerances: " + ", ".join(f for f, e in rec.figures.items() if e.status == "worse")
    return f"{variant}: no regression against {base} ({how}); changed: {changed}"


def published_regression(variant_dir: Path) -> dict[str, Any] | None:
    """The regression record a published variant's manifest holds (None: published before the gate)."""
    record = load_manifest(variant_dir / MANIFEST_NAME).get("regression")
    return record if isinstance(record, dict) else None
