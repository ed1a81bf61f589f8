"""`ServeConfig`: what `chattts-forge serve` takes (no web package imported: the CLI builds it)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.log import get_logger

log = get_logger(__name__)


@dataclass
class ServeConfig:
    """What `chattts-forge serve` takes (see its --help)."""

    artifact: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8
    max_queue: int = 64
    first_chunk_priority: bool = True  # a request without audio yet goes first (runtime.scheduler)
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
    admin_token: str | None = None  # None: one is generated at start (app.ensure_admin_token) unless admin_loopback
    admin_token_file: str | None = None  # where a generated token is written (mode 0600); None: the user's config folder
    admin_loopback: bool = False  # loopback clients may use /admin/* without a token (the explicit opt-in)
    admin_hosts: tuple[str, ...] = ()  # Host names /admin/* answers besides localhost, IP literals and `host`
    max_body_bytes: int = 1 << 20  # a longer request body is refused (413) before it is parsed
    body_timeout_s: float = 5.0  # a body not received within this is a client disconnect (408)
    header_timeout_s: float = 5.0  # a connection's request headers must arrive within this (serve.connections)
    max_connections: int = 1000  # open connections beyond this are refused with 503 at once
    cors_origins: tuple[str, ...] = ()  # web origins whose pages may call the API ("*": any); others get 403
    forwarded_allow_ips: str = "127.0.0.1"  # proxies whose X-Forwarded-For/-Proto are trusted (uvicorn's rule)
    canary_share: float = 0.0
    drain_s: float = 30.0
    warm_phrases: int = 8
    retry_after_s: int = 1  # Retry-After of a refusal before any completion measured the drain rate
    memory_limit: int | None = None  # bytes of RSS the process stays under by shedding (serve.guard); None: no limit
    memory_long_chars: int = 64  # under memory pressure, misses with longer texts are refused first
    heap_trim_s: float = 30.0  # seconds between trims of the C heap (serve.state); 0: never
    extra: dict[str, Any] = field(default_factory=dict)


def admin_token_path(cfg: ServeConfig) -> Path:
    """Where a generated admin token goes: `admin_token_file`, else the user's config folder, per port."""
    from chattts_forge.signing import user_config_dir

    return Path(cfg.admin_token_file) if cfg.admin_token_file else user_config_dir() / f"admin-token-{cfg.port}"


def ensure_admin_token(cfg: ServeConfig) -> None:
    """Give `cfg` an admin token when it has none and loopback clients are not let in without one:
    a fresh random one, written (mode 0600, atomically) to `admin_token_path`, whose path is logged."""
    if cfg.admin_token or cfg.admin_loopback:
        return
    cfg.admin_token = secrets.token_urlsafe(32)
    path = admin_token_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_bytes(path, (cfg.admin_token + "\n").encode("ascii"), private=True)
    log.info("admin token written to %s (mode 0600): POST /admin/* with Authorization: Bearer $(cat %s)",
             path, path)
