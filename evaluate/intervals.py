"""Per-sentence rows and a 95% bootstrap interval for every corpus figure of a report.

A corpus figure comes from a handful of held-out sentences, so the report gives each one the
percentile-bootstrap interval over those sentences (`evaluate.stats`, 2000 resamples, seed 0: a
pure function of the per-sentence values):

- pooled rates (WER/CER, code agreement over steps, mel SNR over energy) resample sentences and
  recompute the pooled ratio (`bootstrap_ratio_interval`; mel SNR as 10 log10 of the interval of
  signal over noise energy);
- deltas against FP32 on the same sentences (WER/CER delta, OVRL drop) are paired;
- means (SIM, OVRL) and the median RTF resample the per-sentence values.

Report section ``intervals``: ``{"confidence", "resamples", "method", "figures": {metric: {"value",
"low", "high", "n", "how"}}}`` (a figure with one sentence has low == high == value); section
``sentences``: one row per held-out sentence with every per-sentence figure measured (null where
that sentence was not measured: fidelity and seams use the first few sentences only).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from chattts_forge.evaluate import textnorm
from chattts_forge.evaluate.stats import (
    bootstrap_interval,
    bootstrap_ratio_interval,
    paired_bootstrap_interval,
)
from chattts_forge.log import get_logger

log = get_logger(__name__)

CONFIDENCE = 0.95
RESAMPLES = 2000


def _entry(value: float | None, lo: float, hi: float, n: int, how: str) -> dict[str, Any]:
    return {"value": value, "low": float(lo), "high": float(hi), "n": n, "how": how}


def fidelity_sentences(comparisons: list[Any], use_fast: bool) -> list[dict[str, float]]:
    """Per-sentence code agreement (weighted by steps) and mel energies of fidelity comparisons."""
    from chattts_forge.quantize.fidelity import code_metrics

    rows = []
    for c in comparisons:
        logits = c.fast_logits if use_fast and c.fast_logits is not None else c.q_logits
        cm = code_metrics(c.ref_logits, logits)
        ref = np.asarray(c.ref_mel, np.float64)
        noise = float(((ref - np.asarray(c.q_mel, np.float64)) ** 2).sum())
        signal = float((ref**2).sum())
        rows.append({"code_agreement": cm["top1_agreement"]["mean"], "code_kl": cm["kl"]["mean"], "steps": cm["steps"],
                     "mel_signal": signal,
                     "mel_noise": noise,
                     "mel_snr_db": 150.0 if noise == 0 else float(10 * np.log10(max(signal, 1e-300) / noise))})
    return rows


def _asr_rows(intel: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{utterance id: {"metric", "errors", "tokens", "reference_errors"}} of the measured languages."""
    out: dict[str, dict[str, Any]] = {}
    for lang, rec in (intel.get("languages") or {}).items():
        metric = "cer" if lang == "zh" else "wer"
        ref_utts = {u["id"]: u for u in rec["variants"]["reference"]["utterances"]}
        for u in rec["variants"]["artifact"]["utterances"]:
            tokens = len(textnorm.tokens(u["reference_norm"], lang))
            r = ref_utts.get(u["id"], {})
            out[u["id"]] = {"metric": metric, "tokens": tokens, "rate": u[metric],
                            "errors": (u[metric] or 0.0) * tokens, "reference_rate": r.get(metric),
                            "reference_errors": (r.get(metric) or 0.0) * tokens}
    return out


def build(report: dict[str, Any], fidelity_rows: list[dict[str, float]] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the ``intervals`` section, the ``sentences`` rows) of a report in progress."""
    kw = {"confidence": CONFIDENCE, "resamples": RESAMPLES, "seed": 0}
    metrics = report["metrics"]
    figures: dict[str, Any] = {}
    utts = report["latency"]["artifact"]["utterances"]
    ids = [f"{i + 1:03d}" for i in range(len(utts))]
    rows: list[dict[str, Any]] = [{"id": i, "text": u["text"], "rtf": u.get("rtf"), "seconds": u.get("seconds"),
                                   "audio_seconds": u.get("audio_seconds")} for i, u in zip(ids, utts, strict=True)]
    by_id = {r["id"]: r for r in rows}

    rtfs = [u["rtf"] for u in utts if u.get("rtf") is not None]
    if rtfs:
        figures["rtf_p50"] = _entry(metrics.get("rtf_p50"), *bootstrap_interval(rtfs, np.median, **kw), len(rtfs),
                                    "median of per-sentence RTF")

    asr = _asr_rows(report["intelligibility"]) if report["intelligibility"].get("measured") else {}
    for metric in ("wer", "cer"):
        sel = [a for a in asr.values() if a["metric"] == metric]
        if sel and sum(a["tokens"] for a in sel) > 0:
            num, den = [a["errors"] for a in sel], [a["tokens"] for a in sel]
            figures[metric] = _entry(metrics.get(metric), *bootstrap_ratio_interval(num, den, **kw), len(sel),
                                     "pooled edits / reference tokens, sentences resampled")
            diff = [a["errors"] - a["reference_errors"] for a in sel]
            figures[f"{metric}_delta"] = _entry(metrics.get(f"{metric}_delta"),
                                                *bootstrap_ratio_interval(diff, den, **kw), len(sel),
                                                "paired: (artifact - fp32 edits) / tokens, sentences resampled")
    for utt_id, a in asr.items():
        if utt_id in by_id:
            by_id[utt_id].update({a["metric"]: a["rate"], f"reference_{a['metric']}": a["reference_rate"]})

    speaker = report.get("speaker") or {}
    if speaker.get("measured"):
        sims = [r["similarity"] for r in speaker["sentences"]]
        if sims:
            figures["similarity"] = _entry(speaker["mean"], *bootstrap_interval(sims, **kw), len(sims),
                                           "mean per-sentence SIM to the FP32 audio")
        for r in speaker["sentences"]:
            by_id.get(r["id"], {})["similarity"] = r["similarity"]
        clone = speaker.get("clone") or {}
        vals = [r["similarity"] for r in clone.get("sentences") or []]
        if vals:
            figures["clone_similarity"] = _entry(clone["mean"], *bootstrap_interval(vals, **kw), len(vals),
                                                 "mean per-sentence SIM of the cloned output to the recording")
    nat = report.get("naturalness") or {}
    if nat.get("measured") and nat["sentences"]:
        art = [r["artifact"]["ovrl"] for r in nat["sentences"]]
        ref = [r["reference"]["ovrl"] for r in nat["sentences"]]
        figures["ovrl"] = _entry(nat["artifact"]["ovrl"], *bootstrap_interval(art, **kw), len(art), "mean DNSMOS OVRL")
        figures["ovrl_drop"] = _entry(nat["ovrl_drop"], *paired_bootstrap_interval(ref, art, **kw), len(art),
                                      "paired: mean fp32 OVRL - mean artifact OVRL")
        for r in nat["sentences"]:
            by_id.get(r["id"], {}).update(ovrl=r["artifact"]["ovrl"], reference_ovrl=r["reference"]["ovrl"],
                                          ovrl_drop=r["ovrl_drop"], p808=r["artifact"].get("p808"))
    if fidelity_rows:
        num = [r["code_agreement"] * r["steps"] for r in fidelity_rows]
        den = [r["steps"] for r in fidelity_rows]
        if sum(den) > 0:
            figures["code_agreement"] = _entry(metrics.get("code_agreement"), *bootstrap_ratio_interval(num, den, **kw),
                                               len(num), "pooled agreement over steps, sentences resampled")
        sig, noise = [r["mel_signal"] for r in fidelity_rows], [r["mel_noise"] for r in fidelity_rows]
        if sum(noise) > 0:
            # SNR = 10 log10(signal / noise): the interval of noise / signal, inverted (the log is monotone).
            lo, hi = bootstrap_ratio_interval(noise, sig, **kw)
            figures["mel_snr_db"] = _entry(metrics.get("mel_snr_db"), 10 * math.log10(1 / hi) if hi > 0 else 150.0,
                                           10 * math.log10(1 / lo) if lo > 0 else 150.0, len(sig),
                                           "pooled mel energy / error energy, sentences resampled")
        for i, r in zip(ids, fidelity_rows, strict=False):
            # code_kl and the step count: what the regression gate pools per sentence (publish.regression)
            by_id[i].update(code_agreement=r["code_agreement"], code_kl=r.get("code_kl"),
                            fidelity_steps=r["steps"], mel_snr_db=r["mel_snr_db"])
    streaming = report.get("streaming") or {}
    for mode, key in (("default", "stream_snr_db"), ("lookahead", "stream_lookahead_snr_db")):
        for r in ((streaming.get("modes") or {}).get(mode) or {}).get("sentences") or []:
            by_id.get(r["id"], {}).update({key: r["snr_db"], f"{key.removesuffix('_snr_db')}_click_db": r["click_db"]})
    section = {"confidence": CONFIDENCE, "resamples": RESAMPLES,
               "method": "percentile bootstrap over held-out sentences (evaluate.stats, seed 0)", "figures": figures}
    return section, rows
