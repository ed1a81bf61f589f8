"""`calibrate`: run an FP32 artifact over a text corpus and record the inputs of every quantizable graph.

    from chattts_forge.calibration_data.calibrate import calibrate
    calibrate("artifacts/fp32", "builtin:calibration", "build/calib", max_samples=32, seed=0)

What is recorded (with the torch-free runtime, `chattts_forge.runtime.Pipeline`, whose session runs
`recorder.instrument` observes through the runtime's public observer hook):

- `gpt`: the prefill of every sentence plus `decode_positions` decode steps per sentence, drawn with
  the seed among the steps whose past length is at most `max_past` (past key/values stored float16);
- `head_code`: the hidden state of up to `head_steps` steps per sentence;
- `decoder`: the GPT hidden states of each sentence ([1, hidden, T]), as the runtime decodes them;
- `dvae`: the generated codes of each sentence ([1, num_vq, T]), decoded once through the DVAE.

Sentences are a seeded shuffle of the corpus, truncated to `max_samples`; the speaker and the code
sampling of sentence i use seed + i, so a run is deterministic for a given artifact, corpus and seed.
Samples stop being added once `disk_budget_mb` would be exceeded (the manifest says so).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.calibration_data.corpus import Corpus, load_corpus
from chattts_forge.calibration_data.recorder import (
    check_recorded,
    instrument,
    new_pipeline,
    synth_params,
)
from chattts_forge.calibration_data.store import MANIFEST, SCHEMA, ShardWriter, sample_bytes
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_output_dir, atomic_write_json, sha256_file
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

log = get_logger(__name__)


def _artifact_identity(artifact_dir: Path, meta: ArtifactMeta) -> dict[str, Any]:
    gpt_file = meta.component_path(artifact_dir, "gpt")
    return {
        "path": str(artifact_dir.resolve()),
        "variant": meta.variant,
        "gpt_sha256": meta.component("gpt").get("sha256") or (sha256_file(gpt_file) if gpt_file.is_file() else None),
        "source": meta.source,
    }


def calibrate(
    artifact_dir: str | os.PathLike[str],
    corpus: str | os.PathLike[str] | Corpus,
    out_dir: str | os.PathLike[str],
    max_samples: int = 32,
    seed: int = 0,
    max_new_token: int = 96,
    decode_positions: int = 6,
    max_past: int = 192,
    head_steps: int = 16,
    disk_budget_mb: float = 512.0,
    threads: int | None = None,
    progress: bool | None = None,
) -> Path:
    """Record calibration inputs; returns `out_dir` (written atomically). See the module docstring."""
    artifact_dir = Path(artifact_dir)
    out_dir = Path(out_dir)
    if max_samples < 1:
        raise ForgeError(f"--max-samples must be >= 1, got {max_samples}")
    if max_new_token < 2:
        raise ForgeError(f"--max-new-token must be >= 2, got {max_new_token}")
    if decode_positions < 0 or max_past < 1 or head_steps < 0:
        raise ForgeError("decode positions and head steps must be >= 0 and max past >= 1")
    if disk_budget_mb <= 0:
        raise ForgeError(f"--disk-budget-mb must be > 0, got {disk_budget_mb}")
    corp = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(corp.sentences))[:max_samples]
    sentences = [corp.sentences[i] for i in sorted(order.tolist())]
    pipe = new_pipeline(artifact_dir, threads)
    meta = pipe.artifact.meta
    if meta.quantization or meta.component("gpt").get("precision", "fp32") != "fp32":
        raise ForgeError(f"{artifact_dir} is not an FP32 artifact; calibrate the FP32 artifact from `convert`")
    budget = int(disk_budget_mb * (1 << 20))

    with atomic_output_dir(out_dir) as tmp:
        writers = {c: ShardWriter(tmp, c) for c in ("gpt", "head_code", "decoder", "dvae")}
        stats = {"prefill": 0, "decode": 0, "past_lengths": []}
        state: dict[str, Any] = {"call": 0, "head_call": 0, "positions": set(), "heads": set(), "full": False}

        def total_bytes() -> int:
            return sum(w.bytes for w in writers.values())

        def add(component: str, sample: dict[str, np.ndarray]) -> bool:
            if total_bytes() + sample_bytes(sample) > budget:
                state["full"] = True
                return False
            writers[component].add(sample)
            return True

        def on_run(component: str, feeds: dict[str, Any], names: list[str], outs: list[Any]) -> None:
            if component == "gpt":
                call = state["call"]
                state["call"] += 1
                past = int(feeds["past_key_values.0.key"].shape[2]) if "past_key_values.0.key" in feeds else 0
                if call == 0 or (call in state["positions"] and past <= max_past):
                    sample = {k: np.array(v, copy=True) for k, v in feeds.items()}
                    if add("gpt", sample):
                        stats["prefill" if call == 0 else "decode"] += 1
                        stats["past_lengths"].append(past)
            elif component == "head_code":
                call = state["head_call"]
                state["head_call"] += 1
                if call in state["heads"]:
                    add("head_code", {k: np.array(v, copy=True) for k, v in feeds.items()})
            elif component in ("decoder", "dvae"):
                add(component, {k: np.array(v, copy=True) for k, v in feeds.items()})

        recording = instrument(pipe, on_run, ("gpt", "head_code", "decoder", "dvae"))
        used, skipped = 0, []
        bar = tqdm(sentences, desc="calibrate", unit="sent", disable=progress is False if progress is not None else None)
        for i, text in enumerate(bar):
            srng = np.random.default_rng([seed, i])
            steps = np.arange(1, max_new_token)
            state.update(
                call=0,
                head_call=0,
                positions=set(srng.choice(steps, size=min(decode_positions, len(steps)), replace=False).tolist()),
                heads=set(srng.choice(max_new_token, size=min(head_steps, max_new_token), replace=False).tolist()),
            )
            try:
                with quiet_logger():
                    results = pipe.synthesize(text, synth_params(pipe, seed + i, max_new_token))
            except ForgeError as e:  # e.g. a line that normalises to nothing speakable
                skipped.append({"sentence": text, "reason": str(e)})
                continue
            used += 1
            codes = results[0].codes
            if len(codes) and pipe.artifact.has_component("dvae"):
                pipe.decode_mel(codes, use_decoder=False)  # records the DVAE input
            bar.set_postfix(MB=f"{total_bytes() / (1 << 20):.0f}")
            if state["full"]:
                log.warning("disk budget of %.0f MB reached after %d sentences; stopping", disk_budget_mb, used)
                break
        bar.close()
        check_recorded(recording, "gpt")
        for w in writers.values():
            w.flush()
        if used == 0:
            raise ForgeError(f"no sentence of corpus '{corp.name}' could be synthesized")
        past = stats["past_lengths"]
        manifest = {
            "schema": SCHEMA,
            "artifact": _artifact_identity(artifact_dir, meta),
            "corpus": corp.describe(),
            "seed": seed,
            "sentences": {"requested": len(sentences), "used": used, "skipped": skipped},
            "settings": {
                "max_samples": max_samples,
                "max_new_token": max_new_token,
                "decode_positions_per_sentence": decode_positions,
                "max_past": max_past,
                "head_steps_per_sentence": head_steps,
                "threads": threads,
                "sampling": "ChatTTS InferCodeParams defaults, random speaker seed+i, code seed+i",
                "past_kv_storage": "float16",
            },
            "disk_budget_bytes": budget,
            "bytes_total": total_bytes(),
            "truncated_by_budget": bool(state["full"]),
            "components": {
                c: {"samples": w.count, "bytes": w.bytes, "shards": w.shards} for c, w in writers.items()
            },
            "gpt_samples": {
                "prefill": stats["prefill"],
                "decode": stats["decode"],
                "past_length_min": int(min(past)) if past else 0,
                "past_length_max": int(max(past)) if past else 0,
            },
            "versions": library_versions(),
            "toolchain": toolchain_info(),
            "created_at": build_timestamp(),
        }
        atomic_write_json(tmp / MANIFEST, manifest)
    log.info(
        "calibration set written to %s: %d sentences, gpt %d samples (%d prefill, %d decode), %.1f MB",
        out_dir, used, writers["gpt"].count, stats["prefill"], stats["decode"], manifest["bytes_total"] / (1 << 20),
    )
    return out_dir
