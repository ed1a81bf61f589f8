"""What one evaluation is asked to do: `EvaluateConfig` (`evaluate_artifact`, `chattts-forge
evaluate`), the settings it shares with `evaluate-reference` and `evaluate-latency`
(`EvaluateSettings`) and `LatencyRunConfig` (`evaluate-latency`).

Each command-line option is declared once, on its field (chattts_forge.options): the commands' click
options (`declared_options`) and the words the build driver puts in its evaluate steps (`option_args`)
are derived from them. The three commands share the settings because the build gives them the same
options: the reference run must be measured with exactly the settings the evaluations read it with.

Light on purpose (no numpy, no onnxruntime): the build driver imports it to spell its steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from chattts_forge.cli_options import PROVIDER_HELP
from chattts_forge.errors import BadInput, NotFound
from chattts_forge.options import option

AUTO_BASELINE = "auto"  # the artifact's source checkpoint, when present and torch is installed


def parse_batch_sizes(spelled: str) -> tuple[int, ...]:
    """`--batch 1,4` -> (1, 4)."""
    try:
        sizes = tuple(int(b) for b in spelled.split(",") if b.strip())
    except ValueError:
        raise BadInput(f"--batch must be comma-separated integers, got {spelled!r}", param="batch") from None
    if not sizes or min(sizes) < 1:
        raise BadInput("--batch needs batch sizes >= 1", param="batch")
    return sizes


def _spell_batch_sizes(sizes: tuple[int, ...]) -> str:
    return ",".join(str(b) for b in sizes)


def _spell_baseline(checkpoint: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    # "auto" is the option left out; None (no baseline) is spelled by --no-baseline
    return None if checkpoint == AUTO_BASELINE else checkpoint


def _read_baseline(spelled: Path | None) -> str | Path:
    return AUTO_BASELINE if spelled is None else spelled


@dataclass(frozen=True)
class EvaluateSettings:
    """How one evaluation runs, and the options `evaluate`, `evaluate-reference` and `evaluate-latency`
    share (EvaluateConfig adds the judged artifact and the shared runs it reads).

    `reference`: the FP32 artifact (keyword-only; the commands' --reference, which the library
    functions take as an argument instead).
    `corpus`: the held-out sentences (a .txt file, a folder, or builtin:evaluation), the first
    `max_sentences` synthesized per variant with `max_new_token` GPT steps; `gate`: a GATE.toml
    (None: the shipped one); `out`: the report folder (None: nothing written).
    `provider` (cpu, cuda, auto) is where the artifacts are synthesized and timed (latency, and the
    audio for ASR); fidelity (`fidelity_sentences` x `fidelity_steps`) is a numeric comparison of
    graphs and always runs on the CPU.
    `baseline_checkpoint`: the ChatTTS checkpoint to time ChatTTS's PyTorch FP32 pipeline on in the
    same run; "auto" (default) uses the checkpoint the artifact was converted from (artifact.json
    ``source.asset_dir``) when it still exists and torch is installed; None (or `no_baseline`) skips it.
    `bucket_sentences`: held-out sentences per length bucket (the ``buckets`` section, evaluate.buckets);
    `cache_phrases`: phrases of the shipped customer-service list timed with and without a phrase cache
    (the ``phrase_cache`` section, evaluate.serving; 0 skips it).
    `ray`: a Ray cluster address or "local": fidelity and ASR run sharded over `ray_workers` actors
    (`ray_shards`; same figures), latency still here; a dead worker's shard is retried `ray_retries`
    times. `ray_shard_hook(kind, shard)` runs in the worker before each shard (tests kill it there).
    `listen_sentences`: sentences whose audio (MP3) and mel spectrograms are written beside the report
    for the version page; `seam_sentences`: sentences streamed to measure stream seams, default chunking
    and with `seam_lookahead` mel frames of right context (default: the artifact's recorded look-ahead, else
    `seams.DEFAULT_LOOKAHEAD_FRAMES`; an override still measures the recorded one, which the gate judges);
    `clone_reference`: a recording to clone (its transcript `clone_transcript`, optional): SIM of the
    artifact's cloned output to it is the ``clone_similarity`` metric.
    """

    reference: Path | None = option(
        None, "--reference", "The FP32 artifact it came from.", kind="path", required=True, kw_only=True)
    corpus: str | os.PathLike[str] = option(
        "builtin:evaluation", "--corpus",
        "Held-out corpus: a .txt file (one sentence per line), a folder, or builtin:evaluation.", required=True)
    gate: str | os.PathLike[str] | None = option(None, "--gate", "GATE.toml (default: shipped).", kind="path")
    out: str | os.PathLike[str] | None = option(
        None, "--out", "Report folder (report.json/.md/.html).", kind="path", required=True)
    max_sentences: int = option(8, "--max-sentences", "Sentences synthesized per variant.", kind=int, show_default=True)
    max_new_token: int = option(96, "--max-new-token", "GPT steps budget per sentence.", kind=int, show_default=True)
    fidelity_sentences: int = option(8, "--fidelity-sentences", kind=int, show_default=True)
    fidelity_steps: int = option(48, "--fidelity-steps", kind=int, show_default=True)
    threads: int | None = option(2, "--threads", "Threads for every runtime (fixed).", kind=int, show_default=True)
    seed: int = option(0, "--seed", kind=int, show_default=True)
    batch_sizes: tuple[int, ...] = option(
        (1, 4, 8), "--batch", "Batch sizes for throughput.", show_default=True, spell=_spell_batch_sizes,
        convert=parse_batch_sizes)
    asr: str = option("faster-whisper", "--asr", "ASR backend for WER/CER (real checkpoints).", show_default=True)
    asr_model: str | os.PathLike[str] | None = option(
        None, "--asr-model", "A faster-whisper model folder.", kind="path")
    baseline_checkpoint: str | os.PathLike[str] | None = option(
        AUTO_BASELINE, "--baseline-checkpoint", "ChatTTS checkpoint to time ChatTTS's PyTorch FP32 pipeline on in "
        "this run (default: the checkpoint the artifact was converted from, when present and torch is installed).",
        kind="path", spell=_spell_baseline, convert=_read_baseline)
    # the command line's way to say baseline_checkpoint=None (the option left out means "auto")
    no_baseline: bool = option(False, "--no-baseline", "Skip the PyTorch FP32 baseline.", is_flag=True)
    progress: bool | None = None  # progress bars (None: when the output is a terminal); no CLI option
    provider: str = option("cpu", "--provider", PROVIDER_HELP, show_default=True)
    bucket_sentences: int = option(
        4, "--bucket-sentences",
        "Held-out sentences per length bucket (the report's buckets section, the routing table's input).", kind=int,
        show_default=True)
    cache_phrases: int = option(
        8, "--cache-phrases", "Shipped customer-service phrases timed with and without a phrase cache (0: skip).",
        kind=int, show_default=True)
    ray: str | None = option(
        None, "--ray", "Shard fidelity and ASR over a Ray cluster (needs the scale extra; latency stays here).",
        metavar="ADDRESS|local")
    ray_workers: int = option(2, "--ray-workers", "Ray actors (one corpus shard each).", kind=int, show_default=True)
    ray_retries: int = 1  # no CLI option
    ray_shard_hook: Callable[[str, int], None] | None = None  # no CLI option
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
    clone_reference: str | os.PathLike[str] | None = option(
        None, "--clone-reference", "A recording (24 kHz mono): also judge SIM of the variant's cloned voice to it.",
        kind=click.Path(exists=True, dir_okay=False, path_type=Path))
    clone_transcript: str | None = option(
        None, "--clone-transcript", "What --clone-reference says (ChatTTS's txt_smp).")

    def __post_init__(self) -> None:
        if self.no_baseline:  # one field the library reads: no baseline is baseline_checkpoint None
            object.__setattr__(self, "baseline_checkpoint", None)

    def check(self) -> None:
        """One-line ForgeError on settings no evaluation can run with."""
        if self.max_sentences < 1 or self.max_new_token < 1:
            raise BadInput("max_sentences and max_new_token must be >= 1")
        if self.bucket_sentences < 1 or self.cache_phrases < 0:
            raise BadInput("bucket_sentences must be >= 1 and cache_phrases >= 0")
        if self.listen_sentences < 0 or self.seam_sentences < 1:
            raise BadInput("listen_sentences must be >= 0 and seam_sentences >= 1")
        if self.clone_reference is not None and not Path(self.clone_reference).is_file():
            raise NotFound(f"cloning recording {self.clone_reference} does not exist")

    @property
    def show(self) -> bool:
        """Progress bars: None lets tqdm decide (terminal only), which the phases pass on as True."""
        return True if self.progress is None else bool(self.progress)


@dataclass(frozen=True)
class EvaluateConfig(EvaluateSettings):
    """`evaluate_artifact`'s config and `chattts-forge evaluate`'s options: the settings, the artifact
    judged (`artifact`, keyword-only: the command's --artifact, an argument of the library function)
    and the shared runs it reads.

    `reference_run`: a folder `evaluate-reference` wrote (evaluate.reference_run): the FP32 reference's
    latency run, audio, PyTorch baseline, ASR and the FP32 runs fidelity replays are read from it
    instead of measured again (the build measures them once for all its variants); None: measured here.
    `latency_run`: a folder `evaluate-latency` wrote (evaluate.latency_run): the artifact's latency
    record, audio and interleaved RTF ratio against the reference, timed in the same rounds as the
    build's other variants, are read from it; None: timed here against the reference.
    """

    artifact: Path | None = option(
        None, "--artifact", "Artifact folder to judge.", kind="path", required=True, kw_only=True)
    reference_run: str | os.PathLike[str] | None = option(
        None, "--reference-run", "A folder `chattts-forge evaluate-reference` wrote with the same settings: the FP32 "
        "reference's latency run, audio, PyTorch baseline, ASR and fidelity runs are read from it, not measured again "
        "(the build does this once for all its variants).", kind=click.Path(exists=True, file_okay=False, path_type=Path))
    latency_run: str | os.PathLike[str] | None = option(
        None, "--latency-run", "A folder `chattts-forge evaluate-latency` wrote with the same settings: this "
        "artifact's latency record, audio and interleaved RTF ratio against the reference are read from it (the build "
        "times all its variants in the same rounds).", kind=click.Path(exists=True, file_okay=False, path_type=Path))


@dataclass(frozen=True)
class LatencyRunConfig(EvaluateSettings):
    """`chattts-forge evaluate-latency`'s options: the settings and every artifact timed (the library's
    `measure_latency_run` takes the artifacts as an argument, the settings as an EvaluateConfig)."""

    artifacts: tuple[Path, ...] = option(
        (), "--artifact", "An artifact folder to time (repeat: every variant of the build).", kind="path",
        multiple=True, required=True, kw_only=True)

