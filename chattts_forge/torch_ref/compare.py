"""Comparing another engine's codes, logits and audio with ChatTTS's (the parity rules of issue 4).

Library use::

    from chattts_forge.torch_ref.compare import compare_codes
    rows = compare_codes(oracle_run, [runtime_codes_text0, ...])
    for row in rows: print(row.describe())
    assert all(row.ok for row in rows)

Codes must equal ChatTTS's. A divergence is admissible only at a near-tie: where ChatTTS's top-2
gap (after its repetition penalty, in logit units; `oracle.NEAR_TIE` = 1e-5) at the first differing
step is below the threshold; everything after that step follows a different history, so the row's
comparison stops there and the divergence is reported, never hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chattts_forge.torch_ref.oracle import NEAR_TIE


@dataclass
class CodeComparison:
    row: int
    text: str
    steps_chattts: int
    steps_other: int
    equal: bool  # identical codes (shape and values)
    first_divergence: int | None  # first step where any stream differs (or the shorter length)
    gap_at_divergence: float | None  # ChatTTS's smallest top-2 gap over the streams that differ there
    min_gap: float  # smallest top-2 gap over the compared steps (how close the run came to a tie)
    compared_steps: int

    @property
    def near_tie(self) -> bool:
        return self.gap_at_divergence is not None and self.gap_at_divergence < NEAR_TIE

    @property
    def ok(self) -> bool:
        return self.equal or self.near_tie

    def describe(self) -> str:
        head = f"row {self.row} {self.text[:24]!r}: "
        if self.equal:
            return head + f"{self.steps_chattts} steps identical (min top-2 gap {self.min_gap:.3g})"
        where = f"diverges at step {self.first_divergence} of {self.steps_chattts}/{self.steps_other}"
        if self.gap_at_divergence is None:
            return head + where + " (length differs, no decision to blame: NOT admissible)"
        verdict = "admissible near-tie" if self.near_tie else "NOT a near-tie"
        return head + f"{where}, ChatTTS top-2 gap there {self.gap_at_divergence:.3g} ({verdict}, limit {NEAR_TIE:g})"


def compare_codes(oracle_run: dict[str, Any], others: Sequence[np.ndarray]) -> list[CodeComparison]:
    """Compare per-text codes [steps, num_vq] with `oracle.chattts_codes`'s run of the same texts."""
    if len(others) != len(oracle_run["codes"]):
        raise ValueError(f"{len(others)} code arrays for {len(oracle_run['codes'])} texts")
    rows = []
    for b, (ref, got) in enumerate(zip(oracle_run["codes"], others, strict=True)):
        got = np.asarray(got).reshape(-1, ref.shape[1]) if np.asarray(got).size else np.zeros((0, ref.shape[1]))
        gaps = oracle_run["top2_gap_penalized"][b]
        n = min(len(ref), len(got))
        diff = np.flatnonzero((ref[:n] != got[:n]).any(axis=1))
        if diff.size:
            s = int(diff[0])
            streams = np.flatnonzero(ref[s] != got[s])
            gap: float | None = float(gaps[s, streams].min())
            first: int | None = s
        elif len(ref) != len(got):
            # One engine stopped (EOS) where the other went on: that EOS decision is step n.
            s = n
            first = s
            gap = float(gaps[s].min()) if s < len(gaps) else None
        else:
            first, gap, s = None, None, n
        upto = s if first is not None else n
        min_gap = float(gaps[: max(upto, 1)].min()) if len(gaps) else float("inf")
        rows.append(
            CodeComparison(
                row=b,
                text=oracle_run["texts"][b],
                steps_chattts=len(ref),
                steps_other=len(got),
                equal=first is None,
                first_divergence=first,
                gap_at_divergence=gap,
                min_gap=min_gap,
                compared_steps=upto,
            )
        )
    return rows


def compare_processed_logits(chattts: np.ndarray, other: np.ndarray) -> tuple[int, float]:
    """(positions whose -inf mask differs, max abs difference over positions finite in both)."""
    a, b = np.asarray(chattts), np.asarray(other)
    if a.shape != b.shape:
        raise ValueError(f"logits shapes differ: {a.shape} vs {b.shape}")
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    worst = float(np.abs(a[both] - b[both]).max()) if both.any() else 0.0
    return int((fa != fb).sum()), worst
