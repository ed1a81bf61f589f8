"""`chattts-forge calibrate`: record calibration inputs of an FP32 artifact from a text corpus.

`CalibrateOptions` declares the command's options once (chattts_forge.options): its click options
and the words the build driver puts in its calibrate step (`option_args`) are derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from chattts_forge.log import get_logger
from chattts_forge.options import declared_options, option

log = get_logger(__name__)


@dataclass(frozen=True)
class CalibrateOptions:
    """The options of `chattts-forge calibrate` (the library's own settings are CalibrateConfig's)."""

    artifact_dir: Path | None = option(
        None, "--artifact", "FP32 artifact folder (output of `convert`).", kind="path", required=True
    )
    corpus: str = option(
        "builtin:calibration",
        "--corpus",
        "A .txt file (one sentence per line), a folder of .txt files, or builtin:SPLIT[/NAME].",
        show_default=True,
    )
    out_dir: Path | None = option(None, "--out", "Calibration folder to write.", kind="path", required=True)
    max_samples: str = option(
        "512",
        "--max-samples",
        "Sentences to synthesize (stratified by corpus file), or 'all' for the whole corpus.",
        show_default=True,
    )
    seed: int = option(0, "--seed", "Sentence order, speakers and sampling.", kind=int, show_default=True)
    max_new_token: int = option(
        96, "--max-new-token", "GPT steps per sentence at most.", kind=int, show_default=True
    )
    decode_positions: int = option(
        6,
        "--decode-positions",
        "Decode steps recorded per sentence (besides the prefill).",
        kind=int,
        show_default=True,
    )
    max_past: int = option(
        192,
        "--max-past",
        "Only decode steps whose past length is at most this enter the raw sample (disk).",
        kind=int,
        show_default=True,
    )
    disk_budget_mb: float = option(
        512.0,
        "--disk-budget-mb",
        "Disk for the statistics and the raw sample, whatever the corpus size.",
        kind=float,
        show_default=True,
    )
    merge: tuple[Path, ...] = option(
        (),
        "--merge",
        "An earlier calibration folder (repeatable) whose statistics and raw sample are merged in; "
        "its sentences are not synthesized again.",
        kind="path",
        multiple=True,
    )
    allow_one_language: bool = option(
        False, "--allow-one-language", "Accept a corpus whose sentences are all one language.", is_flag=True
    )
    threads: int | None = option(None, "--threads", "onnxruntime intra-op threads (default: all).", kind=int)
    batch_size: int = option(
        8,
        "--batch-size",
        "Sentences generated together (each its own speaker; decode steps observed per batch).",
        kind=int,
        show_default=True,
    )
    batches_per_call: int = option(
        4,
        "--batches-per-call",
        "Batches generated in one GPT call, each sampled and observed as if alone (faster on CPU).",
        kind=int,
        show_default=True,
    )


@click.command("calibrate")
@declared_options(CalibrateOptions)
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
