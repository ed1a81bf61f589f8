"""CLI of the evaluate stage: `chattts-forge score` and `chattts-forge evaluate`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from chattts_forge.log import get_logger

log = get_logger(__name__)


@click.command("score")
@click.option("--audio-dir", required=True, type=click.Path(path_type=Path), help="Folder of <id>.wav files.")
@click.option(
    "--transcripts", required=True, type=click.Path(path_type=Path), help="ID<TAB>sentence per line (UTF-8)."
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
@click.option("--threads", type=int, default=None, help="ASR CPU threads (default: OMP_NUM_THREADS or up to 4).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Write the full result here.")
def score(
    audio_dir: Path,
    transcripts: Path,
    asr: str,
    asr_model: Path | None,
    lang: str | None,
    threads: int | None,
    json_out: Path | None,
) -> None:
    """Score audio against transcripts with a real ASR: per-utterance and pooled WER/CER."""
    from chattts_forge.evaluate.score import score_audio_dir

    from chattts_forge.fsutil import atomic_write_json

    result = score_audio_dir(audio_dir, transcripts, asr=asr, asr_model=asr_model, lang=lang, threads=threads)
    for u in result["utterances"]:
        click.echo(f"{u['id']}\twer={u['wer']:.3f}\tcer={u['cer']:.3f}\t{u['hypothesis']}")
    c = result["corpus"]
    click.echo(
        f"corpus ({result['lang']}, n={c['n']}, {result['asr']['backend']}): wer={c['wer']:.4f} cer={c['cer']:.4f} "
        f"(without number normalisation: wer={c['wer_raw']:.4f} cer={c['cer_raw']:.4f})"
    )
    if json_out is not None:
        atomic_write_json(json_out, result)
        log.info("wrote %s", json_out)


@click.command("evaluate")
@click.option("--artifact", required=True, type=click.Path(path_type=Path), help="Artifact folder to judge.")
@click.option("--reference", required=True, type=click.Path(path_type=Path), help="The FP32 artifact it came from.")
@click.option("--corpus", required=True, type=click.Path(path_type=Path), help="Held-out text corpus.")
@click.option("--gate", "gate_path", type=click.Path(path_type=Path), default=None, help="GATE.toml (default: shipped).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Report folder.")
def evaluate(artifact: Path, reference: Path, corpus: Path, gate_path: Path | None, out: Path) -> None:
    """Run the quality gate on an artifact and write JSON/Markdown/HTML reports."""
    from chattts_forge.evaluate.evaluate import evaluate_artifact

    report = evaluate_artifact(artifact, reference, corpus, gate=gate_path, out=out)
    if not report["passed"]:
        sys.exit(1)


__all__ = ["score", "evaluate", "json"]
