"""What `bench --load` takes: `LoadBenchConfig` (checked by `check`), the arrival of its requests
(`Arrival`, `ArrivalKind`) and the phrase-cache share's check; `load_bench` runs it.

Light on purpose (no runtime session imported): `bench`'s options map onto it before anything loads.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput, ForgeError

if TYPE_CHECKING:
    from chattts_forge.evaluate.load_bench import LoadRequest


class ArrivalKind(Choice):
    """How `bench --load` requests arrive: closed (concurrency in flight) or poisson (at --rate)."""

    CLOSED = "closed"
    POISSON = "poisson"


ARRIVALS = ArrivalKind.values()


def check_hit_ratio(ratio: float | None) -> None:
    if ratio is not None and not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and 0 <= ratio <= 1):
        raise BadInput(f"--phrase-cache-hit-ratio must lie in [0, 1], got {ratio}")


@dataclass(frozen=True)
class Arrival:
    """How requests arrive: `closed` (concurrency in flight) or `poisson` at `rate` per second (drawn with `seed`)."""

    kind: str = "closed"
    rate: float | None = None
    seed: int = 0

    def pace(self, requests: Sequence[LoadRequest], concurrency: int,
             start: Callable[[LoadRequest, Callable[[], None] | None], threading.Thread]) -> None:
        """Start every request (`start(req, done)`) as the arrival says, then wait for them all."""
        rng = np.random.default_rng(self.seed)
        threads = []
        if self.kind == "closed":
            slots = threading.Semaphore(concurrency)
            for req in requests:
                slots.acquire()
                threads.append(start(req, slots.release))
        else:
            for req in requests:
                threads.append(start(req, None))
                time.sleep(float(rng.exponential(1.0 / self.rate)))
        for t in threads:
            t.join()


@dataclass
class LoadBenchConfig:
    """What `bench --load` takes (see `run_load_bench` and the module docstring).

    `phrase_cache_hit_ratio` (0..1): that share of the requests are served from a warm phrase cache,
    `phrase_cache` (a file) or one built from their sentences. `decode_overlap`: the scheduler's
    Decoder + Vocos on its worker thread, overlapping the GPT steps (None: the scheduler's default).
    `url`: a `chattts-forge serve` server serving `artifact` (as its model or one of its variants)."""

    artifact: str | os.PathLike[str]
    concurrency: Sequence[int] = (1, 4, 8)
    requests: int = 16
    arrival: str = "closed"
    rate: float | None = None
    corpus: str = "builtin:evaluation"
    baseline: str | None = None
    checkpoint: str | os.PathLike[str] | None = None
    baseline_requests: int = 4
    threads: int = 2
    seed: int = 0
    stream_lookahead: int | str | None = None  # "exact", mel frames, or None: the artifact's recorded one
    phrase_cache_hit_ratio: float | None = None
    phrase_cache: str | os.PathLike[str] | None = None
    decode_overlap: bool | None = None
    first_chunk_priority: bool = True
    url: str | None = None
    json_out: str | os.PathLike[str] | None = None

    @property
    def levels(self) -> list[int]:
        return sorted({int(c) for c in self.concurrency})

    @property
    def arrivals(self) -> Arrival:
        return Arrival(self.arrival, self.rate, self.seed)

    def check(self) -> None:
        """A ForgeError naming the first option that cannot be run."""
        levels = self.levels
        if not levels or levels[0] < 1:
            raise BadInput("--concurrency takes values >= 1")
        if self.requests < 1:
            raise BadInput("--requests must be >= 1")
        if self.arrival not in ARRIVALS:
            raise BadInput(f"unknown arrival '{self.arrival}' (choose from: {', '.join(ARRIVALS)})")
        rate = self.rate
        if self.arrival == "poisson" and not (rate is not None and rate > 0 and math.isfinite(rate)):
            raise BadInput("--arrival poisson needs --rate R (requests per second, > 0)")
        if self.baseline not in (None, "pytorch"):
            raise BadInput(f"unknown baseline '{self.baseline}' (pytorch or none)")
        check_hit_ratio(self.phrase_cache_hit_ratio)
        if self.url is not None and self.phrase_cache_hit_ratio is not None:
            raise ForgeError("--url replays scheduled requests only (the server's phrase cache decides its hits); "
                             "drop --phrase-cache-hit-ratio")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise BadInput(f"--url must be http://HOST:PORT, got {self.url!r}")
        if self.phrase_cache is not None and self.phrase_cache_hit_ratio is None:
            raise BadInput("--phrase-cache needs --phrase-cache-hit-ratio R (the share of requests it serves)")

    def baseline_checkpoint(self, art: Path) -> Path | None:
        """The PyTorch baseline's checkpoint (None without a baseline); ForgeError when none is known."""
        if self.baseline != "pytorch":
            return None
        from chattts_forge.evaluate.bench import default_checkpoint

        ckpt = Path(self.checkpoint).expanduser() if self.checkpoint is not None else default_checkpoint(art)
        if ckpt is None:
            raise BadInput("the pytorch baseline needs --checkpoint (the artifact records no existing source folder)")
        return ckpt
