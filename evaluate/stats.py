"""Bootstrap confidence intervals over sentences, for every corpus figure a report prints.

A corpus figure (mean SIM, mean OVRL, pooled WER, ...) comes from a handful of sentences; the 95%
percentile bootstrap interval says how much it would move with other sentences of the same kind.
Sentences are resampled with replacement `resamples` times and the statistic recomputed on each
resample; the interval is the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of those.
A fixed seed makes the interval a pure function of its inputs (reports are reproducible).

- `bootstrap(estimate, n)`: the one resampling loop (evaluate's intervals and publish.regression's).
- `bootstrap_interval(values, statistic=np.mean)`: a statistic of one value per sentence.
- `bootstrap_ratio_interval(numerators, denominators)`: a pooled ratio such as corpus WER
  (total edits over total reference words), resampling sentences, not words.
- `paired_bootstrap_interval(a, b)`: the difference of a statistic between two systems on the same
  sentences (variant minus FP32), resampling sentence pairs so sentence difficulty cancels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from chattts_forge.errors import BadInput

__all__ = ["bootstrap", "bootstrap_interval", "bootstrap_ratio_interval", "paired_bootstrap_interval"]

Statistic = Callable[[np.ndarray], float]


def _check(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise BadInput(f"a bootstrap interval needs at least one value ({name} is empty)")
    if not np.all(np.isfinite(arr)):
        raise BadInput(f"a bootstrap interval needs finite {name}")
    return arr


def bootstrap(
    estimate: Callable[[np.ndarray], np.ndarray],
    n: int,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    finite_only: bool = False,
) -> tuple[float, float] | None:
    """(low, high) percentile interval of `estimate(idx)` over `resamples` resamplings of n items.

    `estimate` gets a (resamples, n) array of indices drawn with replacement and returns one estimate
    per row. The one bootstrap of the project: evaluate's intervals and the regression gate's.
    `finite_only` drops resamples whose estimate is not finite (a ratio over a zero); None when none is.
    """
    if resamples < 1:
        raise BadInput(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise BadInput(f"confidence must be between 0 and 1, got {confidence}")
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    estimates = np.asarray(estimate(idx), dtype=np.float64)
    if finite_only:
        estimates = estimates[np.isfinite(estimates)]
        if estimates.size == 0:
            return None
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(estimates, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _interval(bounds: tuple[float, float] | None) -> tuple[float, float]:
    assert bounds is not None  # without finite_only every resample counts
    return bounds


def _apply(statistic: Statistic, samples: np.ndarray) -> np.ndarray:
    # np.mean / np.median take axis=1 in one call; any other callable is applied row by row.
    if statistic in (np.mean, np.median, np.sum, np.std, np.min, np.max):
        return np.asarray(statistic(samples, axis=1), dtype=np.float64)
    return np.array([float(statistic(row)) for row in samples], dtype=np.float64)


def bootstrap_interval(
    values: Sequence[float] | np.ndarray,
    statistic: Statistic = np.mean,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """(low, high) percentile-bootstrap interval of `statistic` over per-sentence `values`."""
    arr = _check(values)
    return _interval(
        bootstrap(
            lambda idx: _apply(statistic, arr[idx]),
            arr.size,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
    )


def bootstrap_ratio_interval(
    numerators: Sequence[float] | np.ndarray,
    denominators: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of sum(numerators) / sum(denominators) (a pooled rate) resampling sentences."""
    num, den = _check(numerators, "numerators"), _check(denominators, "denominators")
    if num.shape != den.shape:
        raise BadInput(f"{num.size} numerators but {den.size} denominators")
    if np.any(den < 0) or den.sum() <= 0:
        raise BadInput("a pooled rate needs non-negative denominators with a positive total")

    def rates(idx: np.ndarray) -> np.ndarray:
        totals = den[idx].sum(axis=1)
        # A resample made only of empty references has no rate; count it as its edits' presence (as
        # score._rate does), so the interval stays defined.
        edits = num[idx].sum(axis=1)
        return np.where(totals > 0, edits / np.where(totals > 0, totals, 1.0), edits > 0)

    return _interval(bootstrap(rates, num.size, confidence=confidence, resamples=resamples, seed=seed))


def paired_bootstrap_interval(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    statistic: Statistic = np.mean,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of statistic(a) - statistic(b), `a[i]` and `b[i]` measured on the same sentence i."""
    x, y = _check(a, "a"), _check(b, "b")
    if x.shape != y.shape:
        raise BadInput(f"paired values of different lengths: {x.size} and {y.size}")
    return _interval(
        bootstrap(
            lambda idx: _apply(statistic, x[idx]) - _apply(statistic, y[idx]),
            x.size,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
    )
