"""Interleaved speed ratios with their spread: how chattts-forge decides that one thing is faster.

Sequential timings on a shared machine move by 20-30% between rounds (docs/measurements), so a
decision taken on two medians measured one after the other can pick the slower variant. Every speed
comparison the toolchain makes (the runtime's host autotune, quantize auto's ladder and final
timing, routing, the gate's latency ratio where it compares) goes through `compare_interleaved`:

- the candidates and the reference are called round by round, the order rotated every round, so
  background load and clock drift hit them alike;
- per round, each candidate's seconds over the reference's seconds of the same round is one ratio
  sample; the estimate is the median of those samples and its `spread` the half-width of a ~90%
  distribution-free confidence interval of that median (order statistics of the sorted samples);
- rounds repeat until every candidate's spread is within `bound` (after `min_rounds`), or until
  `time_cap_s` (measured with the same clock) or `max_rounds` is reached; which one stopped it is
  recorded (`stopped`), with the spread reached.

`compare_rounds` is the same loop for figures other than one call's seconds (the gate's RTF ratio
of whole syntheses, evaluate.latency): the caller measures and returns the figure of each turn.

A decision is taken only outside the noise (`clearly_faster`: the interval's upper end below 1);
inside it the caller keeps the simpler variant and says so (`prefer_simpler`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chattts_forge.errors import BadInput, ForgeError

Clock = Callable[[], float]

# z of a two-sided 90% interval: the median's interval runs over the order statistics k..n-1-k.
CONFIDENCE_Z = 1.645
CONFIDENCE = 0.90


@dataclass(frozen=True)
class RatioSettings:
    """When an interleaved comparison stops. `min_sample_s`: calls of one callable are grouped into
    samples of at least this long (tiny steps are mostly timer and call overhead otherwise).
    `cap_after_rounds` and `cap_scale`: where `compare_rounds`' time cap counts from and how long it
    is at most (see there); the defaults count it from the start, `time_cap_s` long."""

    bound: float = 0.03
    time_cap_s: float = 5.0
    min_rounds: int = 6
    max_rounds: int = 400
    warmup_rounds: int = 1
    min_sample_s: float = 0.002
    # untimed calls before each timed sample: the previous session's thread pool may still spin and
    # steal the cores of the first steps (quantize auto's fused graphs, one session each)
    untimed_calls: int = 0
    cap_after_rounds: int = 0
    cap_scale: float | None = None

    def __post_init__(self) -> None:
        if not (self.bound > 0 and self.time_cap_s > 0 and 2 <= self.min_rounds <= self.max_rounds):
            raise BadInput(f"interleaved timing settings out of range: {self}")

    def to_dict(self) -> dict[str, Any]:
        # without the cap's start: only the gate's latency comparisons set it, and they record their
        # own settings; the records that carry this one (autotune, quantize auto) keep their keys
        return {"bound": self.bound, "time_cap_s": self.time_cap_s, "min_rounds": self.min_rounds,
                "max_rounds": self.max_rounds, "min_sample_s": self.min_sample_s,
                "untimed_calls": self.untimed_calls, "confidence": CONFIDENCE}


@dataclass(frozen=True)
class RatioEstimate:
    """A candidate's seconds over the reference's, from one interleaved comparison."""

    name: str
    ratio: float  # median of the per-round ratios
    low: float  # the ~90% interval of that median
    high: float
    seconds: float  # the candidate's median seconds per call
    reference_seconds: float  # the reference's median seconds per call (same rounds)
    rounds: int

    @property
    def spread(self) -> float:
        return (self.high - self.low) / 2

    @property
    def clearly_faster(self) -> bool:
        """Faster than the reference beyond the measured noise."""
        return self.high < 1.0

    @property
    def clearly_slower(self) -> bool:
        return self.low > 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": round(self.ratio, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "spread": round(self.spread, 4), "step_ms": round(self.seconds * 1e3, 4),
                "reference_step_ms": round(self.reference_seconds * 1e3, 4), "rounds": self.rounds}


@dataclass(frozen=True)
class Comparison:
    """Every candidate against one reference, from the same interleaved rounds."""

    reference: str
    estimates: dict[str, RatioEstimate]
    rounds: int
    seconds: float  # wall seconds the comparison took (by its clock), warm-up included
    stopped: str  # "spread within bound" | "time cap" | "round cap"
    calls_per_sample: int
    settings: RatioSettings = field(default_factory=RatioSettings)

    @property
    def converged(self) -> bool:
        return self.stopped == "spread within bound"

    @property
    def max_spread(self) -> float:
        return max((e.spread for e in self.estimates.values()), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "rounds": self.rounds, "seconds": round(self.seconds, 3),
                "stopped": self.stopped, "converged": self.converged, "max_spread": round(self.max_spread, 4),
                "calls_per_sample": self.calls_per_sample, "settings": self.settings.to_dict(),
                "candidates": {n: e.to_dict() for n, e in self.estimates.items()}}


def median_interval(samples: list[float]) -> tuple[float, float, float]:
    """(median, low, high): the median of `samples` and its ~90% distribution-free interval."""
    if not samples:
        raise ForgeError("no samples to estimate a median from")
    s = sorted(samples)
    n = len(s)
    k = max(0, math.floor((n - CONFIDENCE_Z * math.sqrt(n)) / 2))
    mid = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    return mid, s[k], s[n - 1 - k]


def _median(values: list[float]) -> float:
    return median_interval(values)[0]


def compare_interleaved(
    reference: tuple[str, Callable[[], object]],
    candidates: Mapping[str, Callable[[], object]],
    settings: RatioSettings | None = None,
    clock: Clock = time.perf_counter,
) -> Comparison:
    """Time `candidates` against `reference` round by round until the ratios are known to within
    `settings.bound` (see the module docstring)."""
    settings = settings or RatioSettings()
    ref_name, ref_call = reference
    if ref_name in candidates:
        raise ForgeError(f"candidate {ref_name!r} is also the reference")
    calls = {ref_name: ref_call, **candidates}
    start = clock()
    for _ in range(settings.warmup_rounds):
        for call in calls.values():
            call()
    t0 = clock()
    ref_call()
    one_call = max(clock() - t0, 1e-9)
    per_sample = max(1, math.ceil(settings.min_sample_s / one_call))

    def sample(_round: int, name: str) -> float:
        call = calls[name]
        for _ in range(settings.untimed_calls):
            call()
        t0 = clock()
        for _ in range(per_sample):
            call()
        return (clock() - t0) / per_sample

    return compare_rounds(ref_name, list(candidates), sample, settings, clock, start=start,
                          calls_per_sample=per_sample)


def compare_rounds(
    reference: str,
    candidates: Sequence[str],
    measure: Callable[[int, str], float],
    settings: RatioSettings | None = None,
    clock: Clock = time.perf_counter,
    *,
    start: float | None = None,
    calls_per_sample: int = 1,
) -> Comparison:
    """The round loop of `compare_interleaved` for callers whose figure is not the seconds of one
    call: `measure(round, name)` runs `name` once in round `round` and returns its figure (seconds
    of a sample, or an RTF: anything where lower is faster); the order is rotated every round and
    each round's candidate figure over the reference's is one ratio sample. Stops like
    `compare_interleaved`; the time cap counts from `start` (default: now) or, with
    `settings.cap_after_rounds`, from the end of that round (work every caller needs, such as one pass
    over a corpus, is not cut by the cap; `settings.min_rounds` should then be at least that many) and,
    with `settings.cap_scale`, is at most `cap_scale` times the seconds those rounds took (further
    rounds cost at most that share of the work already done)."""
    settings = settings or RatioSettings()
    cap_after_rounds, cap_scale = settings.cap_after_rounds, settings.cap_scale
    if reference in candidates:
        raise ForgeError(f"candidate {reference!r} is also the reference")
    if not candidates:
        raise BadInput("an interleaved comparison needs at least one candidate")
    names = [reference, *candidates]
    start = clock() if start is None else start
    cap_from, cap_s = start, settings.time_cap_s
    figures: dict[str, list[float]] = {n: [] for n in names}
    rounds, stopped = 0, "round cap"
    while rounds < settings.max_rounds:
        for i in range(len(names)):  # rotated: no fixed position
            name = names[(rounds + i) % len(names)]
            figures[name].append(float(measure(rounds, name)))
        rounds += 1
        if rounds == cap_after_rounds:
            cap_from = clock()
            if cap_scale is not None:
                cap_s = min(cap_s, cap_scale * (cap_from - start))
        if rounds >= settings.min_rounds:
            if max(_estimate(n, figures[n], figures[reference], rounds).spread for n in candidates) \
                    <= settings.bound:
                stopped = "spread within bound"
                break
            if clock() - cap_from >= cap_s:
                stopped = "time cap"
                break
    estimates = {n: _estimate(n, figures[n], figures[reference], rounds) for n in candidates}
    return Comparison(reference, estimates, rounds, clock() - start, stopped, calls_per_sample, settings)


def _estimate(name: str, cand: list[float], ref: list[float], rounds: int) -> RatioEstimate:
    ratios = [c / r if r > 0 else math.inf for c, r in zip(cand, ref, strict=True)]
    mid, low, high = median_interval(ratios)
    return RatioEstimate(name, mid, low, high, _median(cand), _median(ref), rounds)


def prefer_simpler(comparison: Comparison, simpler: str) -> tuple[str, str]:
    """(choice, reason): the candidate clearly fastest against the reference `simpler`, else `simpler`
    (a ratio inside the noise keeps the simpler variant)."""
    if comparison.reference != simpler:
        raise ForgeError(f"the comparison's reference is {comparison.reference!r}, not {simpler!r}")
    faster = [e for e in comparison.estimates.values() if e.clearly_faster]
    if faster:
        best = min(faster, key=lambda e: (e.ratio, e.name))
        return best.name, (f"{best.name} steps {best.ratio:.3f}x of {simpler} (90% interval {best.low:.3f}-"
                           f"{best.high:.3f}, {comparison.rounds} interleaved rounds): faster beyond the noise")
    closest = min(comparison.estimates.values(), key=lambda e: (e.ratio, e.name), default=None)
    if closest is None:
        return simpler, f"{simpler}: the only candidate"
    return simpler, (f"no candidate is faster than {simpler} beyond the noise (best: {closest.name} "
                     f"{closest.ratio:.3f}x, interval {closest.low:.3f}-{closest.high:.3f}, {comparison.rounds} "
                     f"rounds, {comparison.stopped}): the simpler {simpler} is kept")
