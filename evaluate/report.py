"""The evaluate stage's reports people read: report.md (PR comment) and report.html (plots).

`write_reports(report, out_dir)` renders both from a sealed report and writes them beside
report.json through `report_schema.write_report` (atomically, one folder rename). The report.json
layout, its seal and its strict validation live in `report_schema` (the one home of that contract).

The HTML page renders the Markdown summary as HTML (`markdown_html.to_html`) and uses no glyph that
needs an emoji font: verdicts and statuses are words, styled as badges by CSS.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from msgspec import UNSET, UnsetType

from chattts_forge.errors import BadInput
from chattts_forge.evaluate.buckets import bucket_table_rows
from chattts_forge.evaluate.latency_record import LatencyRatios, LatencyRecord, PytorchRecord
from chattts_forge.evaluate.markdown_html import to_html
from chattts_forge.evaluate.report_record import (
    BucketsSection,
    GateCheck,
    IntervalsSection,
    PhraseCacheSection,
    ReportRecord,
    or_none,
)
from chattts_forge.evaluate.report_schema import validate, write_report
from chattts_forge.evaluate.report_sections import FidelityRecord
from chattts_forge.evaluate.search_report import render_auto_search_markdown
from chattts_forge.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")


# ---------------------------------------------------------------- formatting


def _f(x: Any, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x == 0 or 1e-3 <= abs(x) < 1e5:
            return f"{x:.{digits}g}"
        return f"{x:.2e}"
    return str(x)


# Words, not emoji: they read the same in a terminal, on GitHub and in a browser without emoji fonts.
_STATUS_WORD = {"pass": "pass", "fail": "**FAIL**", "waived": "waived", "not_measured": "**not measured**"}
_STATUS_BADGE = {"pass": "PASS", "fail": "FAIL", "waived": "WAIVED", "not_measured": "NOT MEASURED"}


def _required(value: T | UnsetType, key: str) -> T:
    """A field the rendering cannot do without: BadInput naming it when the report lacks it (a null
    one renders as the map's value did)."""
    if isinstance(value, UnsetType):
        raise BadInput(f"report key {key} is missing: nothing to render")
    return value


def _latency_rows(report: ReportRecord) -> list[tuple[str, LatencyRecord | PytorchRecord]]:
    lat = report.latency
    rows: list[tuple[str, LatencyRecord | PytorchRecord]] = [
        (f"{report.artifact.variant} (artifact)", _timed(lat.artifact)), ("fp32 (reference)", _timed(lat.reference))]
    if lat.pytorch:
        rows.append(("ChatTTS PyTorch FP32", lat.pytorch))
    return rows


def _timed(record: LatencyRecord | None | UnsetType) -> LatencyRecord:
    if not isinstance(record, LatencyRecord):
        raise BadInput("report key latency has no timed artifact and reference: nothing to render")
    return record


def _check_rows(checks: list[GateCheck]) -> list[tuple[GateCheck, str]]:
    """Each check with its threshold as the tables show it (≥ x, ≤ x, or match)."""
    rows = []
    for c in checks:
        op = {"min": "≥", "max": "≤"}.get(c.rule, "=")
        rows.append((c, f"{op} {_f(c.threshold)}" if c.threshold is not None else "match"))
    return rows


def render_markdown(report: ReportRecord) -> str:
    art, gate, corpus = report.artifact, report.gate, report.corpus
    verdict = "**PASSED**" if report.passed else "**FAILED**"
    lines = [
        f"### chattts-forge gate: `{art.variant}` {verdict}",
        "",
        f"Artifact `{art.dir}` ({_f(art.bytes_total / 1e6, 4)} MB, {len(art.files)} files) against FP32 "
        f"reference `{report.reference.dir}`; corpus `{_required(corpus.name, 'corpus.name')}` "
        f"({_required(corpus.sentences_used, 'corpus.sentences_used')} sentences, sha256 "
        f"`{_required(corpus.sha256, 'corpus.sha256')[:12]}`); "
        f"gate `{Path(gate.path).name}` (sha256 `{gate.sha256[:12]}`).",
        "",
    ]
    for note in report.notes:
        lines += [f"> {note}", ""]
    lines += ["| check | value | threshold | margin | status |", "| --- | ---: | ---: | ---: | --- |"]
    for c, thr in _check_rows(gate.checks):
        lines.append(
            f"| {c.metric} | {_f(c.value)} {c.unit or ''} | {thr} | {_f(c.margin)} | "
            f"{_STATUS_WORD.get(c.status, c.status)} |"
        )
    if gate.failed:
        lines += ["", "**Failed:** " + "; ".join(
            c.message for c in gate.checks if c.status in ("fail", "not_measured"))]
    lines += [
        "",
        "#### Latency (same run)",
        "",
        "| variant | RTF p50 | RTF p95 | RTF p99 | ms/step p50 | steps/s | first audio p50 s | load s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, rec in _latency_rows(report):
        first_audio = getattr(rec, "first_audio_seconds", None)  # the PyTorch record streams nothing
        fa = first_audio.p50 if first_audio else None
        lines.append(
            f"| {name} | {_f(rec.rtf.p50)} | {_f(rec.rtf.p95)} | {_f(rec.rtf.p99)} | "
            f"{_f(rec.seconds_per_step.p50 * 1000 if rec.seconds_per_step.p50 else None)} | "
            f"{_f(rec.steps_per_second)} | {_f(fa)} | {_f(rec.load_seconds)} |"
        )
    ratios = report.latency.ratios
    if not isinstance(ratios, LatencyRatios) or ratios.vs_reference is None:
        raise BadInput("report key latency.ratios.vs_reference is missing: nothing to render")
    lines += ["", f"RTF ratio vs FP32 reference: **{_f(ratios.vs_reference.rtf_p50)}x**"]
    inter = ratios.vs_reference_rtf_interleaved  # issue 27; absent in earlier reports
    if inter:
        lines[-1] += (f" (interleaved: 90% interval {_f(inter['low'])}-{_f(inter['high'])}, spread "
                      f"{_f(inter['spread'])}, {inter['rounds']} rounds over {inter['sentences']} sentences, "
                      f"{inter['stopped']})")
    if ratios.vs_pytorch:
        lines[-1] += (f"; vs ChatTTS PyTorch FP32: **{_f(ratios.vs_pytorch.rtf_p50)}x** "
                      f"(speed-up {_f(ratios.vs_pytorch.speedup_p50)}x)")
    else:
        lines[-1] += "; no PyTorch baseline in this run (`--baseline-checkpoint`)."
    tp = _timed(report.latency.artifact).throughput
    if tp:
        lines += ["", "| batch | aggregate RTF | real-time streams | steps/s |", "| ---: | ---: | ---: | ---: |"]
        for b, run in tp.items():
            lines.append(f"| {b} | {_f(run.aggregate_rtf)} | {_f(run.realtime_streams)} | {_f(run.steps_per_second)} |")
    lines += _memory_lines(report)
    lines += _hearing_lines(report) + _interval_lines(report.intervals)
    lines += _bucket_lines(report.buckets) + _cache_lines(report.phrase_cache)
    lines += render_auto_search_markdown(art.quantization_search)
    m, toolchain = report.machine, report.toolchain
    lines += [
        "",
        f"Machine: {_required(m.cpu_model, 'machine.cpu_model')}, {_required(m.logical_cores, 'machine.logical_cores')} "
        f"logical cores, {_required(m.threads, 'machine.threads')} threads, {_required(m.provider, 'machine.provider')}; "
        f"onnxruntime {_required(m.versions, 'machine.versions').get('onnxruntime')}, toolchain "
        f"{or_none(toolchain.version)} ({or_none(toolchain.git_commit) or 'no git'}).",
        "",
        f"report.json integrity `{report.integrity[:16]}…`",
        "",
    ]
    return "\n".join(lines)


def _memory_lines(report: ReportRecord) -> list[str]:
    """The ``memory`` section (issue 50): each side's peak RSS in a process of its own, and the commands.
    Each side is runtime.memory_probe's record (None when not probed)."""
    memory = report.memory
    if not memory:
        return []
    sides = [(f"{report.artifact.variant} (artifact)", memory.artifact), ("fp32 (reference)", memory.reference)]
    some = next((rec for _, rec in sides if rec is not None), None)
    steps = or_none(some.steps) if some is not None else None
    batches = (or_none(some.batches) if some is not None else None) or []
    lines = ["", f"#### Memory (each in a process of its own: load, then {steps} steps a row at batch "
                 f"{' then '.join(map(str, batches))})", "",
             "| variant | peak RSS MB, batch 1 | batch 8 | after load MB | batch 1 / FP32 |",
             "| --- | ---: | ---: | ---: | ---: |"]
    ratio = memory.ratio_vs_reference.get("1")
    for i, (name, rec) in enumerate(sides):
        # batch sizes (as text) are the probe's data keys
        by_batch = (rec.peak_rss_mb_by_batch if rec is not None else None) or {}
        after_load = or_none(rec.after_load_mb) if rec is not None else None
        lines.append(f"| {name} | {_f(by_batch.get('1'))} | {_f(by_batch.get('8'))} | {_f(after_load)} | "
                     f"{_f(ratio) if i == 0 else '1'} |")
    for name, rec in sides:
        if rec is not None and or_none(rec.error):
            lines.append(f"\n{name}: the memory probe failed: {rec.error}")
    commands = [f"`{rec.command}`" for _, rec in sides if rec is not None and or_none(rec.command)]
    if commands:
        lines += ["", "Repeat from the version folder: " + "; ".join(commands) + "."]
    return lines


def _hearing_lines(report: ReportRecord) -> list[str]:
    """What listeners hear: SIM, DNSMOS and stream seams (sections absent in earlier reports: nothing).
    The sections are evaluate.speaker's, listening's and seams' records."""
    speaker, nat, streaming = (or_none(s) for s in (report.speaker, report.naturalness, report.streaming))
    if speaker is None and nat is None and streaming is None:
        return []
    lines = ["", "#### What listeners hear (same sentences, speaker and seed as the FP32 reference)", ""]
    for section in (speaker, nat):
        if section is not None and or_none(section.synthetic_only):
            lines += [f"> {or_none(section.reason)}", ""]
            break
    if speaker is not None:
        if speaker.measured:
            lines.append(f"- speaker similarity to the FP32 audio: mean {_f(_required(speaker.mean, 'speaker.mean'))}, "
                         f"worst sentence {_f(_required(speaker.min, 'speaker.min'))} "
                         f"({len(_required(speaker.sentences, 'speaker.sentences'))} sentences)")
            clone = or_none(speaker.clone)
            if clone is not None:
                lines.append(f"- voice cloning: SIM of the cloned output to `{clone.recording}`: mean "
                             f"{_f(clone.mean)}, worst {_f(clone.min)}")
        else:
            lines.append(f"- speaker similarity: not measured ({or_none(speaker.reason)})")
    if nat is not None:
        if nat.measured:
            a = _required(nat.artifact, "naturalness.artifact")
            r = _required(nat.reference, "naturalness.reference")
            lines.append(f"- DNSMOS OVRL {_f(a.ovrl)} (FP32 {_f(r.ovrl)}, drop "
                         f"{_f(_required(nat.ovrl_drop, 'naturalness.ovrl_drop'))}); SIG {_f(a.sig)}, BAK {_f(a.bak)}, "
                         f"P.808 {_f(_required(a.p808, 'naturalness.artifact.p808'))}")
        else:
            lines.append(f"- DNSMOS: not measured ({or_none(nat.reason)})")
    if streaming is not None and streaming.measured:
        recorded = or_none(streaming.recorded)
        if recorded is not None:
            curve = ", ".join(f"{p.lookahead_frames}: {_f(p.snr_db_min)}"
                              for p in _required(recorded.curve, "streaming.recorded.curve"))
            lines.append(f"- recorded stream look-ahead (artifact.json): {recorded.lookahead_frames} of "
                         f"{_required(recorded.exact_frames, 'streaming.recorded.exact_frames')} mel frames (the "
                         f"shortest whose worst SNR reaches "
                         f"{_f(_required(recorded.threshold_db, 'streaming.recorded.threshold_db'))} + "
                         f"{_f(_required(recorded.margin_db, 'streaming.recorded.margin_db'))} dB on "
                         f"{_required(recorded.sentences, 'streaming.recorded.sentences')} fixed sentences, else the "
                         f"exact field; worst SNR dB by look-ahead: {curve})")
        for mode, rec in _required(streaming.modes, "streaming.modes").items():
            source = f", {rec.source}" if rec.source != "exact" else ""
            lines.append(f"- stream seams, {mode} ({rec.lookahead_frames} mel frames of right context{source}, "
                         f"{_required(streaming.stream_batch, 'streaming.stream_batch')} steps per chunk): worst SNR "
                         f"{_f(rec.snr_db_min)} dB, max abs difference {_f(rec.max_abs_diff)}, click energy at chunk "
                         f"edges {_f(rec.click_db_max)} dB")
    return lines


def _interval_lines(section: IntervalsSection | UnsetType) -> list[str]:
    if not section or not section.figures:
        return []
    lines = ["", f"#### {int(100 * section.confidence)}% bootstrap intervals over sentences", "",
             "| figure | value | interval | sentences | how |", "| --- | ---: | --- | ---: | --- |"]
    for name, f in section.figures.items():
        lines.append(f"| {name} | {_f(f.value)} | [{_f(f.low)}, {_f(f.high)}] | {f.n} | {f.how} |")
    return lines


def _listen_html(report: ReportRecord) -> str:
    """Players and spectrograms of the listen files (relative links: the page sits beside them)."""
    rows = []
    for row in report.listen.sentences if report.listen else []:
        players = "".join(
            f"<div>{html.escape(who)}<br><audio controls preload='metadata' src='{html.escape(heard.file)}'>"
            f"</audio></div>" for heard, who in ((row.artifact, str(report.artifact.variant)), (row.reference, "fp32")))
        rows.append(f"<div class='listen'><p>{html.escape(row.id)}: {html.escape(row.text)}</p>{players}"
                    f"<img alt='mel spectrograms {html.escape(row.id)}' src='{html.escape(row.spectrogram.file)}'/></div>")
    return f"<h2>Listen</h2>{''.join(rows)}" if rows else ""


def _bucket_lines(section: BucketsSection) -> list[str]:
    rows = bucket_table_rows(section)
    if not rows:
        return []
    length = or_none(section.length)
    lines = ["", f"#### Per length bucket ({length}; not part of the verdict above, the routing table's input)",
             "", "| bucket | chars | sentences | code agreement | hidden cosine | mel SNR dB | RTF p50 | RTF vs FP32 | gate |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _cache_lines(cache: PhraseCacheSection | None) -> list[str]:
    if not cache:
        return []
    return ["", "#### Warm phrase cache", "",
            f"{cache.phrases} phrases: a hit takes {_f(1e3 * cache.hit_seconds.mean)} ms, a miss "
            f"{_f(1e3 * cache.miss_seconds.mean)} ms ({_f(100 * (cache.hit_over_miss or 0))}%); at a "
            f"{_f(100 * cache.hit_ratio)}% hit ratio the mean latency is {_f(1e3 * cache.mean_seconds_at_hit_ratio)} ms "
            f"against {_f(1e3 * cache.mean_seconds_no_cache)} ms without a cache ({_f(cache.speedup_at_hit_ratio)}x); "
            f"hit vs miss waveform max |diff| {_f(cache.max_abs_diff)}."]


# ---------------------------------------------------------------- plots


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def make_plots(report: ReportRecord) -> dict[str, str]:
    """{title: base64 PNG} of the report's figures (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plots: dict[str, str] = {}
    rows = _latency_rows(report)

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, rec in rows:
        secs = np.sort([u.seconds for u in rec.utterances])
        if secs.size:
            ax.step(secs, np.arange(1, secs.size + 1) / secs.size, where="post", label=name)
    ax.set_xlabel("synthesis time per utterance (s)")
    ax.set_ylabel("fraction of utterances")
    ax.set_title("Latency CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    plots["Latency CDF"] = _png(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.4))
    names = [n for n, _ in rows]
    ax1.bar(names, [rec.rtf.p50 or 0 for _, rec in rows], color="tab:blue")
    ax1.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax1.set_title("RTF p50 (lower is faster)")
    ax1.tick_params(axis="x", labelrotation=20, labelsize=7)
    sizes = [report.size.artifact_bytes / 1e6, report.size.reference_bytes / 1e6]
    ax2.bar(names[:2], sizes, color="tab:orange")
    ax2.set_title("size on disk (MB)")
    ax2.tick_params(axis="x", labelrotation=20, labelsize=7)
    plots["RTF and size per variant"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6, 3.4))
    intel = report.intelligibility
    if or_none(intel.measured):
        labels, values = [], []
        for lang, language in _required(intel.languages, "intelligibility.languages").items():
            key = "cer" if lang == "zh" else "wer"
            for variant, scores in language.variants.items():
                labels.append(f"{variant}\n{key.upper()} ({lang})")
                values.append(scores.corpus[key])  # evaluate.score's map (typed as one: its keys vary)
        ax.bar(labels, values, color="tab:green")
        ax.set_ylabel("error rate")
        ax.tick_params(axis="x", labelsize=7)
    else:
        ax.axis("off")
        reason = "" if intel.reason is UNSET else intel.reason
        ax.text(0.5, 0.5, "WER/CER not measured:\n" + reason, ha="center", va="center", fontsize=11)
    ax.set_title("WER/CER per variant")
    plots["WER/CER per variant"] = _png(fig)

    # the stand-in reports write fidelity empty: no figure (any field written: the record was measured)
    if report.fidelity != FidelityRecord():
        tf = _required(report.fidelity.teacher_forced, "fidelity.teacher_forced")
        agreement = _required(tf.top1_agreement.per_stream, "fidelity.teacher_forced.top1_agreement.per_stream")
        streams = np.arange(len(agreement))
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
        ax1.bar(streams, agreement, color="tab:purple")
        ax1.set_ylim(0, 1.0)
        ax1.set_xticks(streams)
        ax1.set_xlabel("code stream")
        ax1.set_title("top-1 agreement per stream")
        ax2.bar(streams, _required(tf.kl.per_stream, "fidelity.teacher_forced.kl.per_stream"), color="tab:red")
        ax2.set_xticks(streams)
        ax2.set_xlabel("code stream")
        ax2.set_title("KL(FP32 || artifact) per stream (nats)")
        plots["Fidelity per stream"] = _png(fig)

    tp = _timed(report.latency.artifact).throughput
    if tp:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        bs = [int(b) for b in tp]
        ax.plot(bs, [tp[str(b)].realtime_streams or 0 for b in bs], marker="o", label="artifact")
        ref_tp = _timed(report.latency.reference).throughput
        if ref_tp:
            ax.plot(bs, [run.realtime_streams or 0 if (run := ref_tp.get(str(b))) else 0 for b in bs], marker="s",
                    label="fp32 reference")
        ax.set_xlabel("batch size")
        ax.set_ylabel("seconds of audio per second")
        ax.set_title("Throughput")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        plots["Throughput per batch size"] = _png(fig)
    return plots


def _badge(status: str, word: str | None = None) -> str:
    """A verdict as a CSS-styled word (pass/fail/waived), never a glyph that needs an emoji font."""
    cls = {"pass": "pass", "fail": "fail", "not_measured": "fail"}.get(status, "waived")
    return f"<span class='badge {cls}'>{html.escape(word or _STATUS_BADGE.get(status, status.upper()))}</span>"


def render_html(report: ReportRecord, markdown: str) -> str:
    """A self-contained page: verdict, checks table, plots (inline PNG), the summary rendered as HTML."""
    plots = make_plots(report)
    art, corpus = report.artifact, report.corpus
    rows = []
    for c, thr in _check_rows(report.gate.checks):
        cls = {"pass": "pass", "fail": "fail", "not_measured": "fail"}.get(c.status, "waived")
        rows.append(
            f"<tr class='{cls}'><td>{html.escape(c.metric)}</td><td>{html.escape(_f(c.value))}</td>"
            f"<td>{html.escape(thr)}</td><td>{html.escape(_f(c.margin))}</td>"
            f"<td>{_badge(c.status)}</td><td>{html.escape(c.message)}</td></tr>"
        )
    files = "".join(
        f"<tr><td>{html.escape(name)}</td><td><code>{f.sha256}</code></td><td>{f.bytes}</td></tr>"
        for name, f in art.files.items()
    )
    figures = "".join(
        f"<figure><img alt='{html.escape(t)}' src='data:image/png;base64,{b64}'/><figcaption>{html.escape(t)}"
        "</figcaption></figure>"
        for t, b64 in plots.items()
    )
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in report.notes)
    verdict = _badge("pass", "PASSED") if report.passed else _badge("fail", "FAILED")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chattts-forge gate: {html.escape(str(art.variant))}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#1f2328}}
table{{border-collapse:collapse;margin:1em 0;font-size:14px}}
td,th{{border:1px solid #d0d7de;padding:4px 8px;text-align:left}} tr.fail td{{background:#ffebe9}}
tr.pass td{{background:#dafbe1}} tr.waived td{{background:#f6f8fa}} .note{{background:#fff8c5;padding:8px}}
.badge{{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;
letter-spacing:.03em;vertical-align:middle;white-space:nowrap}} h1 .badge{{font-size:18px;padding:2px 12px}}
.badge.pass{{background:#1a7f37}} .badge.fail{{background:#cf222e}} .badge.waived{{background:#6e7781}}
figure{{display:inline-block;margin:8px}} code{{font-size:12px}}
.listen div{{display:inline-block;margin-right:1em;font-size:13px}} .listen img{{display:block;max-width:100%}}
.summary{{border:1px solid #d0d7de;border-radius:6px;padding:0 1em}} .summary th{{background:#f6f8fa}}
.summary blockquote{{margin:0.5em 0;padding:0 1em;border-left:4px solid #d0d7de;color:#59636e}}
</style></head><body>
<h1>{html.escape(str(art.variant))}: {verdict}</h1>
<p>Artifact <code>{html.escape(art.dir)}</code> against <code>{html.escape(report.reference.dir)}</code>,
corpus {html.escape(_required(corpus.name, 'corpus.name'))} ({_required(corpus.sentences_used, 'corpus.sentences_used')} sentences), evaluated
{html.escape(report.created_at)}.</p>
{notes}
<h2>Gate</h2>
<table><tr><th>metric</th><th>value</th><th>threshold</th><th>margin</th><th>status</th><th>detail</th></tr>
{''.join(rows)}</table>
<h2>Plots</h2>
{figures}
{_listen_html(report)}
<h2>Summary</h2>
<section class="summary">
{to_html(markdown)}</section>
<h2>Files judged</h2>
<table><tr><th>file</th><th>sha256</th><th>bytes</th></tr>{files}</table>
<p>report.json integrity: <code>{html.escape(report.integrity)}</code></p>
</body></html>
"""


def write_reports(report: dict[str, Any], out_dir: Path, files: dict[str, bytes] | None = None) -> Path:
    """Write report.json (sealed, validated) / report.md / report.html into `out_dir`, with `files`
    ({relative path: bytes}: the listen files) beside them, all or nothing."""
    record = validate(report)
    markdown = render_markdown(record)
    renderings: dict[str, str | bytes] = {"report.md": markdown, "report.html": render_html(record, markdown)}
    for name, data in (files or {}).items():
        if name in renderings or name == "report.json":
            raise ValueError(f"listen file {name!r} would replace a report file")
        renderings[name] = data
    return write_report(report, out_dir, renderings)
