"""What one `calibrate` run is asked to do: `CalibrateConfig`, every option of `chattts-forge
calibrate` declared once on its field (chattts_forge.options): the command's click options
(`declared_options`) and the words the build driver puts in its calibrate step (`option_args`) are
derived from it.

Light on purpose (no numpy, no onnxruntime): the build driver imports it to spell its steps.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput
from chattts_forge.options import option

DEFAULT_MAX_SAMPLES = 512  # the seed note's "500 business sentences"
# Sentences generated as one batch: a GPT step reads the whole 755 MB graph whatever the rows, so 8 rows
# cost about one (docs/measurements/2026-12-01-xeon/calibration-curve.md); the prefill stays per row.
DEFAULT_BATCH_SIZE = 8
# Batches generated in one GPT call, each still sampled and observed as a batch of its own (SeedGroups):
# a 32-row step costs ~0.6x per row what an 8-row one does on CPU (docs/measurements/2026-12-03-epyc/
# calibrate.md), while the statistics stay those of 8-row batches up to float rounding.
DEFAULT_BATCHES_PER_CALL = 4


def parse_max_samples(value: int | str | None) -> int | None:
    """`--max-samples`: a count >= 1, or "all" (None: every usable sentence)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadInput(f"--max-samples must be a count or 'all', got {value!r}") from None
    if n < 1:
        raise BadInput(f"--max-samples must be >= 1, got {n}")
    return n


@dataclass(frozen=True)
class CalibrateConfig:
    """The settings of one `calibrate` run, each command-line option declared on its field.

    `artifact_dir`, `corpus`, `out_dir`: what the command reads and writes (keyword-only; the library's
    `calibrate(artifact_dir, corpus, out_dir, config)` takes them as arguments and ignores these)."""

    artifact_dir: Path | None = option(
        None, "--artifact", "FP32 artifact folder (output of `convert`).", kind="path", required=True, kw_only=True
    )
    corpus: str = option(
        "builtin:calibration",
        "--corpus",
        "A .txt file (one sentence per line), a folder of .txt files, or builtin:SPLIT[/NAME].",
        show_default=True,
        kw_only=True,
    )
    out_dir: Path | None = option(
        None, "--out", "Calibration folder to write.", kind="path", required=True, kw_only=True
    )
    # a count, or "all"; spelled as the command line reads it (parse_max_samples)
    max_samples: int | str | None = option(
        str(DEFAULT_MAX_SAMPLES),
        "--max-samples",
        "Sentences to synthesize (stratified by corpus file), or 'all' for the whole corpus.",
        show_default=True,
    )
    seed: int = option(0, "--seed", "Sentence order, speakers and sampling.", kind=int, show_default=True)
    max_new_token: int = option(96, "--max-new-token", "GPT steps per sentence at most.", kind=int, show_default=True)
    # decode steps observed per batch (every row of it), besides each prefill
    decode_positions: int = option(
        6, "--decode-positions", "Decode steps recorded per sentence (besides the prefill).", kind=int,
        show_default=True,
    )
    max_past: int = option(
        192,
        "--max-past",
        "Only decode steps whose past length is at most this enter the raw sample (disk).",
        kind=int,
        show_default=True,
    )
    head_steps: int = 16  # code-head steps observed per batch; no CLI option
    disk_budget_mb: float = option(
        512.0,
        "--disk-budget-mb",
        "Disk for the statistics and the raw sample, whatever the corpus size.",
        kind=float,
        show_default=True,
    )
    threads: int | None = option(None, "--threads", "onnxruntime intra-op threads (default: all).", kind=int)
    progress: bool | None = None  # progress bars (None: when the output is a terminal); no CLI option
    merge: Sequence[str | os.PathLike[str]] = option(
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
    raw_sample_counts: dict[str, int] | None = None  # per component, over RAW_SAMPLE_COUNTS; no CLI option
    # sentences whose decode steps are observed together (one seed)
    batch_size: int = option(
        DEFAULT_BATCH_SIZE,
        "--batch-size",
        "Sentences generated together (each its own speaker; decode steps observed per batch).",
        kind=int,
        show_default=True,
    )
    # batches generated in one GPT call (each sampled as alone)
    batches_per_call: int = option(
        DEFAULT_BATCHES_PER_CALL,
        "--batches-per-call",
        "Batches generated in one GPT call, each sampled and observed as if alone (faster on CPU).",
        kind=int,
        show_default=True,
    )

    def check(self) -> None:
        if self.max_new_token < 2:
            raise BadInput(f"--max-new-token must be >= 2, got {self.max_new_token}")
        if self.decode_positions < 0 or self.max_past < 1 or self.head_steps < 0:
            raise BadInput("decode positions and head steps must be >= 0 and max past >= 1")
        if self.disk_budget_mb <= 0:
            raise BadInput(f"--disk-budget-mb must be > 0, got {self.disk_budget_mb}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise BadInput(f"--batch-size must be a whole number >= 1, got {self.batch_size!r}")
        calls = self.batches_per_call
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise BadInput(f"--batches-per-call must be a whole number >= 1, got {calls!r}")

    def settings(self, count: int | None) -> dict[str, Any]:
        """What the manifest records (and `--merge` compares: `MERGE_SETTINGS`)."""
        return {
            "max_samples": count if count is not None else "all",
            "max_new_token": self.max_new_token,
            "decode_positions_per_batch": self.decode_positions,
            "max_past": self.max_past,
            "head_steps_per_batch": self.head_steps,
            "threads": self.threads,
            "batch_size": self.batch_size,
            "batches_per_call": self.batches_per_call,
            "observed_steps": (
                f"every sentence's prefill (its own row, unpadded); {self.decode_positions} decode steps and "
                f"{self.head_steps} code-head steps per batch of up to {self.batch_size} sentences (drawn with the "
                "seed of the batch's first sentence), every row still generating contributing one sample each"),
            "batches": "sentences sorted by normalised length, then cut into batches (corpus order at batch size 1); "
                       f"{self.batches_per_call} consecutive batches generated in one GPT call, each sampled with its "
                       "own seed as if alone",
            "sampling": "ChatTTS InferCodeParams defaults; each sentence's speaker from the run seed and its text; "
                        "the code sampling seed of a batch from its first sentence",
            "past_kv_storage": "float16",
        }

