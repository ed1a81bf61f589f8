"""The observer sessions of a `calibrate` run: gpt.onnx's and the code head's, and the fused graph's
only when its MatMul inputs are not all gpt.onnx activations (then its statistics are derived), and
the size of the statistics they fix before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, GPT, HEAD_CODE
from chattts_forge.calibration_data.observe import Observer, fused_feed, release_freed_memory
from chattts_forge.calibration_data.statistics import HIST_BINS, hessian_block
from chattts_forge.log import get_logger

log = get_logger(__name__)

# Graphs whose MatMul inputs also accumulate X^T X (GPTQ; the fused graph reads gpt's: same activations).
HESSIAN_GRAPHS = (GPT, HEAD_CODE)
@dataclass
class ObserverSet:
    """The observer sessions run, and the fused graph when its statistics are derived instead."""

    run: dict[str, Observer]
    derived: dict[str, str]  # fused MatMul input -> the gpt.onnx tensor that is the same activation
    derived_path: Path | None = None  # the fused graph whose statistics are gpt's under its own names


def open_observers(pipe: Any, artifact_dir: Path, threads: int | None) -> ObserverSet:
    """Observer sessions. When every MatMul input of the fused graph is the same activation as a
    gpt.onnx one (checked on a probe feed), the fused graph is not observed: its statistics are gpt's
    under its own names (one 755 MB session and a third of the observing less at full size)."""
    meta = pipe.artifact.meta
    out = ObserverSet({GPT: Observer(meta.component_file(artifact_dir, GPT), threads)}, {})
    if meta.has_component(FAST_GPT):
        fused = Observer(meta.component_file(artifact_dir, FAST_GPT), threads)
        derived = same_activations(out.run[GPT], fused)
        if len(derived) == len(fused.tensors):
            out.derived, out.derived_path = derived, fused.path
            del fused
            release_freed_memory()
        else:
            log.warning("calibrate: %d of %d %s MatMul inputs match no gpt.onnx tensor: observing it too",
                        len(fused.tensors) - len(derived), len(fused.tensors), FAST_GPT)
            out.run[FAST_GPT] = fused
    if pipe.artifact.has_component(HEAD_CODE):
        out.run[HEAD_CODE] = Observer(meta.component_file(artifact_dir, HEAD_CODE), threads)
    return out


def same_activations(plain: Observer, fused: Observer) -> dict[str, str]:
    """fused tensor -> gpt.onnx tensor holding the same values on a seeded 5-token probe prompt."""
    session = plain.session
    hidden = next(int(i.shape[2]) for i in session.get_inputs() if i.name == "inputs_embeds")
    tokens = 5
    probe: dict[str, np.ndarray] = {
        "inputs_embeds": np.random.default_rng(0).normal(size=(1, tokens, hidden)).astype(np.float32),
        "attention_mask": np.ones((1, tokens), np.int64),
        "position_ids": np.arange(tokens, dtype=np.int64)[None],
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            probe[i.name] = np.zeros((1, int(i.shape[1]), 0, int(i.shape[3])), np.float32)
    a, b = plain.run(probe), fused.run(fused_feed(probe))
    out: dict[str, str] = {}
    for name, value in b.items():
        scale = float(np.abs(value).max(initial=0.0)) or 1.0
        for cand, ref in a.items():
            if ref.shape == value.shape and np.allclose(ref, value, rtol=1e-3, atol=1e-4 * scale):
                out[name] = cand
                break
    return out


def statistics_bytes(observers: ObserverSet) -> int:
    """statistics.npz's size, known before any work (the graphs fix it): for the reserve."""
    gpt = observers.run[GPT].widths
    graphs = {g: obs.widths for g, obs in observers.run.items()}
    if observers.derived:
        graphs[FAST_GPT] = {t: gpt[src] for t, src in observers.derived.items()}
    total = 0
    for graph, widths in graphs.items():
        for width in widths.values():
            total += HIST_BINS * 8 + width * 12 + 256
            if graph in HESSIAN_GRAPHS:
                b = hessian_block(width)
                total += (width // b) * b * (b + 1) // 2 * 4
    return total
