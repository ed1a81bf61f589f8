"""CLI of the evaluate stage: `chattts-forge score` and `chattts-forge evaluate`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from chattts_forge.evaluate.evaluate_config import EvaluateConfig, EvaluateSettings, LatencyRunConfig
from chattts_forge.evaluate.score import ScoreSettings, score_audio_dir
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.log import get_logger
from chattts_forge.options import declared_options

log = get_logger(__name__)


@click.command("score")
@declared_options(ScoreSettings)  # every option declared once, on its field (score.py)
def score(**options: Any) -> None:
    """Score audio: WER/CER against transcripts with a real ASR (ours and Seed-TTS-eval's), speaker
    similarity to a reference (--speaker-reference) and DNSMOS naturalness (--mos), each corpus figure
    with its 95% bootstrap interval over utterances."""
    settings = ScoreSettings(**options)
    json_out = settings.json_out
    result = score_audio_dir(settings.audio_dir, settings.transcripts, settings)
    for u in result["utterances"]:
        fields = [u["id"]]
        if "wer" in u:
            fields += [f"wer={u['wer']:.3f}", f"cer={u['cer']:.3f}"]
        if "sim" in u:
            fields.append(f"sim={u['sim']:.3f}")
        if "dnsmos" in u:
            fields += [f"{k}={v:.2f}" for k, v in u["dnsmos"].items()]
        if "hypothesis" in u:
            fields.append(u["hypothesis"])
        click.echo("\t".join(fields))
    if "corpus" in result:
        c, seed = result["corpus"], result["seed_tts_eval"]
        click.echo(
            f"corpus ({result['lang']}, n={c['n']}, {result['asr']['backend']}): wer={c['wer']:.4f} {_iv(c['wer_interval'])} "
            f"cer={c['cer']:.4f} {_iv(c['cer_interval'])} "
            f"(without number normalisation: wer={c['wer_raw']:.4f} cer={c['cer_raw']:.4f})"
        )
        click.echo(
            f"seed-tts-eval: {'cer' if result['lang'] == 'zh' else 'wer'}={seed['wer']:.4f} {_iv(seed['wer_interval'])} "
            f"(sub={seed['substitutions']:.4f} del={seed['deletions']:.4f} ins={seed['insertions']:.4f})"
        )
    if "speaker" in result:
        sp = result["speaker"]
        click.echo(
            f"speaker (n={sp['n']}, reference {sp['reference']}, {len(sp['reference_files'])} file(s)): "
            f"sim={sp['sim_mean']:.4f} {_iv(sp['sim_interval'])} pooled={sp['sim_pooled']:.4f} min={sp['sim_min']:.4f}"
        )
    if "naturalness" in result:
        nat = result["naturalness"]
        click.echo(
            f"dnsmos (n={nat['n']}): "
            + " ".join(f"{k}={nat[k]['mean']:.3f} {_iv(nat[k]['interval'])}" for k in ("sig", "bak", "ovrl", "p808"))
        )
    if json_out is not None:
        atomic_write_json(json_out, result)
        log.info("wrote %s", json_out)


def _iv(interval: list[float] | None) -> str:
    return "[n/a]" if interval is None else f"[{interval[0]:.4f}, {interval[1]:.4f}]"


# evaluate, evaluate-reference and evaluate-latency take one set of options (EvaluateSettings: the
# build gives them the same), each declared once on its config's field (evaluate_config.py).
@click.command("evaluate")
@declared_options(EvaluateConfig)
def evaluate(**options: Any) -> None:
    """Run the quality gate on an artifact and write JSON/Markdown/HTML reports.

    Exits 0 when every threshold passes, 1 when any fails (the report names which and by how much),
    2 on bad input.
    """
    from chattts_forge.evaluate.evaluate import evaluate_artifact
    from chattts_forge.evaluate.report_record import check_report  # msgspec: ~60-150 ms of `evaluate --help`

    config = EvaluateConfig(**options)
    # evaluate assembles the report as builtins; the verdict is read from its typed record
    record = check_report(evaluate_artifact(config.artifact, config.reference, config))
    for c in record.gate.checks:
        click.echo(f"{c.status:>12}  {c.message}")
    verdict = "PASSED" if record.passed else "FAILED (" + ", ".join(record.gate.failed) + ")"
    click.echo(f"gate {verdict}; reports in {config.out}")
    if not record.passed:
        sys.exit(1)


@click.command("evaluate-reference")
@declared_options(EvaluateSettings)
def evaluate_reference(**options: Any) -> None:
    """Measure what every evaluation against REFERENCE shares, once: its latency run and audio, ChatTTS's
    PyTorch baseline, the ASR of its audio and the FP32 runs fidelity replays, into --out (read by
    `evaluate --reference-run`).

    Takes evaluate's options, so that one set of options serves both; those that only shape the
    artifact's side (gate, buckets, phrase cache, listening, seams, cloning, Ray) are ignored.
    """
    from chattts_forge.evaluate.reference_run import evaluate_reference as measure

    out = options["out"]
    options["out"] = None  # the config's `out` is a report folder; the run goes to --out itself
    config = EvaluateConfig(**options)
    measure(config.reference, out, config)
    click.echo(f"reference run written to {out}")


@click.command("evaluate-latency")
@declared_options(LatencyRunConfig)
def evaluate_latency(artifacts: tuple[Path, ...], **options: Any) -> None:
    """Time every --artifact against REFERENCE in the same interleaved rounds, into --out (read by
    `evaluate --latency-run`): each variant's latency record, audio and RTF ratio, the reference
    synthesized once per round for all of them.

    Takes evaluate's options, so that one set of options serves both; those that do not shape the
    timings (gate, fidelity, buckets, phrase cache, listening, seams, baseline, ASR, Ray) are ignored.
    """
    from chattts_forge.evaluate.latency_run import measure_latency_run

    out = options["out"]
    options["out"] = None  # the config's `out` is a report folder; the run goes to --out itself
    config = EvaluateConfig(**options)
    measure_latency_run(config.reference, list(artifacts), out, config)
    click.echo(f"latency run written to {out}")
