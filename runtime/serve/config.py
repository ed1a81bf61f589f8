"""`ServeConfig`: what `chattts-forge serve` takes (no web package imported: the CLI builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServeConfig:
    """What `chattts-forge serve` takes (see its --help)."""

    artifact: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8
    max_queue: int = 64
    threads: int | None = None
    provider: str = "cpu"
    verify: str = "sha256"
    public_key: str | None = None
    voices_file: str | None = None
    phrase_cache: str | None = None
    cache_redis: str | None = None
    seed: int = 0
    deadline_s: float = 300.0
    max_input_chars: int = 4096
    admin_token: str | None = None
    canary_share: float = 0.0
    drain_s: float = 30.0
    warm_phrases: int = 8
    retry_after_s: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
