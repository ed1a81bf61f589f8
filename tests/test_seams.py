"""Stream seams (evaluate.seams): streamed against whole-text audio, and the click detector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chattts_forge.evaluate.seams import (
    FLOOR_DB,
    SNR_CEILING_DB,
    click_figures,
    compare_stream,
    measure_seams,
    snr_db,
)

SR = 24000


def _speechlike(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """A low-frequency signal (speech energy sits low; a click is broadband)."""
    t = np.arange(int(SR * seconds)) / SR
    rng = np.random.default_rng(seed)
    return sum(0.2 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in (140, 310, 520)).astype(np.float32)


def test_identical_chunks_are_exact() -> None:
    whole = _speechlike()
    chunks = [whole[:7000], whole[7000:15000], whole[15000:]]
    r = compare_stream(whole, chunks, SR)
    assert r["chunks"] == 3 and r["edges"] == [7000, 15000] and r["length_difference"] == 0
    assert r["max_abs_diff"] == 0.0 and r["snr_db"] == SNR_CEILING_DB and r["click_db"] == FLOOR_DB


def test_a_step_at_each_chunk_edge_is_a_click_at_the_seams() -> None:
    whole = _speechlike()
    streamed = whole.copy()
    edges = [6000, 12000, 18000]
    for e in edges:  # a 2-sample glitch right at each seam
        streamed[e : e + 2] += 0.3
    chunks = np.split(streamed, edges)
    r = compare_stream(whole, chunks, SR)
    assert r["edges"] == edges
    assert r["max_abs_diff"] == pytest.approx(0.3, abs=1e-6)
    assert r["click_db"] > -10  # the glitch's high-passed energy near the edges is of the signal's order
    assert r["edge_over_rest_db"] == SNR_CEILING_DB  # nothing differs away from the edges

    # the same glitches away from the edges are not seams
    off = whole.copy()
    for e in edges:
        off[e + 3000 : e + 3002] += 0.3
    r_off = compare_stream(whole, np.split(off, edges), SR)
    assert r_off["click_db"] == FLOOR_DB and r_off["edge_over_rest_db"] == FLOOR_DB
    assert r_off["snr_db"] == pytest.approx(r["snr_db"], abs=0.1)  # SNR alone cannot tell them apart


def test_broadband_error_scores_higher_than_the_same_energy_low_frequency_error() -> None:
    whole = _speechlike()
    edges = [12000]
    t = np.arange(whole.size) / SR
    low = 0.01 * np.sin(2 * np.pi * 100 * t)
    high = np.random.default_rng(3).standard_normal(whole.size) * np.sqrt(np.mean(low**2))
    hp_low = click_figures(whole, whole + low, edges, SR)["click_db"]
    hp_high = click_figures(whole, whole + high, edges, SR)["click_db"]
    assert hp_high > hp_low + 20


def test_snr() -> None:
    a = _speechlike()
    assert snr_db(a, a) == SNR_CEILING_DB
    assert snr_db(a, a * 0.9) == pytest.approx(20.0, abs=1e-4)  # noise = 0.1 a (float32 product)


def test_tiny_artifact_streams_exactly_by_default_and_not_with_a_short_lookahead(tiny_artifacts: dict[str, Path]) -> None:
    sentences = ["Hello world, this is a test.", "The quick brown fox jumps over the lazy dog near the river bank."]
    r = measure_seams(tiny_artifacts["fp32"], sentences, max_new_token=48, threads=1, lookahead_frames=1)
    default, short = r["modes"]["default"], r["modes"]["lookahead"]
    assert [s["id"] for s in default["sentences"]] == ["001", "002"]
    assert all(s["length_difference"] == 0 for m in (default, short) for s in m["sentences"])
    assert default["lookahead_frames"] > short["lookahead_frames"] == 1
    # exact right context: float rounding only
    assert default["snr_db_min"] > 80 and default["max_abs_diff"] < 1e-4
    # one frame of right context: inexact at the chunk edges, and the error sits there
    multi = [s for s in short["sentences"] if s["chunks"] > 1]
    assert multi, "a sentence must stream in more than one chunk"
    assert short["snr_db_min"] < default["snr_db_min"] - 40
    assert all(s["edge_over_rest_db"] > 0 for s in multi)
