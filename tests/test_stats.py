"""Bootstrap intervals over sentences: deterministic, the right width, the right coverage, paired
differences cancel what the sentences share."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.stats import (
    bootstrap,
    bootstrap_interval,
    bootstrap_ratio_interval,
    paired_bootstrap_interval,
)
from chattts_forge.publish import regression


def test_same_inputs_same_interval_and_the_seed_matters() -> None:
    values = np.random.default_rng(1).normal(3.0, 0.5, size=12)
    a = bootstrap_interval(values)
    assert a == bootstrap_interval(list(values))  # a pure function of its inputs
    assert a != bootstrap_interval(values, seed=1)
    lo, hi = a
    assert lo < float(np.mean(values)) < hi


def test_constant_values_give_a_point() -> None:
    assert bootstrap_interval([0.8] * 7) == pytest.approx((0.8, 0.8))
    assert bootstrap_ratio_interval([1, 1, 1], [10, 10, 10]) == pytest.approx((0.1, 0.1))


def test_width_shrinks_like_one_over_root_n() -> None:
    rng = np.random.default_rng(2)
    small, large = rng.normal(0, 1, 25), rng.normal(0, 1, 400)
    w_small = np.subtract(*bootstrap_interval(small)[::-1])
    w_large = np.subtract(*bootstrap_interval(large)[::-1])
    # 16x the sentences: about a quarter of the width (2 * 1.96 / sqrt(n) for unit variance).
    assert 2.5 < w_small / w_large < 6.0
    assert w_large == pytest.approx(2 * 1.96 / np.sqrt(400), rel=0.2)


def test_coverage_is_near_the_nominal_95_percent() -> None:
    rng = np.random.default_rng(3)
    trials, hits = 300, 0
    for k in range(trials):
        sample = rng.exponential(1.0, size=40)  # skewed, true mean 1.0
        lo, hi = bootstrap_interval(sample, resamples=400, seed=k)
        hits += lo <= 1.0 <= hi
    # The percentile bootstrap under-covers slightly on skewed data of 40 values; never wildly.
    assert 0.88 <= hits / trials <= 0.99


def test_confidence_level_orders_the_intervals() -> None:
    values = np.random.default_rng(4).normal(size=30)
    lo90, hi90 = bootstrap_interval(values, confidence=0.90)
    lo99, hi99 = bootstrap_interval(values, confidence=0.99)
    assert lo99 < lo90 < hi90 < hi99


def test_other_statistics() -> None:
    values = [1.0, 2.0, 3.0, 100.0, 4.0, 5.0]
    lo, hi = bootstrap_interval(values, np.median)
    assert 1.0 <= lo <= 3.5 <= hi <= 100.0
    worst = bootstrap_interval(values, lambda v: float(np.min(v)))
    assert worst[0] == 1.0 and worst[1] <= 3.0


def test_pooled_ratio_weights_sentences_by_length() -> None:
    # One long sentence with many errors and short clean ones: the pooled rate is sum/sum, and a
    # resample without the long sentence has a rate near zero.
    edits, words = [30, 0, 0, 0, 0], [100, 5, 5, 5, 5]
    lo, hi = bootstrap_ratio_interval(edits, words)
    assert lo <= 30 / 120 <= hi
    assert lo == 0.0 and hi <= 30 / 100 + 1e-12


def test_paired_interval_cancels_sentence_difficulty() -> None:
    rng = np.random.default_rng(5)
    difficulty = rng.normal(0, 1.0, size=20)  # what both systems share
    reference = 3.0 + difficulty
    variant = reference - 0.2 + rng.normal(0, 0.02, size=20)
    lo, hi = paired_bootstrap_interval(variant, reference)
    assert lo < -0.2 + 0.03 and hi > -0.2 - 0.03 and hi < 0  # the drop is clearly resolved
    unpaired = np.subtract(*bootstrap_interval(variant)[::-1]) + np.subtract(*bootstrap_interval(reference)[::-1])
    assert (hi - lo) < unpaired / 10
    assert paired_bootstrap_interval(reference, reference) == (0.0, 0.0)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ForgeError, match="at least one value"):
        bootstrap_interval([])
    with pytest.raises(ForgeError, match="finite"):
        bootstrap_interval([1.0, float("nan")])
    with pytest.raises(ForgeError, match="confidence"):
        bootstrap_interval([1.0, 2.0], confidence=1.5)
    with pytest.raises(ForgeError, match="different lengths"):
        paired_bootstrap_interval([1.0, 2.0], [1.0])
    with pytest.raises(ForgeError, match="denominators"):
        bootstrap_ratio_interval([1, 2], [3])
    with pytest.raises(ForgeError, match="positive total"):
        bootstrap_ratio_interval([0, 0], [0, 0])


def test_the_regression_gate_resamples_through_the_same_bootstrap() -> None:
    # publish.regression's paired deltas and per-round medians are evaluate.stats' bootstrap: a mean
    # difference and a median get the very intervals evaluate prints for the same values.
    rng = np.random.default_rng(7)
    new, old = rng.normal(size=11), rng.normal(size=11)
    ones = np.ones(11)
    _, lo, hi = regression._paired(new, old, ones, ones, regression._mean, relative=False)
    assert (lo, hi) == paired_bootstrap_interval(new, old)
    ratios = list(np.abs(new) + 0.5)
    median, lo, hi = regression._bootstrap_median(ratios)
    assert median == float(np.median(ratios))
    assert (lo, hi) == bootstrap_interval(ratios, np.median)


def test_bootstrap_drops_resamples_without_a_finite_estimate_only_when_asked() -> None:
    values = np.array([0.0, 1.0, 2.0])

    def reciprocal_mean(idx: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return 1.0 / values[idx].mean(axis=1)

    bounds = bootstrap(reciprocal_mean, values.size, finite_only=True)
    assert bounds is not None
    lo, hi = bounds
    assert np.isfinite(lo) and np.isfinite(hi) and 0 < lo <= hi
    assert bootstrap(lambda idx: np.full(idx.shape[0], np.inf), 3, finite_only=True) is None
