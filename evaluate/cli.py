"""CLI of the evaluate stage: `chattts-forge score` and `chattts-forge evaluate`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from chattts_forge.cli_options import PROVIDER_HELP
from chattts_forge.log import get_logger
from chattts_forge.options import declared_options, option

log = get_logger(__name__)


@click.command("score")
@click.option("--audio-dir", required=True, type=click.Path(path_type=Path), help="Folder of <id>.wav files.")
@click.option(
    "--transcripts",
    default=None,
    type=click.Path(path_type=Path),
    help="ID<TAB>sentence per line (UTF-8): WER/CER. Without it no ASR runs and every *.wav is scored "
    "for --speaker-reference / --mos only.",
)
@click.option(
    "--asr", default="faster-whisper", show_default=True, help="ASR backend: faster-whisper or pocketsphinx."
)
@click.option(
    "--asr-model",
    type=click.Path(path_type=Path),
    default=None,
    help="A faster-whisper model folder (default: tiny.en for en, Whisper base for zh, from the asr wheels).",
)
@click.option(
    "--lang", type=click.Choice(["en", "zh"]), default=None, help="Language (default: guessed from the text)."
)
@click.option("--threads", type=int, default=None, help="ASR/DNSMOS CPU threads (default: OMP_NUM_THREADS or up to 4).")
@click.option(
    "--speaker-reference",
    type=click.Path(path_type=Path),
    default=None,
    metavar="WAV|DIR",
    help="Speaker similarity (GE2E cosine) of every utterance to this recording, or to the pooled embedding "
    "of every *.wav in this folder.",
)
@click.option("--mos", is_flag=True, help="DNSMOS SIG/BAK/OVRL (P.835) and P.808 per utterance and their means.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Write the full result here.")
def score(audio_dir: Path, transcripts: Path | None, json_out: Path | None, **options: Any) -> None:
    """Score audio: WER/CER against transcripts with a real ASR (ours and Seed-TTS-eval's), speaker
    similarity to a reference (--speaker-reference) and DNSMOS naturalness (--mos), each corpus figure
    with its 95% bootstrap interval over utterances."""
    from chattts_forge.evaluate.score import ScoreSettings, score_audio_dir
    from chattts_forge.fsutil import atomic_write_json

    result = score_audio_dir(audio_dir, transcripts, ScoreSettings(**options))
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


# The options of an evaluation's settings (EvaluateConfig), shared by `evaluate`, `evaluate-reference`
# and `evaluate-latency`: the build driver gives them the same evaluate options, and the reference run
# must be measured with exactly the settings the evaluations read it with. Declared once
# (chattts_forge.options): the commands' click options and the driver's step words come from here.
@dataclass(frozen=True)
class EvaluateSettingsOptions:
    reference: Path | None = option(None, "--reference", "The FP32 artifact it came from.", kind="path", required=True)
    corpus: str | None = option(
        None, "--corpus", "Held-out corpus: a .txt file (one sentence per line), a folder, or builtin:evaluation.",
        required=True)
    gate_path: Path | None = option(None, "--gate", "GATE.toml (default: shipped).", kind="path")
    out: Path | None = option(None, "--out", "Report folder (report.json/.md/.html).", kind="path", required=True)
    max_sentences: int = option(8, "--max-sentences", "Sentences synthesized per variant.", kind=int, show_default=True)
    max_new_token: int = option(96, "--max-new-token", "GPT steps budget per sentence.", kind=int, show_default=True)
    fidelity_sentences: int = option(8, "--fidelity-sentences", kind=int, show_default=True)
    fidelity_steps: int = option(48, "--fidelity-steps", kind=int, show_default=True)
    threads: int = option(2, "--threads", "Threads for every runtime (fixed).", kind=int, show_default=True)
    batches: str = option("1,4,8", "--batch", "Batch sizes for throughput.", show_default=True)
    seed: int = option(0, "--seed", kind=int, show_default=True)
    asr: str = option("faster-whisper", "--asr", "ASR backend for WER/CER (real checkpoints).", show_default=True)
    asr_model: Path | None = option(None, "--asr-model", "A faster-whisper model folder.", kind="path")
    baseline_checkpoint: Path | None = option(
        None, "--baseline-checkpoint", "ChatTTS checkpoint to time ChatTTS's PyTorch FP32 pipeline on in this run "
        "(default: the checkpoint the artifact was converted from, when present and torch is installed).",
        kind="path")
    no_baseline: bool = option(False, "--no-baseline", "Skip the PyTorch FP32 baseline.", is_flag=True)
    provider: str = option("cpu", "--provider", PROVIDER_HELP, show_default=True)
    bucket_sentences: int = option(
        4, "--bucket-sentences",
        "Held-out sentences per length bucket (the report's buckets section, the routing table's input).", kind=int,
        show_default=True)
    cache_phrases: int = option(
        8, "--cache-phrases", "Shipped customer-service phrases timed with and without a phrase cache (0: skip).",
        kind=int, show_default=True)
    ray_address: str | None = option(
        None, "--ray", "Shard fidelity and ASR over a Ray cluster (needs the scale extra; latency stays here).",
        metavar="ADDRESS|local")
    ray_workers: int = option(2, "--ray-workers", "Ray actors (one corpus shard each).", kind=int, show_default=True)
    listen_sentences: int = option(
        3, "--listen-sentences", "Held-out sentences written beside the report as MP3 + mel spectrograms (the version "
        "page's players).", kind=click.IntRange(min=0), show_default=True)
    seam_sentences: int = option(
        3, "--seam-sentences",
        "Sentences whose streamed audio is compared with their whole-text audio (stream seams; 0: skip).",
        kind=click.IntRange(min=0), show_default=True)
    seam_lookahead: int | None = option(
        None, "--seam-lookahead", "Mel frames of the lookahead stream measured beside the default chunking (default: "
        "the artifact's recorded look-ahead, else 2; the recorded one is still measured and gated).",
        kind=click.IntRange(min=1))
    clone_reference: Path | None = option(
        None, "--clone-reference", "A recording (24 kHz mono): also judge SIM of the variant's cloned voice to it.",
        kind=click.Path(exists=True, dir_okay=False, path_type=Path))
    clone_transcript: str | None = option(
        None, "--clone-transcript", "What --clone-reference says (ChatTTS's txt_smp).")


@dataclass(frozen=True)
class EvaluateOptions(EvaluateSettingsOptions):
    """`chattts-forge evaluate`: the settings, the artifact judged and the shared runs it reads."""

    artifact: Path | None = option(None, "--artifact", "Artifact folder to judge.", kind="path", required=True)
    reference_run: Path | None = option(
        None, "--reference-run", "A folder `chattts-forge evaluate-reference` wrote with the same settings: the FP32 "
        "reference's latency run, audio, PyTorch baseline, ASR and fidelity runs are read from it, not measured again "
        "(the build does this once for all its variants).", kind=click.Path(exists=True, file_okay=False, path_type=Path))
    latency_run: Path | None = option(
        None, "--latency-run", "A folder `chattts-forge evaluate-latency` wrote with the same settings: this "
        "artifact's latency record, audio and interleaved RTF ratio against the reference are read from it (the build "
        "times all its variants in the same rounds).", kind=click.Path(exists=True, file_okay=False, path_type=Path))


@dataclass(frozen=True)
class LatencyRunOptions(EvaluateSettingsOptions):
    """`chattts-forge evaluate-latency`: the settings and every artifact timed."""

    artifacts: tuple[Path, ...] = option(
        (), "--artifact", "An artifact folder to time (repeat: every variant of the build).", kind="path",
        multiple=True, required=True)


def config_from_options(options: dict[str, Any]) -> Any:
    """The `EvaluateConfig` the command line's options describe (`--batch 1,4` -> (1, 4), ...)."""
    from chattts_forge.errors import ForgeError
    from chattts_forge.evaluate.evaluate import EvaluateConfig

    batches = options.pop("batches")
    try:
        batch_sizes = tuple(int(b) for b in batches.split(",") if b.strip())
    except ValueError:
        raise ForgeError(f"--batch must be comma-separated integers, got {batches!r}") from None
    if not batch_sizes or min(batch_sizes) < 1:
        raise ForgeError("--batch needs batch sizes >= 1")
    baseline, no_baseline = options.pop("baseline_checkpoint"), options.pop("no_baseline")
    return EvaluateConfig(
        batch_sizes=batch_sizes,
        baseline_checkpoint=None if no_baseline else (baseline or "auto"),
        gate=options.pop("gate_path"),
        ray=options.pop("ray_address"),
        **options,
    )


@click.command("evaluate")
@declared_options(EvaluateOptions)
def evaluate(artifact: Path, reference: Path, **options: Any) -> None:
    """Run the quality gate on an artifact and write JSON/Markdown/HTML reports.

    Exits 0 when every threshold passes, 1 when any fails (the report names which and by how much),
    2 on bad input.
    """
    from chattts_forge.evaluate.evaluate import evaluate_artifact

    report = evaluate_artifact(artifact, reference, config_from_options(options))
    for c in report["gate"]["checks"]:
        click.echo(f"{c['status']:>12}  {c['message']}")
    verdict = "PASSED" if report["passed"] else "FAILED (" + ", ".join(report["gate"]["failed"]) + ")"
    click.echo(f"gate {verdict}; reports in {options['out']}")
    if not report["passed"]:
        sys.exit(1)


@click.command("evaluate-reference")
@declared_options(EvaluateSettingsOptions)
def evaluate_reference(reference: Path, **options: Any) -> None:
    """Measure what every evaluation against REFERENCE shares, once: its latency run and audio, ChatTTS's
    PyTorch baseline, the ASR of its audio and the FP32 runs fidelity replays, into --out (read by
    `evaluate --reference-run`).

    Takes evaluate's options, so that one set of options serves both; those that only shape the
    artifact's side (gate, buckets, phrase cache, listening, seams, cloning, Ray) are ignored.
    """
    from chattts_forge.evaluate.reference_run import evaluate_reference as measure

    out = options["out"]
    options["out"] = None  # the config's `out` is a report folder; the run goes to --out itself
    measure(reference, out, config_from_options(options))
    click.echo(f"reference run written to {out}")


@click.command("evaluate-latency")
@declared_options(LatencyRunOptions)
def evaluate_latency(reference: Path, artifacts: tuple[Path, ...], **options: Any) -> None:
    """Time every --artifact against REFERENCE in the same interleaved rounds, into --out (read by
    `evaluate --latency-run`): each variant's latency record, audio and RTF ratio, the reference
    synthesized once per round for all of them.

    Takes evaluate's options, so that one set of options serves both; those that do not shape the
    timings (gate, fidelity, buckets, phrase cache, listening, seams, baseline, ASR, Ray) are ignored.
    """
    from chattts_forge.evaluate.latency_run import measure_latency_run

    out = options["out"]
    options["out"] = None  # the config's `out` is a report folder; the run goes to --out itself
    measure_latency_run(reference, list(artifacts), out, config_from_options(options))
    click.echo(f"latency run written to {out}")
