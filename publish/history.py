"""The history page of a model: every published version, each variant's headline figures over time.

``artifacts/<model>/history.html`` is rewritten with the index (publish.index.rewrite_index, under the
publish lock), so it always shows exactly what is published; every version page links to it
(evaluate.version_page.HISTORY_LINK). It is a pure function of the published manifests (their gate
headline figures and regression records, publish.regression): no wall clock, no path, no plot, so
`verify` rebuilds it and compares bytes, as it does index.json.

Per variant, one row per version that holds it: the evaluation date, the headline figures (code
agreement, mel SNR, WER/CER, median RTF and its ratio to the same build's FP32, first audio, size,
peak RSS at batch 1 and 8: "-" for versions evaluated before each variant's memory was measured in
a process of its own)
and the verdict against the version it was compared with when published (no baseline, no
regression, or a regression with the reason it was accepted). A JSON block (`HISTORY_SCHEMA`: model,
{version: {variant: manifest sha256}}) says what the page was made from.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import sha256_file
from chattts_forge.publish.manifest import MANIFEST_NAME, load_manifest
from chattts_forge.publish.regression_record import regression_from_builtins

HISTORY_NAME = "history.html"
HISTORY_SCHEMA = "chattts-forge/history-page/1"
# headline key -> (column title, format)
HISTORY_FIGURES: list[tuple[str, str, str]] = [
    ("code_agreement", "code agreement", ".3f"), ("mel_snr_db", "mel SNR dB", ".1f"), ("wer", "WER", ".3f"),
    ("cer", "CER", ".3f"), ("rtf_p50", "RTF p50", ".3f"), ("rtf_ratio_vs_reference", "RTF / FP32", ".3f"),
    ("first_audio_seconds", "first audio s", ".3f"), ("size_mb", "size MB", ".1f"),
    ("peak_rss_mb", "peak RSS MB b1", ".0f"), ("peak_rss_b8_mb", "peak RSS MB b8", ".0f"),
]
# Memory figures are shown only from headlines that record the batch-8 peak (issue 50, each variant in a
# process of its own): an earlier `peak_rss_mb` is the peak of a process the build's variants shared.
OWN_PROCESS_KEY = "peak_rss_b8_mb"
MEMORY_FIGURES = ("peak_rss_mb", "peak_rss_b8_mb")


def _fmt(x: Any, spec: str) -> str:
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return format(float(x), spec) if ok else "-"


def _verdict(manifest: dict[str, Any]) -> str:
    if not isinstance(manifest.get("regression"), dict):
        return "<td>not compared</td>"
    record = regression_from_builtins(manifest["regression"])
    if record.baseline is None:
        return f"<td>{html.escape(str(record.note or 'no baseline'))}</td>"
    base = record.baseline.version
    if record.regressions:
        worse = ", ".join(record.regressions)
        why = f"; accepted: {html.escape(record.accepted.reason)}" if record.accepted else ""
        return f"<td class='fail'>REGRESSION since {html.escape(base)} ({html.escape(worse)}){why}</td>"
    better = ", ".join(record.improvements)
    return (f"<td class='pass'>no regression since {html.escape(base)}"
            f"{f' (improved: {html.escape(better)})' if better else ''}</td>")


def model_manifests(model_dir: Path) -> dict[str, dict[str, Path]]:
    """{version: {variant: folder}} of a model's published variants, versions oldest first."""
    from chattts_forge.publish.index import iter_variant_dirs

    out: dict[str, dict[str, Path]] = {}
    for d in iter_variant_dirs(model_dir.parent):
        if d.parent.parent == model_dir:
            out.setdefault(d.parent.name, {})[d.name] = d
    return out


def history_bytes(model_dir: Path) -> bytes:
    """The history page of the model folder `model_dir` (see module docstring)."""
    versions = model_manifests(model_dir)
    manifests = {v: {name: load_manifest(d / MANIFEST_NAME) for name, d in vs.items()} for v, vs in versions.items()}
    data = {"schema": HISTORY_SCHEMA, "model": model_dir.name,
            "versions": {v: {name: sha256_file(d / MANIFEST_NAME) for name, d in vs.items()} for v, vs in versions.items()}}
    variants = sorted({name for vs in versions.values() for name in vs})
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in HISTORY_FIGURES)
    sections = []
    for variant in variants:
        rows = []
        for version, by_variant in manifests.items():
            m = by_variant.get(variant)
            if m is None:
                continue
            figures = dict((m.get("gate") or {}).get("headline") or {})
            if OWN_PROCESS_KEY not in figures:
                figures = {k: v for k, v in figures.items() if k not in MEMORY_FIGURES}
            cells = "".join(f"<td>{_fmt(figures.get(k), spec)}</td>" for k, _, spec in HISTORY_FIGURES)
            rows.append(f"<tr><th><a href='{html.escape(version)}/report.html'>{html.escape(version)}</a></th>"
                        f"<td>{html.escape(str(m.get('created_at')))}</td>{cells}{_verdict(m)}</tr>")
        sections.append(f"<h2 id='variant-{html.escape(variant)}'>{html.escape(variant)}</h2>"
                        f"<table><tr><th>version</th><th>evaluated</th>{head}<th>against the previous version</th></tr>"
                        f"{''.join(rows)}</table>")
    block = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    title = html.escape(model_dir.name)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chattts-forge: {title} history</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#1f2328}}
table{{border-collapse:collapse;margin:1em 0;font-size:13px}} td,th{{border:1px solid #d0d7de;padding:3px 6px;text-align:left}}
td.fail{{background:#ffebe9}} td.pass{{background:#dafbe1}}
</style></head><body>
<h1>{title}: every published version</h1>
<p>Each variant's headline figures per version (each against the FP32 of its own build) and its verdict against
the version it was compared with when it was published. A version's own page (linked) has every figure with its
interval and what changed between the builds. Peak RSS: each variant alone in a fresh process through load and a
synthesis at batch 1 and at batch 8 (bench's text and steps; "-" before that was measured).</p>
{''.join(sections) or '<p>Nothing published.</p>'}
<script type="application/json" id="chattts-forge-history">{block}</script>
</body></html>
""".encode()


def write_history(model_dir: Path) -> bool:
    """Rewrite `model_dir/history.html` when its bytes change (hold the publish lock); True when written."""
    path = model_dir / HISTORY_NAME
    want = history_bytes(model_dir)
    if path.is_file() and path.read_bytes() == want:
        return False
    atomic_write_bytes(path, want)
    return True


def history_problems(model_dir: Path) -> list[str]:
    """What `verify` says about a model's history page: it must be exactly what the manifests make."""
    path = model_dir / HISTORY_NAME
    if not path.is_file():
        return [f"{path}: missing"]
    try:
        want = history_bytes(model_dir)
    except ForgeError as e:  # a broken manifest is also reported by the variant's own check
        return [f"{path}: cannot be rebuilt from the manifests ({e})"]
    if path.read_bytes() != want:
        return [f"{path}: does not match the published manifests (versions, figures or verdicts differ)"]
    return []
