"""The build's latency run: every variant timed against the FP32 reference in the same interleaved rounds.

Each evaluation's gate RTF ratio is an interleaved comparison with the FP32 reference
(`latency.measure_against`): every sentence synthesized by the artifact and by the reference in turn.
Evaluated one by one, a build times the FP32 reference again for every variant: its half of each
pair of rounds, and its first audio, throughput and memory probe. `measure_latency_run` times all the
variants of a build in one comparison instead (`latency.measure_against_many`): per round the
reference once and every variant once, the order rotated, until every variant's ratio is within the
bound or the time cap; the tail (first audio, throughput) is measured once per side, in turn, and each
variant's memory in a process of its own (`memory_probe.measure_memory`; the reference's by its own
run, evaluate.reference_run).
Each variant's record and ratio are the figures `measure_against` gives (same definitions, same
stopping rules), measured on one clock with the reference and the other variants.

The build driver runs it as its own keyed step after the quantize steps (`chattts-forge
evaluate-latency`, the folder ``BUILD/<run>/latency_run``); each `chattts-forge evaluate
--latency-run DIR` reads its variant's pair from it (checking the reference's and the artifact's
files and the settings) instead of timing it again. Without `--latency-run` evaluate times itself.

The folder: ``latency_run.json`` (schema ``chattts-forge/latency-run/1``: the settings, the
reference's record, per variant the sha256 of its files, its record and its interleaved ratio) and
``latency_waves.npz`` (every side's audio of the first pass, float32, as synthesized: the input of
the evaluations' ASR, speaker similarity and listen files).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.errors import BadInput, IntegrityError, NotFound
from chattts_forge.evaluate.report_assembly import describe_artifact
from chattts_forge.fsutil import atomic_output_dir, atomic_write_bytes, atomic_write_json
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.runtime.providers import resolve_provider

if TYPE_CHECKING:
    from chattts_forge.evaluate.evaluate_config import EvaluateConfig
    from chattts_forge.evaluate.latency import PairLatency

log = get_logger(__name__)

LATENCY_RUN_SCHEMA = "chattts-forge/latency-run/1"
RECORD_FILE = "latency_run.json"
WAVES_FILE = "latency_waves.npz"
REFERENCE = "reference"  # the reference's key in the waves file


def files_sha256(files: dict[str, Any]) -> str:
    """One digest of an artifact description's files (describe_artifact's ``files``)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def latency_settings(reference_files: dict[str, Any], corpus: Any, cfg: EvaluateConfig, provider: str) -> dict[str, Any]:
    """What the timings depend on besides the artifacts: the reference, the sentences, the settings."""
    return {
        "reference_files_sha256": files_sha256(reference_files),
        "corpus_sha256": corpus.sha256,
        "sentences": len(corpus.sentences),
        "max_new_token": cfg.max_new_token,
        "seed": cfg.seed,
        "threads": cfg.threads,
        "batch_sizes": list(cfg.batch_sizes),
        "provider": provider,
    }


def measure_latency_run(reference: Path, artifacts: list[Path], out: Path, cfg: EvaluateConfig) -> dict[str, PairLatency]:
    """`chattts-forge evaluate-latency`: time every artifact against `reference` in one interleaved
    comparison and write the run to `out` (replaced atomically). Returns {variant: its pair}."""
    from chattts_forge.evaluate import latency as latency_mod
    from chattts_forge.evaluate.evaluate import latency_config

    for folder in (reference, *artifacts):
        if not Path(folder).is_dir():
            raise NotFound(f"artifact folder {folder} does not exist")
    if not artifacts:
        raise BadInput("evaluate-latency needs at least one --artifact")
    cfg.check()
    provider = resolve_provider(cfg.provider)
    corpus = load_corpus(cfg.corpus, max_sentences=cfg.max_sentences)
    ref_desc = describe_artifact(reference)
    described: dict[str, tuple[Path, dict[str, Any]]] = {}
    for folder in artifacts:
        desc = describe_artifact(folder)
        name = str(desc["variant"])
        if name in described or name == REFERENCE or Path(folder).resolve() == Path(reference).resolve():
            raise BadInput(f"evaluate-latency: {folder} (variant {name}) is the reference or named twice")
        described[name] = (Path(folder), desc)
    synthetic = ref_desc["source"].get("kind") == "synthetic"
    log.info("timing %s against %s on %d sentences, interleaved in the same rounds", ", ".join(described),
             reference, len(corpus.sentences))
    with quiet_logger(enabled=synthetic):
        pairs = latency_mod.measure_against_many({n: f for n, (f, _) in described.items()}, reference,
                                                 corpus.sentences, latency_config(cfg, provider, cfg.show),
                                                 desc="synth " + "/".join(described))
    settings = latency_settings(ref_desc["files"], corpus, cfg, provider)
    any_pair = next(iter(pairs.values()))
    record = {
        "schema": LATENCY_RUN_SCHEMA,
        "settings": settings,
        "reference": {"latency": any_pair.reference, "waves": sorted(any_pair.reference_waves)},
        "artifacts": {name: {"files_sha256": files_sha256(desc["files"]), "latency": pairs[name].artifact,
                             "ratio": pairs[name].ratio, "waves": sorted(pairs[name].artifact_waves)}
                      for name, (_, desc) in described.items()},
    }
    arrays: dict[str, np.ndarray] = {}
    for side, waves in [(REFERENCE, any_pair.reference_waves)] + [(n, p.artifact_waves) for n, p in pairs.items()]:
        for utt, (wav, sr) in waves.items():
            arrays[f"{side}/wav_{utt}"], arrays[f"{side}/sr_{utt}"] = np.asarray(wav), np.asarray(sr)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with atomic_output_dir(out) as tmp:
        atomic_write_bytes(tmp / WAVES_FILE, buf.getvalue())
        atomic_write_json(tmp / RECORD_FILE, record)
    log.info("latency run written to %s (%d variants)", out, len(pairs))
    return pairs


def read_latency_pair(folder: Path, variant: str, settings: dict[str, Any], artifact_files: dict[str, Any]) -> PairLatency:
    """`variant`'s pair from the run in `folder`, which must have been measured with `settings` on
    these very files (one-line ForgeError otherwise)."""
    from chattts_forge.evaluate.latency import PairLatency

    path = Path(folder) / RECORD_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        entry = record["artifacts"].get(variant)
        if record.get("schema") != LATENCY_RUN_SCHEMA:
            raise BadInput(f"{path}: schema {record.get('schema')!r} is not {LATENCY_RUN_SCHEMA!r}")
        if entry is None:
            raise BadInput(f"latency run {folder} did not time variant {variant}")
        with np.load(Path(folder) / WAVES_FILE, allow_pickle=False) as z:
            def waves(side: str, ids: list[str]) -> dict[str, tuple[np.ndarray, int]]:
                return {u: (z[f"{side}/wav_{u}"], int(z[f"{side}/sr_{u}"])) for u in ids}

            art_waves, ref_waves = waves(variant, entry["waves"]), waves(REFERENCE, record["reference"]["waves"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadInput(f"latency run {folder} is unreadable ({type(e).__name__}: {e}); "
                         "run `chattts-forge evaluate-latency` again") from None
    if record.get("settings") != settings:
        theirs = record.get("settings") or {}
        differ = sorted(k for k in set(settings) | set(theirs) if settings.get(k) != theirs.get(k))
        raise BadInput(f"latency run {folder} was measured with other settings ({', '.join(differ)}); "
                         "evaluate without --latency-run or measure it again with these settings")
    if entry["files_sha256"] != files_sha256(artifact_files):
        raise IntegrityError(f"latency run {folder} timed other files for variant {variant}; "
                         "evaluate without --latency-run or measure it again")
    return PairLatency(entry["latency"], art_waves, record["reference"]["latency"], ref_waves, entry["ratio"])
