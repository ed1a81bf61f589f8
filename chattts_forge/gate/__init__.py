"""The quality gate: thresholds per metric (GATE.toml), the waivers and the one verdict.

The one judge of the toolchain: the evaluate stage (whole corpus and per length bucket) and
`quantize --method auto` (its search, on the fidelity rules) all judge through `judge` here, on
metric names of `METRICS`; fidelity records map to those names through
`chattts_forge.artifact.Fidelity.gate_metrics`. This package sits in its own layer (core and runtime
below it; quantize, evaluate and above import it: docs/architecture.md).

A gate file (schema ``chattts-forge/gate/1``, the shipped one is ``default_gate.toml`` here) holds
sections of ``min_<metric> = number`` / ``max_<metric> = number`` keys; the section names are for
people (any section may hold any metric). Known metrics are `METRICS`; an unknown key is an error,
so a typo never silently disables a check. Two sections are not thresholds: ``[buckets]`` (the length
buckets) and ``[regression]`` (`REGRESSION_FIGURES` -> how much worse than the same variant of the
previous published version a variant may get; judged by chattts_forge.publish.regression).

Library::

    gate = load_gate(None)                                   # the shipped default
    gate = load_gate("my_gate.toml")
    verdict = judge(gate, metrics, waived={"wer_delta": "synthetic checkpoint: ..."})
    fidelity_rules(gate)                                     # [[rule, metric, threshold]] of FIDELITY_METRICS

`metrics` maps metric name -> float or None (None: not measured, with a reason in `reasons`).
A check whose metric was not measured fails, unless the metric is in `waived` (name -> why), in
which case it is reported as "waived" with that reason. A waived metric that was measured keeps
its value in the check but is not a verdict either way. The evaluate stage waives intelligibility on
synthetic checkpoints (fidelity decides instead; `intelligibility_waivers`), speaker similarity and
DNSMOS there too (random weights make noise: evaluate.listening), and the timing metrics on tiny
synthetic ones (their timings are call overhead). Never a silent pass. `judge(..., integrity=[...])`
adds the artifact's file-integrity check (files that do not match their artifact.json) as a failing
check of its own.

Verdict::

    {"path", "sha256", "schema" (of the gate file), "passed": bool,
     "checks": [{"section", "metric", "rule" ("min"|"max"), "threshold", "value", "unit", "status"
                 ("pass"|"fail"|"waived"|"not_measured"), "passed" (True|False; None when waived),
                 "margin" (how far inside the threshold; negative means failing by that much),
                 "message"}],
     "failed": [metric, ...], "waived": {metric: reason}}
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import read_toml
from chattts_forge.integrity import sha256_file

GATE_SCHEMA = "chattts-forge/gate/1"
DEFAULT_GATE = Path(__file__).resolve().parent / "default_gate.toml"

# metric -> (description, unit)
METRICS: dict[str, tuple[str, str]] = {
    "wer": ("WER of the artifact's audio (ASR)", ""),
    "cer": ("CER of the artifact's audio (ASR)", ""),
    "wer_delta": ("WER increase vs the FP32 reference's audio", ""),
    "cer_delta": ("CER increase vs the FP32 reference's audio", ""),
    "code_agreement": ("teacher-forced top-1 code agreement, mean over streams", ""),
    "code_agreement_stream": ("teacher-forced top-1 code agreement, worst stream", ""),
    "code_kl": ("KL(FP32 || artifact) of code logits, mean over streams", "nats"),
    "code_kl_stream": ("KL(FP32 || artifact) of code logits, worst stream", "nats"),
    "hidden_cosine": ("GPT last hidden state cosine, mean", ""),
    "hidden_cosine_min": ("GPT last hidden state cosine, minimum", ""),
    "mel_snr_db": ("mel SNR after the Decoder", "dB"),
    "mel_lsd_db": ("mel log-spectral distance", "dB"),
    "rtf_p50": ("real-time factor, median", ""),
    "rtf_p95": ("real-time factor, p95", ""),
    "rtf_p99": ("real-time factor, p99", ""),
    "first_audio_seconds": ("first audio latency when streaming, median", "s"),
    "rtf_ratio_vs_reference": ("median RTF / the FP32 artifact's median RTF (same run)", "x"),
    "rtf_ratio_vs_pytorch": ("median RTF / ChatTTS PyTorch FP32 median RTF (same run)", "x"),
    "size_ratio_vs_reference": ("bytes on disk / the FP32 artifact's bytes", "x"),
    "size_mb": ("bytes on disk", "MB"),
    "peak_rss_mb": ("peak RSS of a process of its own through load and a batch-1 synthesis", "MB"),
    "peak_rss_b8_mb": ("peak RSS of a process of its own through load and a batch-8 synthesis", "MB"),
    "rss_after_load_mb": ("resident memory of a process of its own once loaded and warmed", "MB"),
    "peak_rss_ratio_vs_reference": ("batch-1 peak RSS / the FP32 artifact's (each in a process of its own)", "x"),
    "similarity": ("speaker similarity (SIM) of the artifact's audio to the FP32 audio of the same sentence, mean", ""),
    "similarity_worst": ("speaker similarity to the FP32 audio, worst sentence", ""),
    "clone_similarity": ("SIM of the cloned output to the cloning recording, mean", ""),
    "ovrl_drop": ("DNSMOS OVRL of the FP32 audio minus the artifact's, mean over sentences", "MOS"),
    "stream_snr_db": ("streamed vs whole-text audio SNR at the default chunking, worst sentence", "dB"),
    "stream_lookahead_snr_db": ("streamed vs whole-text audio SNR with the stream lookahead, worst sentence", "dB"),
    "stream_recorded_lookahead_snr_db": ("streamed vs whole-text audio SNR at the artifact's recorded look-ahead "
                                         "(its default stream), worst held-out sentence", "dB"),
}
# The metrics a fidelity record gives (`artifact.Fidelity.gate_metrics`), in its order: what
# `quantize --method auto` searches against.
FIDELITY_METRICS = ("code_agreement", "code_agreement_stream", "code_kl", "code_kl_stream", "hidden_cosine",
                    "hidden_cosine_min", "mel_snr_db", "mel_lsd_db")
# Intelligibility through the ASR: waived on synthetic checkpoints and for a language the sentences lack.
INTELLIGIBILITY_METRICS = ("wer", "wer_delta", "cer", "cer_delta")
SYNTHETIC_INTELLIGIBILITY = "synthetic checkpoint: intelligibility cannot be measured on random weights"
INTEGRITY_METRIC = "artifact_integrity"

# The regression gate's figures ([regression] of a gate file; publish.regression judges them): each
# variant against the same variant of the previous version, paired per held-out sentence.
# figure -> (what, which way is better, how the tolerance is read, the report's gate metric whose waiver
# also waives this figure (None: never waived)).
REGRESSION_FIGURES: dict[str, tuple[str, str, str, str | None]] = {
    "code_agreement": ("teacher-forced code agreement with its own build's FP32", "higher", "absolute",
                       "code_agreement"),
    "code_kl": ("KL(FP32 || variant) of the code logits against its own build's FP32", "lower", "absolute", "code_kl"),
    "mel_snr_db": ("mel SNR against its own build's FP32, dB", "higher", "absolute", "mel_snr_db"),
    "similarity": ("speaker similarity to its own build's FP32 audio", "higher", "absolute", "similarity"),
    "ovrl": ("DNSMOS OVRL of its audio", "higher", "absolute", "ovrl_drop"),
    "wer": ("WER of its audio (ASR)", "lower", "absolute", "wer_delta"),
    "cer": ("CER of its audio (ASR)", "lower", "absolute", "cer_delta"),
    "rtf_ratio_vs_reference": ("median RTF over its own build's FP32 (per sentence)", "lower", "relative",
                               "rtf_ratio_vs_reference"),
    "rtf_vs_baseline": ("RTF over the baseline's same variant, both timed now in interleaved rounds on this machine",
                        "lower", "relative", "rtf_ratio_vs_reference"),
    # first audio has no gate check of its own to carry a waiver: the timings' waiver (tiny) waives it
    "first_audio_seconds": ("first audio when streaming, median of the per-sentence seconds", "lower", "relative",
                            "rtf_ratio_vs_reference"),
    "first_audio_ratio_vs_reference": ("first audio over its own build's FP32 first audio (per sentence, in turn), "
                                       "median", "lower", "relative", "rtf_ratio_vs_reference"),
    "size_mb": ("bytes on disk", "lower", "relative", None),
    # one fresh-process measurement per build (publish.regression gives it the probe's repeatability as its
    # interval); over its own build's FP32, so two builds on different machines stay comparable
    "peak_rss_ratio_vs_reference": ("batch-1 peak RSS over its own build's FP32's (each in a process of its own)",
                                    "lower", "relative", "peak_rss_ratio_vs_reference"),
}


def recorded_gate_path(path: str | os.PathLike[str] | None) -> str | None:
    """A gate file as records name it (with its sha256 beside): `builtin:default_gate.toml` for the
    shipped one, else its file name, never a path of the machine (None: rules with no file)."""
    if path is None:
        return None
    if Path(path).resolve() == DEFAULT_GATE:
        return f"builtin:{DEFAULT_GATE.name}"
    return Path(path).name


def load_gate(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Parse and validate a gate file -> {"path", "sha256", "schema", "rules": [(section, rule, metric, threshold)],
    "buckets": [{"name", "min_chars", "max_chars", "rules"}], "regression": {figure: tolerance}}."""
    path = Path(path) if path is not None else DEFAULT_GATE
    raw = read_toml(path, "gate file")
    schema = raw.pop("schema", GATE_SCHEMA)
    if schema != GATE_SCHEMA:
        raise ForgeError(f"gate file {path} has schema {schema!r}; this tool reads {GATE_SCHEMA!r}")
    bucket_table = raw.pop("buckets", None)
    regression = _regression(path, raw.pop("regression", None))
    rules: list[tuple[str, str, str, float]] = []
    for section, table in raw.items():
        if not isinstance(table, dict):
            raise BadInput(f"gate file {path}: '{section}' must be a [section] of min_/max_ thresholds")
        rules += _thresholds(path, section, table, {(r[1], r[2]) for r in rules})
    if not rules:
        raise ForgeError(f"gate file {path} has no thresholds")
    return {"path": str(path), "sha256": sha256_file(path), "schema": schema, "rules": rules,
            "buckets": _buckets(path, bucket_table, rules), "regression": regression}


def _regression(path: Path, table: Any) -> dict[str, float]:
    """The [regression] tolerances ({figure: how much worse a variant may get than the same variant of
    the previous version}); a gate without the section takes the shipped file's, so every build is
    compared; a figure absent from the section is reported but never refused."""
    if table is None:
        if path.resolve() == DEFAULT_GATE:
            raise ForgeError(f"gate file {path}: the shipped gate has no [regression] section")
        return load_gate(DEFAULT_GATE)["regression"]
    if not isinstance(table, dict):
        raise BadInput(f"gate file {path}: 'regression' must be a [regression] section of tolerances")
    out = {}
    for figure, value in table.items():
        if figure not in REGRESSION_FIGURES:
            raise BadInput(f"gate file {path}: unknown tolerance 'regression.{figure}' "
                             f"(known: {', '.join(REGRESSION_FIGURES)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise BadInput(f"gate file {path}: 'regression.{figure}' must be a finite number >= 0, got {value!r}")
        out[figure] = float(value)
    return out


def _thresholds(path: Path, section: str, table: dict[str, Any], seen: set[tuple[str, str]]) -> list[tuple[str, str, str, float]]:
    """The (section, rule, metric, threshold) rules of one [section] (ForgeError on an unknown key)."""
    rules = []
    seen = set(seen)
    for key, value in table.items():
        rule, _, metric = key.partition("_")
        if rule not in ("min", "max") or metric not in METRICS:
            known = ", ".join(f"min_/max_{m}" for m in METRICS)
            raise BadInput(f"gate file {path}: unknown threshold '{section}.{key}' (known: {known})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise BadInput(f"gate file {path}: '{section}.{key}' must be a finite number, got {value!r}")
        if (rule, metric) in seen:
            raise ForgeError(f"gate file {path}: '{key}' is given twice")
        seen.add((rule, metric))
        rules.append((section, rule, metric, float(value)))
    return rules


def _buckets(path: Path, table: Any, rules: list[tuple[str, str, str, float]]) -> list[dict[str, Any]]:
    """The length buckets ([buckets] edges/names, default <= 10, 11-40, > 40 characters), each with its
    rules: the gate's rules, a threshold in [buckets.NAME] replacing the same min_/max_ metric."""
    # runtime.router loads soundfile (12 ms): needed only here
    from chattts_forge.runtime.router import DEFAULT_BUCKETS, buckets_from_edges

    if table is not None and not isinstance(table, dict):
        raise BadInput(f"gate file {path}: 'buckets' must be a [buckets] section")
    table = dict(table or {})
    edges, names = table.pop("edges", None), table.pop("names", None)
    try:
        buckets = DEFAULT_BUCKETS if edges is None else buckets_from_edges(edges, names)
    except ForgeError as e:
        raise ForgeError(f"gate file {path}: [buckets] {e}") from None
    if edges is None and names is not None:
        raise ForgeError(f"gate file {path}: [buckets] names need edges")
    known = {b.name for b in buckets}
    out = []
    for name in table:
        if name not in known or not isinstance(table[name], dict):
            raise BadInput(f"gate file {path}: unknown bucket '{name}' in [buckets] (buckets: {', '.join(sorted(known))})")
    for b in buckets:
        own = _thresholds(path, f"buckets.{b.name}", table.get(b.name, {}), set())
        replaced = {(r[1], r[2]) for r in own}
        out.append({**b.to_dict(), "rules": [r for r in rules if (r[1], r[2]) not in replaced] + own})
    return out


def fidelity_rules(gate: dict[str, Any]) -> list[list[Any]]:
    """The gate's rules on fidelity metrics, in file order: [[rule, metric, threshold]] (what
    `quantize --method auto` searches against); ForgeError when the gate has none."""
    rules = [[rule, metric, threshold] for _, rule, metric, threshold in gate["rules"] if metric in FIDELITY_METRICS]
    if not rules:
        raise ForgeError(f"gate file {gate['path']} has no fidelity thresholds ({', '.join(FIDELITY_METRICS)}) "
                         "to search for")
    return rules


def stream_threshold_db(gate: dict[str, Any] | None = None) -> float:
    """The gate's `min_stream_snr_db` (the shipped gate's when `gate` is None, or when the gate has no such
    rule): the seam threshold a recorded stream look-ahead is chosen against (runtime.stream_lookahead)."""
    for g in (gate, None) if gate is not None else (None,):
        rules = (g or load_gate(None))["rules"]
        found = [t for _, rule, metric, t in rules if rule == "min" and metric == "stream_snr_db"]
        if found:
            return found[0]
    raise ForgeError(f"gate file {DEFAULT_GATE} has no min_stream_snr_db")


def intelligibility_waivers(metrics: dict[str, float | None], synthetic: bool, reasons: dict[str, str] | None = None,
                            unmeasured: str = "not applicable") -> dict[str, str]:
    """The WER/CER waivers: all four on a synthetic checkpoint (random weights make noise for any ASR);
    otherwise the ones not measured, since sentences in one language leave the other's metric with
    nothing to judge (why: `reasons[metric]`, else `unmeasured`)."""
    if synthetic:
        return {k: SYNTHETIC_INTELLIGIBILITY for k in ("wer", "cer", "wer_delta", "cer_delta")}
    reasons = reasons or {}
    return {k: reasons.get(k, unmeasured) for k in INTELLIGIBILITY_METRICS if metrics.get(k) is None}


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        return f"{x:.4g}"
    return f"{x:.3e}"


def judge(
    gate: dict[str, Any],
    metrics: dict[str, float | None],
    waived: dict[str, str] | None = None,
    reasons: dict[str, str] | None = None,
    integrity: list[str] | None = None,
) -> dict[str, Any]:
    """Apply `gate` to measured `metrics` (see module docstring for the verdict). `integrity`: the
    artifact's files that do not match its artifact.json; any makes a failing `artifact_integrity` check."""
    waived = waived or {}
    reasons = reasons or {}
    checks = []
    for section, rule, metric, threshold in gate["rules"]:
        value = metrics.get(metric)
        if value is not None and not math.isfinite(value):
            # +inf SNR (identical mel) passes a min rule; NaN is never a pass.
            value = value if not math.isnan(value) else None
        check: dict[str, Any] = {
            "section": section,
            "metric": metric,
            "rule": rule,
            "threshold": threshold,
            "value": value,
            "unit": METRICS[metric][1],
        }
        if metric in waived and value is not None:  # measured and reported, but not a verdict
            check.update(status="waived", passed=None, margin=None,
                         message=f"{metric} = {value:.4g}: not gated ({waived[metric]})")
        elif value is None:
            if metric in waived:
                check.update(status="waived", passed=None, margin=None,
                             message=f"{metric}: not measured ({waived[metric]})")
            else:
                why = reasons.get(metric, "not measured")
                check.update(status="not_measured", passed=False, margin=None,
                             message=f"{metric}: {why}; the gate cannot pass")
        else:
            ok = value >= threshold if rule == "min" else value <= threshold
            margin = value - threshold if rule == "min" else threshold - value
            op = ">=" if rule == "min" else "<="
            if ok:
                msg = f"{metric} = {_fmt(value)} {op} {_fmt(threshold)}"
            else:
                msg = f"{metric} = {_fmt(value)} violates {op} {_fmt(threshold)} (off by {_fmt(abs(margin))})"
            check.update(status="pass" if ok else "fail", passed=ok,
                         margin=margin if math.isfinite(margin) else None, message=msg)
        checks.append(check)
    if integrity:
        checks.append({
            "section": "integrity", "metric": INTEGRITY_METRIC, "rule": "equal", "threshold": None,
            "value": None, "unit": "", "status": "fail", "margin": None, "passed": False,
            "message": "; ".join(integrity),
        })
    failed = [c["metric"] for c in checks if c["status"] in ("fail", "not_measured")]
    measured = [c for c in checks if c["status"] in ("pass", "fail")]
    return {
        "path": recorded_gate_path(gate["path"]), **{k: gate[k] for k in ("sha256", "schema")},
        "passed": not failed and bool(measured),
        "checks": checks,
        "failed": failed,
        "waived": {c["metric"]: waived[c["metric"]] for c in checks if c["status"] == "waived"},
    }
