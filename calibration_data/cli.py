"""`chattts-forge calibrate`: record calibration inputs of an FP32 artifact from a text corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chattts_forge.log import get_logger

log = get_logger(__name__)


@click.command("calibrate")
@click.option("--artifact", "artifact_dir", required=True, type=click.Path(path_type=Path),
              help="FP32 artifact folder (output of `convert`).")
@click.option("--corpus", default="builtin:calibration", show_default=True,
              help="A .txt file (one sentence per line), a folder of .txt files, or builtin:SPLIT[/NAME].")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Calibration folder to write.")
@click.option("--max-samples", default="512", show_default=True,
              help="Sentences to synthesize (stratified by corpus file), or 'all' for the whole corpus.")
@click.option("--seed", default=0, show_default=True, type=int, help="Sentence order, speakers and sampling.")
@click.option("--max-new-token", default=96, show_default=True, type=int, help="GPT steps per sentence at most.")
@click.option("--decode-positions", default=6, show_default=True, type=int,
              help="Decode steps recorded per sentence (besides the prefill).")
@click.option("--max-past", default=192, show_default=True, type=int,
              help="Only decode steps whose past length is at most this enter the raw sample (disk).")
@click.option("--disk-budget-mb", default=512.0, show_default=True, type=float,
              help="Disk for the statistics and the raw sample, whatever the corpus size.")
@click.option("--merge", "merge", multiple=True, type=click.Path(path_type=Path),
              help="An earlier calibration folder (repeatable) whose statistics and raw sample are merged in; "
                   "its sentences are not synthesized again.")
@click.option("--allow-one-language", is_flag=True, help="Accept a corpus whose sentences are all one language.")
@click.option("--threads", default=None, type=int, help="onnxruntime intra-op threads (default: all).")
@click.option("--batch-size", default=8, show_default=True, type=int,
              help="Sentences generated together (each its own speaker; decode steps observed per batch).")
@click.option("--batches-per-call", default=4, show_default=True, type=int,
              help="Batches generated in one GPT call, each sampled and observed as if alone (faster on CPU).")
def calibrate(artifact_dir: Path, corpus: str, out_dir: Path, **options: Any) -> None:
    """Run the FP32 artifact over a corpus and record the inputs of every quantizable graph.

    Streams statistics (activation ranges and histograms, per-channel importance, X^T X for GPTQ,
    KV-cache ranges) plus a small seeded sample of raw inputs into OUT, in bounded memory and disk, with
    a manifest (corpus, sentences by sha256 and per file, bounds) that `chattts-forge quantize
    --calibration OUT` reads.
    """
    from chattts_forge.calibration_data.calibrate import CalibrateConfig
    from chattts_forge.calibration_data.calibrate import calibrate as run

    out = run(artifact_dir, corpus, out_dir, CalibrateConfig(**options))
    click.echo(str(out))
