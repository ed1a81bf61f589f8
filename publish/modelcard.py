"""The short model card (`README.md`) of one published variant, with its gate table.

Rendered only from the manifest (no clock, no environment), so it is byte-for-byte reproducible.
"""

from __future__ import annotations

from typing import Any


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    if v is None:
        return "–"
    if isinstance(v, (dict, list)):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items()) if isinstance(v, dict) else ", ".join(map(_fmt, v))
    return str(v).replace("|", "\\|").replace("\n", " ")


_RULE_SIGN = {"min": "≥", "max": "≤"}
_STATUS = {"pass": "pass", "fail": "FAIL", "waived": "waived", "not_measured": "not measured"}


def _gate_rows(gate: dict[str, Any]) -> list[str]:
    """The gate table from the report's checks (keys: report_schema.CHECK_KEYS)."""
    rows = ["| metric | threshold | measured | result |", "| --- | --- | --- | --- |"]
    for check in gate["results"]:
        sign = _RULE_SIGN.get(check["rule"], "")
        unit = f" {check['unit']}" if check["unit"] else ""
        rows.append(f"| {_fmt(check['metric'])} | {sign + ' ' if sign else ''}{_fmt(check['threshold'])} | "
                    f"{_fmt(check['value'])}{unit} | {_STATUS[check['status']]} |")
    return rows


def render_model_card(manifest: dict[str, Any]) -> str:
    """Markdown model card for a manifest (with or without its files list)."""
    src = manifest["source_checkpoint"]
    gate = manifest["gate"]
    lines = [
        f"# {manifest['model']} {manifest['version']} — {manifest['variant']}",
        "",
        "ChatTTS text-to-speech as ONNX graphs, built and gated by chattts-forge; runs without torch:",
        "",
        "```",
        "chattts-forge synth --artifact . --text '你好，欢迎使用。' --out hello.wav",
        "```",
        "",
    ]
    if src["kind"] == "synthetic":
        lines += [
            "> **Synthetic weights.** This artifact was built from a seeded random checkpoint "
            f"(preset {src.get('preset', '?')}, seed {src.get('seed', '?')}) in the exact ChatTTS layout. "
            "It does not speak; it exists to test and benchmark the toolchain. Its gate uses fidelity "
            "against FP32, not intelligibility.",
            "",
        ]
    lines += [
        "## Components",
        "",
        "| component | precision | opset |",
        "| --- | --- | --- |",
    ]
    for name, precision in manifest["precision"].items():
        lines.append(f"| {name} | {precision} | {_fmt(manifest['opset'].get(name))} |")
    calib = manifest.get("calibration_corpus")
    quant = manifest.get("quantization")
    if quant:
        lines += ["", f"Quantization: method {_fmt(quant.get('method'))}."]
    if calib:
        lines += [
            f"Calibration corpus: {_fmt(calib.get('name'))} (sha256 {_fmt(calib.get('sha256'))}, "
            f"{_fmt(calib.get('samples'))} samples)."
        ]
    lines += [
        "",
        f"## Quality gate: {'passed' if gate['passed'] else 'FAILED'}",
        "",
        *_gate_rows(gate),
        "",
        f"Evaluated at {gate.get('evaluated_at')}; report `{gate.get('report')}` (sha256 {gate.get('report_sha256')}).",
    ]
    machine = gate.get("machine") or {}
    if machine:
        # The scalar facts (CPU, cores, threads, provider, platform); library versions are in the manifest.
        facts = {k: v for k, v in machine.items() if isinstance(v, (str, int, float, bool))}
        lines += ["", "Measured on: " + _fmt(facts) + "."]
    corpus = gate.get("corpus") or {}
    if corpus:
        facts = {k: v for k, v in corpus.items() if isinstance(v, (str, int, float, bool))}
        lines += ["Evaluation corpus: " + _fmt(facts) + "."]
    for note in gate.get("notes") or []:
        lines += [f"Note: {_fmt(note)}"]
    versions = manifest.get("versions") or {}
    tool = manifest.get("toolchain") or {}
    lines += [
        "",
        "## Provenance",
        "",
        f"- source checkpoint: {src['kind']}, {len(src.get('hashes', {}))} files hashed (see manifest.json)",
        "- built with: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
        f"- toolchain: {tool.get('name')} {tool.get('version')} (git {tool.get('git_commit')})",
        f"- created at: {manifest['created_at']}",
        "",
        "## Licences",
        "",
    ]
    for lic in manifest["licenses"].values():
        lines.append(f"- {lic['what']}: {lic['spdx']}" + (f" ({lic['url']})" if lic.get("url") else ""))
    lines += [
        "",
        "## Verify",
        "",
        "```",
        "sha256sum -c SHA256SUMS        # or: chattts-forge verify .",
        "```",
        "",
    ]
    return "\n".join(lines)
