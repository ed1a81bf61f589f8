"""One page per published version: every variant built, published or refused, by eye and by ear.

`render_version_page(model, version, entries, routing)` makes ``report.html``, written by the build
into the version folder (``artifacts/<model>/<version>/report.html``, listed in the version
manifest, publish.version_files) and into the build's reports folder. It is one self-contained file
(no server, no network, nothing beside it): plots are inline PNG, the audio is inline MP3
(``data:audio/mpeg;base64``), so the folder stays verifiable by the manifest's one entry.

What it shows:

- a quality-vs-speed table: per variant its verdict (published / refused by the gate / not built),
  WER/CER, SIM, DNSMOS OVRL, code agreement, mel SNR, stream SNR, RTF, first audio, size and peak
  RSS at batch 1 and at batch 8 (each variant in a process of its own: the report's ``memory``
  section), each with its 95% interval where the report has one (evaluate.intervals) and the verdict
  of the gate checks on that figure (pass / FAIL / waived, with the waiver's reason on hover);
- a Pareto plot: speed (median RTF against FP32, same run) against fidelity (code agreement), the
  variants on the frontier joined;
- "since vN" beside each figure and a list per variant: its change against the same variant of the
  previous published version (publish.regression: delta, 95% interval, verdict) and what changed
  between the two builds; a link to the model's history page (publish.history);
- the routing table (publish.version_files / runtime.router): per length bucket the variant served
  and why (none in a version without FP32);
- for the first few held-out sentences, FP32's audio and each variant's next to it, and their mel
  spectrograms with the difference (the listen files of each report, checked against the sha256
  their report records). A small script writes each player's duration beside it once its metadata
  has loaded (``data-duration``: what the headless-browser test reads).

The page embeds a JSON block (``<script type="application/json" id="chattts-forge-page">``:
`PAGE_SCHEMA`, model, version, per variant its status and its report's integrity) that `verify`
checks against the published variants (`page_problems`). The bytes are a pure function of the
reports, their listen files and the routing table (no wall clock, no absolute path).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgspec import UNSET

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.evaluate.listening import read_listen_file
from chattts_forge.evaluate.report_record import ReportRecord, or_none
from chattts_forge.log import get_logger

log = get_logger(__name__)

PAGE_NAME = "report.html"
PAGE_SCHEMA = "chattts-forge/version-page/1"
PAGE_DATA_ID = "chattts-forge-page"
LISTEN_SENTENCES = 3

# column -> (title, how to read its value from a report, the gate metrics whose checks give its verdict,
#            the intervals entry, format)
COLUMNS: list[tuple[str, str, tuple[str, ...], str | None, str]] = [
    ("WER/CER", "asr", ("wer", "cer", "wer_delta", "cer_delta"), None, ".3f"),
    ("SIM to FP32", "similarity", ("similarity", "similarity_worst"), "similarity", ".3f"),
    ("OVRL", "ovrl", ("ovrl_drop",), "ovrl", ".2f"),
    ("code agreement", "code_agreement", ("code_agreement", "code_agreement_stream"), "code_agreement", ".3f"),
    ("mel SNR dB", "mel_snr_db", ("mel_snr_db", "mel_lsd_db"), "mel_snr_db", ".1f"),
    ("stream SNR dB", "stream_snr_db", ("stream_snr_db", "stream_lookahead_snr_db"), None, ".1f"),
    ("RTF p50", "rtf_p50", ("rtf_p50", "rtf_ratio_vs_reference", "rtf_ratio_vs_pytorch"), "rtf_p50", ".3f"),
    ("first audio s", "first_audio_seconds", ("first_audio_seconds",), None, ".3f"),
    ("size MB", "size_mb", ("size_mb", "size_ratio_vs_reference"), None, ".1f"),
    # each variant in a process of its own (the report's `memory` section): load + batch 1, load + batch 8
    ("peak RSS MB b1", "peak_rss_mb", ("peak_rss_mb", "peak_rss_ratio_vs_reference"), None, ".0f"),
    ("peak RSS MB b8", "peak_rss_b8_mb", ("peak_rss_b8_mb",), None, ".0f"),
]
_RANK = {"fail": 3, "not_measured": 3, "pass": 2, "waived": 1}
# column title -> the regression figures (publish.regression) its "since vN" cell shows
SINCE: dict[str, tuple[str, ...]] = {
    "WER/CER": ("wer", "cer"), "SIM to FP32": ("similarity",), "OVRL": ("ovrl",),
    "code agreement": ("code_agreement", "code_kl"), "mel SNR dB": ("mel_snr_db",),
    "RTF p50": ("rtf_ratio_vs_reference", "rtf_vs_baseline"),
    "first audio s": ("first_audio_seconds", "first_audio_ratio_vs_reference"), "size MB": ("size_mb",),
    "peak RSS MB b1": ("peak_rss_ratio_vs_reference",),
}
# how a cell holding two figures tells them apart (the re-timed RTF; first audio over its own FP32)
_SINCE_TAGS = {"rtf_vs_baseline": "re-timed", "first_audio_ratio_vs_reference": "/ FP32",
               "peak_rss_ratio_vs_reference": "/ FP32"}
_SINCE_CLASS = {"regression": "fail", "improved": "pass", "worse": "waived", "same": "", "waived": "waived",
                "not judged": "waived"}
HISTORY_LINK = "../history.html"  # the model's history page (publish.history), beside its version folders


@dataclass(frozen=True)
class VariantEntry:
    """One variant of the build: its sealed report (None when it was not built or not evaluated)."""

    variant: str
    status: str  # "published" (in this version) | "refused" | "regression" (passed, refused against the baseline)
    #              | "not built" | "other version" (passed, published elsewhere)
    report: ReportRecord | None = None
    report_dir: Path | None = None
    detail: str = ""  # why it was refused or not built
    regression: dict[str, Any] | None = None  # its comparison with the previous version (publish.regression)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _fmt(x: Any, spec: str) -> str:
    v = _num(x)
    return "-" if v is None else format(v, spec)


def _value(report: ReportRecord, key: str) -> tuple[float | None, str]:
    """(value, label) of a column for one report."""
    m = report.metrics
    if key == "asr":
        for metric in ("wer", "cer"):
            if _num(m.get(metric)) is not None:
                return m[metric], metric.upper()
        return None, ""
    if key == "ovrl":
        nat = report.naturalness  # evaluate.listening's record; absent in reports before issue 25
        measured = nat is not UNSET and nat.measured and nat.artifact is not UNSET
        return (nat.artifact.ovrl if measured else None), ""
    return m.get(key), ""


def _cell(report: ReportRecord, column: tuple[str, str, tuple[str, ...], str | None, str]) -> str:
    _, key, metrics, interval_key, spec = column
    value, label = _value(report, key)
    figures = report.intervals.figures if report.intervals else {}
    if key == "asr" and label:
        interval_key = label.lower()
    text = _fmt(value, spec) + (f" {label}" if label and value is not None else "")
    iv = figures.get(interval_key) if interval_key else None
    if iv and value is not None:
        text += f" <span class='iv'>[{_fmt(iv.low, spec)}, {_fmt(iv.high, spec)}]</span>"
    checks = [c for c in report.gate.checks if c.metric in metrics]
    if value is None and any(c.metric == key and c.status == "pass" for c in checks):
        text = "inf"  # a passing figure stored as null: +inf (identical output), which strict JSON cannot hold
    if not checks:
        return f"<td>{text}</td>"
    worst = max(checks, key=lambda c: _RANK.get(c.status, 0))
    status = worst.status
    word = {"pass": "pass", "fail": "FAIL", "not_measured": "FAIL", "waived": "waived"}.get(status, status)
    cls = {"pass": "pass", "fail": "fail", "not_measured": "fail"}.get(status, "waived")
    title = "; ".join(c.message for c in checks)
    return f"<td class='{cls}' title='{html.escape(title)}'>{text} <span class='badge {cls}'>{word}</span></td>"


def _verdict(entry: VariantEntry) -> str:
    if entry.status == "published":
        note = f" <span class='why'>{html.escape(entry.detail)}</span>" if entry.detail else ""
        return f"<span class='badge pass'>PUBLISHED</span>{note}"
    if entry.status == "refused":
        failed = ", ".join(entry.report.gate.failed if entry.report else [])
        return f"<span class='badge fail'>REFUSED</span> <span class='why'>gate failed: {html.escape(failed)}</span>"
    if entry.status == "regression":
        worse = ", ".join((entry.regression or {}).get("regressions") or [])
        return (f"<span class='badge fail'>REGRESSION</span> <span class='why'>worse than "
                f"{html.escape(_baseline_version(entry) or '-')}: {html.escape(worse)}</span>")
    word = "OTHER VERSION" if entry.status == "other version" else "NOT BUILT"
    return f"<span class='badge waived'>{word}</span> <span class='why'>{html.escape(entry.detail)}</span>"


def _baseline_version(entry: VariantEntry) -> str | None:
    return ((entry.regression or {}).get("baseline") or {}).get("version")


def _since(entry: VariantEntry, figures: tuple[str, ...]) -> str:
    """A "since vN" cell: the change of each figure against the baseline's same variant, its interval
    and its regression verdict (hover for the message)."""
    record = (entry.regression or {}).get("figures") or {}
    parts, statuses, titles = [], [], []
    for f in figures:
        e = record.get(f)
        if not e:
            continue
        d, lo, hi = e["delta"], e.get("low"), e.get("high")
        spec = (lambda x: f"{x * 100:+.1f}%") if e.get("relative") else (lambda x: f"{x:+.3g}")
        text = spec(d) + (f" <span class='iv'>[{spec(lo)}, {spec(hi)}]</span>" if lo is not None and hi is not None else "")
        tag = _SINCE_TAGS.get(f, f.upper() if f in ("wer", "cer", "code_kl") else "")
        parts.append(text + (f" {html.escape(tag)}" if tag else ""))
        statuses.append(e["status"])
        titles.append(e["message"])
    if not parts:
        return "<td>-</td>"
    worst = next((s for s in ("regression", "worse", "improved", "waived", "not judged", "same") if s in statuses), "same")
    cls = _SINCE_CLASS.get(worst, "")
    badge = f" <span class='badge {cls or 'waived'}'>{html.escape(worst)}</span>" if worst != "same" else ""
    return f"<td class='{cls}' title='{html.escape('; '.join(titles))}'>{'<br>'.join(parts)}{badge}</td>"


def _table(entries: list[VariantEntry]) -> str:
    baselines = sorted({b for e in entries if (b := _baseline_version(e))})
    since = f"since {'/'.join(baselines)}" if baselines else ""
    columns = [(c, SINCE.get(c[0]) if since else None) for c in COLUMNS]
    head = "".join(f"<th>{html.escape(c[0])}</th>" + (f"<th>{html.escape(since)}</th>" if figs else "")
                   for c, figs in columns)
    width = sum(1 + bool(figs) for _, figs in columns)
    rows = []
    for e in entries:
        cells = ("".join(_cell(e.report, c) + (_since(e, figs) if figs else "") for c, figs in columns) if e.report
                 else f"<td colspan='{width}'>-</td>")
        rows.append(f"<tr id='variant-{html.escape(e.variant)}'><th>{html.escape(e.variant)}</th>"
                    f"<td class='verdict'>{_verdict(e)}</td>{cells}</tr>")
    return f"<table class='variants'><tr><th>variant</th><th>verdict</th>{head}</tr>{''.join(rows)}</table>"


def _fp32_against_baseline(m: dict[str, Any] | None, base: str) -> str:
    """The build's FP32 against the baseline's FP32 (measured by the build, publish.regression)."""
    if not m:
        return ""
    if m.get("identical"):
        return f"<br>FP32 against {base}'s FP32: the same bytes"
    parts = [f"{label} {_fmt(m[key]['value'], spec)}" + (f" <span class='iv'>[{_fmt(m[key]['low'], spec)}, "
                                                         f"{_fmt(m[key]['high'], spec)}]</span>" if "low" in m[key] else "")
             for key, label, spec in (("code_agreement", "code agreement", ".4f"), ("code_kl", "KL", ".3g"),
                                      ("mel_snr_db", "mel SNR dB", ".1f")) if key in m]
    return f"<br>FP32 against {base}'s FP32 (measured now, {m.get('sentences')} sentences): {', '.join(parts)}"


def _regression_section(entries: list[VariantEntry]) -> str:
    """Per variant: its verdict against the baseline's same variant and what changed between the two builds."""
    items = []
    for e in entries:
        r = e.regression
        if not r:
            continue
        if r.get("baseline") is None:
            items.append(f"<li><b>{html.escape(e.variant)}</b>: {html.escape(str(r.get('note', 'no baseline')))}</li>")
            continue
        base = html.escape(r["baseline"]["version"])
        if r["regressions"]:
            verdict = "<span class='badge fail'>REGRESSION</span> " + "; ".join(
                html.escape(r["figures"][f]["message"]) for f in r["regressions"])
            if r.get("accepted"):
                verdict += f" <b>accepted</b>: {html.escape(r['accepted']['reason'])}"
        elif all(f["status"] in ("same", "waived", "not judged") for f in r["figures"].values()):
            verdict = f"<span class='badge pass'>no regression</span> every figure within noise of {base}"
        else:
            verdict = f"<span class='badge pass'>no regression</span> against {base}"
        better = [html.escape(r["figures"][f]["message"]) for f in r.get("improvements") or []]
        if better:
            verdict += "; improved: " + "; ".join(better)
        verdict += _fp32_against_baseline(r.get("fp32_against_baseline"), base)
        changed = "".join(f"<li>{html.escape(c['what'])}: {html.escape(json.dumps(c['baseline']))} &rarr; "
                          f"{html.escape(json.dumps(c['now']))}</li>" for c in r["changed"])
        items.append(f"<li id='since-{html.escape(e.variant)}'><b>{html.escape(e.variant)}</b> since {base}: {verdict}"
                     f"<br>what changed between the two builds: "
                     f"{f'<ul>{changed}</ul>' if changed else 'nothing in their records'}</li>")
    if not items:
        return "<p>No comparison with a previous version was made for this version.</p>"
    return f"<ul class='since'>{''.join(items)}</ul>"


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Variants no other beats on both speed (lower x) and fidelity (higher y), by x."""
    front = [v for v, (x, y) in points.items()
             if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for v2, (x2, y2) in points.items() if v2 != v)]
    return sorted(front, key=lambda v: (points[v][0], v))


def _lookahead(entries: list[VariantEntry]) -> str:
    """Per variant: the stream look-ahead its artifact.json records (what synth, serve and bench stream at),
    its SNR on the held-out sentences with the gate's verdict, and the curve it was chosen on."""
    rows = []
    for e in entries:
        streaming = e.report.streaming if e.report else UNSET  # evaluate.seams' record
        record = None if streaming is UNSET else or_none(streaming.recorded)
        if record is None:
            text = "-" if not e.report else "none recorded: streams exactly"
            rows.append(f"<tr><th>{html.escape(e.variant)}</th><td colspan='3'>{text}</td></tr>")
            continue
        curve = " &middot; ".join(f"{p.lookahead_frames}: {_fmt(p.snr_db_min, '.1f')}" for p in record.curve)
        chosen = (f"{record.lookahead_frames} of {record.exact_frames} mel frames (worst SNR &ge; "
                  f"{_fmt(record.threshold_db, 'g')} + {_fmt(record.margin_db, 'g')} dB on "
                  f"{record.sentences} fixed sentences)")
        held_out = _cell(e.report, ("", "stream_recorded_lookahead_snr_db", ("stream_recorded_lookahead_snr_db",),
                                    None, ".1f"))
        rows.append(f"<tr><th>{html.escape(e.variant)}</th><td>{chosen}</td>{held_out}<td>{curve}</td></tr>")
    return ("<table class='lookahead'><tr><th>variant</th><th>recorded look-ahead</th><th>held-out SNR dB</th>"
            f"<th>curve: look-ahead frames: worst SNR dB</th></tr>{''.join(rows)}</table>")


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def pareto_plot(entries: list[VariantEntry]) -> str | None:
    """base64 PNG: median RTF against FP32 (x, lower is faster) vs code agreement (y), or None."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    points, status = {}, {}
    for e in entries:
        m = e.report.metrics if e.report else {}
        x, y = _num(m.get("rtf_ratio_vs_reference")), _num(m.get("code_agreement"))
        if x is not None and y is not None:
            points[e.variant], status[e.variant] = (x, y), e.status
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    colors = {"published": "tab:green", "refused": "tab:red"}
    for v, (x, y) in sorted(points.items()):
        ax.scatter([x], [y], color=colors.get(status[v], "gray"), zorder=3)
        ax.annotate(v, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    front = pareto_front(points)
    ax.plot([points[v][0] for v in front], [points[v][1] for v in front], color="tab:blue", lw=1, ls="--",
            label="Pareto front", zorder=2)
    ax.set_xlabel("median RTF / FP32's (same run; lower is faster)")
    ax.set_ylabel("code agreement with FP32")
    ax.set_title("speed against fidelity (green: published, red: refused)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def _routing(routing: dict[str, Any] | None) -> str:
    if not routing:
        return "<p>No routing table (no FP32 variant published in this version).</p>"
    rows = []
    for b in routing["buckets"]:
        rng = f"{b['min_chars']}-{b['max_chars']}" if b.get("max_chars") is not None else f">= {b['min_chars']}"
        rows.append(f"<tr><td>{html.escape(b['name'])}</td><td>{rng}</td><td>{html.escape(b['variant'])}</td>"
                    f"<td>{html.escape(b['reason'])}</td></tr>")
    return (f"<p>{html.escape(str(routing.get('length', '')))}; fallback {html.escape(str(routing.get('fallback')))}.</p>"
            f"<table><tr><th>bucket</th><th>chars</th><th>served by</th><th>why</th></tr>{''.join(rows)}</table>")


def _data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _player(label: str, mime: str, data: bytes, key: str) -> str:
    return (f"<div class='player'><span class='who'>{html.escape(label)}</span><br><audio controls preload='metadata' "
            f"data-key='{html.escape(key)}' src='{_data_uri(mime, data)}'></audio> <span class='duration'></span></div>")


def _listen(entries: list[VariantEntry], sentences: int) -> str:
    """FP32's audio and each variant's, per sentence, with the spectrogram of each variant against FP32."""
    with_audio = [(e, e.report.listen) for e in entries
                  if e.report and e.report_dir is not None and e.report.listen and e.report.listen.sentences]
    if not with_audio:
        return "<p>No audio: none of the reports holds listening files.</p>"
    # FP32's audio from its own report when it was evaluated; else any report's reference audio.
    source, heard = next(((e, lis) for e, lis in with_audio if e.variant == "fp32"), with_audio[0])
    assert source.report_dir is not None  # with_audio holds only entries with a folder
    blocks = []
    for row in heard.sentences[:sentences]:
        mime = heard.mime
        fp32_file = row.artifact if source.variant == "fp32" else row.reference
        parts = [f"<h3>{html.escape(row.id)}: {html.escape(row.text)}</h3>",
                 _player("fp32", mime, read_listen_file(source.report_dir, fp32_file), f"{row.id}/fp32")]
        for e, listen in with_audio:
            if e.variant == "fp32" or e.report_dir is None:
                continue
            mine = next((r for r in listen.sentences if r.id == row.id and r.text == row.text), None)
            if mine is None:
                continue
            audio = read_listen_file(e.report_dir, mine.artifact)
            png = read_listen_file(e.report_dir, mine.spectrogram)
            key = f"{row.id}/{e.variant}"
            parts.append(f"<div class='variant'>{_player(e.variant, mime, audio, key)}"
                         f"<img alt='mel spectrograms: fp32, {html.escape(e.variant)}, difference' "
                         f"src='{_data_uri('image/png', png)}'/></div>")
        blocks.append("<section class='sentence'>" + "".join(parts) + "</section>")
    return "".join(blocks)


_DURATION_SCRIPT = """
document.querySelectorAll('audio').forEach(function (a) {
  function show() {
    a.setAttribute('data-duration', String(a.duration));
    a.parentNode.querySelector('.duration').textContent = a.duration.toFixed(2) + ' s';
  }
  if (a.readyState >= 1) { show(); } else { a.addEventListener('loadedmetadata', show); }
  a.addEventListener('error', function () { a.setAttribute('data-duration', 'error'); });
});
"""


def page_data(model: str, version: str, entries: list[VariantEntry]) -> dict[str, Any]:
    return {"schema": PAGE_SCHEMA, "model": model, "version": version,
            "history": HISTORY_LINK,
            "variants": {e.variant: {"status": e.status,
                                     "report_integrity": e.report.integrity if e.report else None,
                                     "passed": e.report.passed if e.report else None,
                                     "regression": _page_regression(e.regression)} for e in entries}}


def _page_regression(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the page's data block says of a comparison (verify checks it against the manifest's)."""
    if not record:
        return None
    return {"baseline": (record.get("baseline") or {}).get("version"), "verdict": record.get("verdict"),
            "accepted": record.get("accepted")}


def _normalizer_line() -> str:
    """What turns written text into the spoken text the runtime feeds every variant (runtime.spoken)."""
    from chattts_forge.runtime.spoken import SEGMENT_NOTE, normalizer_identity

    ident = normalizer_identity()
    options = ", ".join(f"{k}: {v}" for k, v in sorted(ident["options"].items()))
    return html.escape(f"Text normalization: {ident['name']} {ident['version']} (rules {ident['rules']}; {options}). "
                       f"{SEGMENT_NOTE}")


def render_version_page(model: str, version: str, entries: list[VariantEntry], routing: dict[str, Any] | None,
                        sentences: int = LISTEN_SENTENCES) -> bytes:
    """The version page's bytes (see module docstring)."""
    notes = []
    for e in entries:
        for n in e.report.notes if e.report else []:
            if n not in notes and ("synthetic" in n.lower() or "not gated" in n):
                notes.append(n)
    plot = pareto_plot(entries)
    data = json.dumps(page_data(model, version, entries), sort_keys=True).replace("</", "<\\/")
    title = f"{model} {version}"
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chattts-forge: {html.escape(title)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#1f2328}}
table{{border-collapse:collapse;margin:1em 0;font-size:13px}} td,th{{border:1px solid #d0d7de;padding:3px 6px;text-align:left}}
td.fail{{background:#ffebe9}} td.pass{{background:#dafbe1}} td.waived{{background:#f6f8fa}} .iv{{color:#59636e;font-size:11px}}
.badge{{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;font-weight:600;color:#fff;white-space:nowrap}}
.badge.pass{{background:#1a7f37}} .badge.fail{{background:#cf222e}} .badge.waived{{background:#6e7781}}
.why{{font-size:11px;color:#59636e}} .note{{background:#fff8c5;padding:8px}}
.sentence{{border-top:1px solid #d0d7de;margin-top:1em}} .player{{display:inline-block;margin:4px 1em 4px 0;font-size:13px}}
.variant img{{display:block;max-width:100%}} .duration{{font-size:11px;color:#59636e}}
</style></head><body>
<h1>{html.escape(title)}: every variant built</h1>
<p>All versions of {html.escape(model)}, each variant's headline figures over time: <a href="{HISTORY_LINK}">history</a>.</p>
{''.join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)}
<h2>Quality and speed</h2>
<p>Each figure with its 95% bootstrap interval over the held-out sentences and the gate's verdict on it
(hover for the check). SIM: speaker similarity to FP32's audio of the same sentence; stream SNR: streamed against
whole-text audio at the default chunking (worst sentence).</p>
{_table(entries)}
<h2>Stream look-ahead</h2>
<p>The mel frames of right context each variant streams at by default (<code>--stream-lookahead exact</code> waits for the
whole receptive field), measured where its Decoder/Vocos stack was made, and its worst streamed-against-whole SNR
on the held-out sentences, which the gate judges.</p>
{_lookahead(entries)}
<h2>Since the previous version</h2>
<p>Each variant against the same variant of the previous published version (paired per held-out sentence, 95%
bootstrap interval; a change worse than the gate's [regression] tolerance over its whole interval is a regression).</p>
{_regression_section(entries)}
<h2>Speed against fidelity</h2>
{f"<img alt='Pareto plot' src='data:image/png;base64,{plot}'/>" if plot else "<p>No variant has both figures.</p>"}
<h2>Routing</h2>
{_routing(routing)}
<h2>Text front end</h2>
<p>{_normalizer_line()}</p>
<h2>Listen</h2>
{_listen(entries, sentences)}
<script type="application/json" id="{PAGE_DATA_ID}">{data}</script>
<script>{_DURATION_SCRIPT}</script>
</body></html>
"""
    return body.encode("utf-8")


_DATA_RE = re.compile(rf'<script type="application/json" id="{PAGE_DATA_ID}">(.*?)</script>', re.S)


def read_page_data(page: bytes) -> dict[str, Any]:
    """The JSON block of a version page (ForgeError when missing or malformed)."""
    match = _DATA_RE.search(page.decode("utf-8", errors="replace"))
    if match is None:
        raise BadInput("no chattts-forge page data block")
    try:
        data = json.loads(match.group(1).replace("<\\/", "</"))
    except json.JSONDecodeError as e:
        raise BadInput(f"page data is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != PAGE_SCHEMA:
        raise BadInput(f"page data schema is not {PAGE_SCHEMA!r}")
    return data


def page_problems(page_path: Path, model: str, version: str, published: dict[str, str | None],
                  regressions: dict[str, dict[str, Any] | None] | None = None) -> list[str]:
    """What `verify` says about a version page: it must name this version and every published variant
    with the integrity of the report it was published with (`published`: {variant: integrity}) and, when
    `regressions` ({variant: its manifest's regression record}) is given, the verdict that record holds."""
    try:
        data = read_page_data(page_path.read_bytes())
    except (OSError, ForgeError) as e:
        return [f"{page_path}: {e}"]
    problems = []
    if (data.get("model"), data.get("version")) != (model, version):
        problems.append(f"{page_path}: is the page of {data.get('model')}/{data.get('version')}, not this version")
    shown = data.get("variants") or {}
    for variant, integrity in sorted(published.items()):
        rec = shown.get(variant)
        if not isinstance(rec, dict) or rec.get("status") != "published":
            problems.append(f"{page_path}: does not show published variant {variant!r}")
        elif rec.get("report_integrity") != integrity:
            problems.append(f"{page_path}: shows another report of {variant!r} than the one published")
        elif regressions is not None and rec.get("regression") != _page_regression(regressions.get(variant)):
            problems.append(f"{page_path}: shows another comparison with the previous version of {variant!r} "
                            "than its manifest records")
    for variant, rec in sorted(shown.items()):
        if isinstance(rec, dict) and rec.get("status") == "published" and variant not in published:
            problems.append(f"{page_path}: shows {variant!r} as published, but it is not in this version")
    return problems
