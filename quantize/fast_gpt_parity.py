"""Parity of a fused GPT graph (`gpt_fast.onnx`, quantize/fast_gpt_graph.py) with the plain gpt.onnx:
one check (`fused_parity`), two sets of cases (`LeftPaddedSteps`: left-padded batched decode
steps driven by the runtime's `FastGptStep`; `RecordedSamples`: calibration samples).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from chattts_forge.errors import ForgeError


def _session(path: Path, threads: int | None) -> Any:
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - a graph onnxruntime cannot load: one line
        raise ForgeError(f"cannot load {path}: {str(e).splitlines()[0]}") from None


def _cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)


@dataclass
class ParityStats:
    """The plain graph's hidden states `ref` against the fused graph's `got` over valid positions:
    the worst absolute difference, the worst difference relative to each value (|ref| + 1e-3), the
    largest |ref| (the scale), the lowest cosine of a position's hidden state."""

    max_abs: float = 0.0
    max_rel_position: float = 0.0
    scale: float = 0.0
    min_cosine: float = 1.0
    steps: int = 0

    def add(self, ref: np.ndarray, got: np.ndarray, valid: np.ndarray) -> None:
        diff = np.abs(got - ref)[valid]
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.max_rel_position = max(self.max_rel_position, float((diff / (np.abs(ref[valid]) + 1e-3)).max()))
        self.scale = max(self.scale, float(np.abs(ref[valid]).max()))
        self.min_cosine = min(self.min_cosine, float(_cosine_rows(ref[valid], got[valid]).min()))
        self.steps += 1


class ParityCases(Protocol):
    """What the plain and fused graphs are compared on, and how the comparison is recorded."""

    def run(self, plain: Any, fast: Any) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(plain hidden states, fused hidden states, valid-position mask) per step."""
        ...

    def record(self, stats: ParityStats) -> dict[str, Any]:
        """The `parity` record of the fused graph's component entry."""
        ...


@dataclass(frozen=True)
class LeftPaddedSteps:
    """Random inputs: rows left-padded by different amounts (ChatTTS batching; `pads`, default 0, 2,
    4, ... positions), a prefill and then `decode_steps` single steps, the fused graph driven by the
    runtime's `FastGptStep`."""

    hp: Mapping[str, int]
    batch: int = 3
    prompt: int = 9
    decode_steps: int = 6
    seed: int = 0
    pads: tuple[int, ...] | None = None

    def run(self, plain: Any, fast_session: Any) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        # runtime.fast_gpt loads soundfile (12 ms): needed only here
        from chattts_forge.runtime.fast_gpt import FastGptStep

        hp = self.hp
        hidden = hp["hidden_size"]
        fast = FastGptStep(fast_session, hp["num_hidden_layers"], hp["num_key_value_heads"],
                           hidden // hp["num_attention_heads"], hidden, capacity=self.prompt + 2)
        return self.steps(plain, fast)

    def steps(self, plain: Any, fast: Any) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(plain hidden states, `fast`'s, valid positions) per step; `fast` is any GPT step
        (`reset`, `__call__(inputs_embeds, attention_mask, position_ids)`)."""
        hp, batch, prompt = self.hp, self.batch, self.prompt
        hidden, layers = hp["hidden_size"], hp["num_hidden_layers"]
        kv, hd = hp["num_key_value_heads"], hidden // hp["num_attention_heads"]
        rng = np.random.default_rng(self.seed)
        mask = np.ones((batch, prompt), dtype=np.int64)
        for b in range(batch):
            mask[b, : self.pads[b] if self.pads is not None else min(b * 2, prompt - 1)] = 0
        past = [np.zeros((batch, kv, 0, hd), np.float32) for _ in range(2 * layers)]
        past_names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        fast.reset(batch)
        emb = rng.standard_normal((batch, prompt, hidden), dtype=np.float32)
        for step in range(self.decode_steps + 1):
            if step:
                mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
                emb = rng.standard_normal((batch, 1, hidden), dtype=np.float32)
            pos = np.cumsum(mask, axis=1) - 1
            pos[mask == 0] = 1
            pos = pos[:, -emb.shape[1]:]
            feeds = {"inputs_embeds": emb, "attention_mask": mask, "position_ids": pos,
                     **dict(zip(past_names, past, strict=True))}
            outs = plain.run(None, feeds)
            ref, past = outs[0], outs[1:]
            yield ref, fast(emb, mask, pos), mask[:, -emb.shape[1]:].astype(bool)

    def record(self, stats: ParityStats) -> dict[str, Any]:
        return {
            "reference": "plain gpt.onnx (onnxruntime)",
            "max_abs": stats.max_abs,
            "max_rel": stats.max_rel_position,
            "cases": f"batch {self.batch} left-padded, prompt {self.prompt}, {self.decode_steps} decode steps, "
                     f"seed {self.seed}",
        }


@dataclass(frozen=True)
class RecordedSamples:
    """Recorded gpt.onnx feeds (calibration samples); `to_fused` turns one into the fused graph's feeds."""

    samples: Sequence[dict[str, np.ndarray]]
    to_fused: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    reference: str = "the artifact's quantized gpt.onnx on the recorded calibration samples"

    def run(self, plain: Any, fast: Any) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        if not self.samples:
            raise ForgeError("no samples to compare the plain and fused graphs on")
        for s in self.samples:
            ref = plain.run(["last_hidden_state"], s)[0]
            got = fast.run(["last_hidden_state"], self.to_fused(s))[0]
            yield ref, got, s["attention_mask"][:, -ref.shape[1]:].astype(bool)

    def record(self, stats: ParityStats) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "samples": stats.steps,
            "max_abs": stats.max_abs,
            "max_rel": stats.max_abs / stats.scale if stats.scale else 0.0,
            "min_cosine": stats.min_cosine,
        }


def fused_parity(plain_gpt: str | os.PathLike[str], fast_gpt: str | os.PathLike[str], cases: ParityCases,
                 threads: int | None = 1) -> dict[str, Any]:
    """The one parity check of a fused graph: its hidden states against the plain graph's on
    `cases`, every valid position; returns the cases' `parity` record."""
    plain, fast = _session(Path(plain_gpt), threads), _session(Path(fast_gpt), threads)
    stats = ParityStats()
    for ref, got, valid in cases.run(plain, fast):
        stats.add(ref, got, valid)
    return cases.record(stats)


