"""What a soak test takes (`SoakConfig`, checked by `check`) and its default request mix; `soak` runs it.

Light on purpose: `bench --soak`'s options map onto it before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from chattts_forge.errors import BadInput

# The share of each kind of request (soak's module docstring lists the kinds).
MIX = {"stream": 0.45, "whole": 0.2, "hit": 0.15, "hangup": 0.1, "malformed": 0.1}


@dataclass
class SoakConfig:
    url: str
    seconds: float
    concurrency: int = 8
    artifact: str | None = None  # its phrase cache supplies the hits; reloads reload it
    phrase_cache: str | None = None  # the hits' cache when not the artifact's (a server run with --phrase-cache)
    reload_every: float | None = None
    admin_token: str | None = None
    sample_every: float = 5.0
    window_s: float = 60.0
    seed: int = 0
    corpus: str = "builtin:evaluation"
    max_steps: int = 430
    retries: int = 8
    request_timeout_s: float = 600.0
    rate: float | None = None  # open loop: Poisson arrivals per second instead of `concurrency` clients
    max_in_flight: int = 256  # open loop: requests in flight at most (more arrivals wait client-side)
    mix: dict[str, float] = field(default_factory=lambda: dict(MIX))

    def check(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise BadInput(f"--url must be http://HOST:PORT, got {self.url!r}")
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise BadInput(f"--soak takes a positive number of seconds, got {self.seconds}")
        if self.concurrency < 1:
            raise BadInput(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise BadInput(f"--rate takes a positive number of requests per second, got {self.rate}")
        if self.reload_every is not None and not self.reload_every > 0:
            raise BadInput(f"--reload-every takes a positive number of seconds, got {self.reload_every}")
        if self.reload_every is not None and self.artifact is None:
            raise BadInput("--reload-every needs --artifact (the folder each reload loads)")
