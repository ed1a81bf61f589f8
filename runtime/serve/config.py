"""`ServeConfig`: what `chattts-forge serve` takes, each option declared on its field, and `ServeLaunch`: how it
runs (one process or Ray Serve replicas). No web package imported: the CLI builds them."""

from __future__ import annotations

import secrets
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import click

from chattts_forge.cli_options import PROVIDER_HELP
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import VerifyMode, check_verify_mode
from chattts_forge.log import get_logger
from chattts_forge.options import option

log = get_logger(__name__)


def _positive_seconds() -> click.FloatRange:
    return click.FloatRange(min=0, min_open=True)


@dataclass
class ServeConfig:
    """What `chattts-forge serve` takes (see its --help): each field declared with its option
    (`chattts_forge.options`), from which the command's click options are derived; the fields without
    one are the library's own settings. The CLI gives paths as `Path`s, `serve_config` turns them into
    the strings kept here; `provider` is the resolved one (cpu or cuda: `resolve_provider`)."""

    artifact: str = option(
        MISSING, "--artifact", "A published version folder (artifacts/<model>/<version>: routing by length, its phrase "
        "cache) or one artifact (variant) folder.", kind="path")
    host: str = option("127.0.0.1", "--host", "Address to listen on.", show_default=True)
    port: int = option(8000, "--port", kind=click.IntRange(0, 65535), show_default=True)
    max_batch: int = option(
        8, "--max-batch", "Rows of each variant's running GPT batch (continuous batching).",
        kind=click.IntRange(min=1), show_default=True)
    # a request without audio yet goes first (runtime.scheduler)
    first_chunk_priority: bool = option(
        True, "--first-chunk-priority/--no-first-chunk-priority",
        "While a request has no audio yet, one GPT step in three runs it alone (with any newer ones), the running "
        "requests' next chunks wait, so its first audio does not wait behind them.", show_default=True)
    max_queue: int = option(
        64, "--max-queue", "Requests that may wait per variant; beyond it requests get 429 with Retry-After.",
        kind=click.IntRange(min=0), show_default=True)
    threads: int | None = option(None, "--threads", "onnxruntime intra-op threads.", kind=click.IntRange(min=1))
    # a plain string on the command line (not a click.Choice): a bad value is the project's one-line error
    provider: str = option("cpu", "--provider", PROVIDER_HELP, show_default=True)
    voices_file: str | None = option(
        None, "--voices", "JSON {name: speaker string}: named voices besides OpenAI's thirteen and 'default'.",
        kind="path")
    phrase_cache: str | None = option(
        None, "--cache", "Phrase cache file (default: the version's phrase_cache.bin).", kind="path")
    cache_redis: str | None = option(None, "--cache-redis", "redis://HOST:PORT/DB: a phrase cache shared by replicas.")
    seed: int = option(
        0, "--seed", "Seed of requests that give none (synth's and warm's default; a phrase cache never sets it).",
        kind=int, show_default=True)
    deadline_s: float = option(
        300.0, "--deadline", "Seconds a request may take (a request's deadline_s may lower it).",
        kind=_positive_seconds(), show_default=True)
    max_input_chars: int = option(4096, "--max-input-chars", kind=click.IntRange(min=1), show_default=True)
    # None: one is generated at start (ensure_admin_token) unless admin_loopback
    admin_token: str | None = option(
        None, "--admin-token",
        "Bearer token for /admin/* (default: a random one, generated at start into --admin-token-file).",
        envvar="FORGE_ADMIN_TOKEN")
    # where a generated token is written (mode 0600); None: the user's config folder
    admin_token_file: str | None = option(
        None, "--admin-token-file", "Where the generated admin token is written, mode 0600 (default: "
        "$XDG_CONFIG_HOME/chattts-forge/admin-token-PORT); its path is logged.", kind="file")
    # loopback clients may use /admin/* without a token (the explicit opt-in)
    admin_loopback: bool = option(
        False, "--admin-loopback",
        "Let loopback clients use /admin/* without a token (no token is generated unless given).", is_flag=True,
        switch_default=True)
    # Host names /admin/* answers besides localhost, IP literals and `host`
    admin_hosts: tuple[str, ...] = option(
        (), "--admin-host", "A Host name /admin/* answers besides localhost, IP addresses and --host (repeatable).",
        multiple=True, metavar="NAME")
    # a longer request body is refused (413) before it is parsed
    max_body_bytes: int = option(
        1 << 20, "--max-body-bytes", "Longest request body accepted (longer: 413).", kind=click.IntRange(min=1),
        show_default=True)
    # a body not received within this is a client disconnect (408)
    body_timeout_s: float = option(
        5.0, "--body-timeout", "Seconds a request body may take to arrive (else 408, counted as a disconnect).",
        kind=_positive_seconds(), show_default=True)
    # a connection's request headers must arrive within this (serve.connections)
    header_timeout_s: float = option(
        5.0, "--header-timeout", "Seconds a connection may take to send a request's headers (slow or stalled "
        "clients are closed).", kind=_positive_seconds(), show_default=True)
    # open connections beyond this are refused with 503 at once
    max_connections: int = option(
        1000, "--max-connections", "Open connections served at once; beyond it a new one gets 503 and is closed.",
        kind=click.IntRange(min=1), show_default=True)
    # web origins whose pages may call the API ("*": any); others get 403
    cors_origins: tuple[str, ...] = option(
        (), "--cors-origin", "A web origin (https://app.example.com) whose pages may call the API, with CORS headers; "
        "requests carrying any other Origin are refused (403). Repeatable; '*' allows every site.", multiple=True,
        metavar="ORIGIN")
    # proxies whose X-Forwarded-For/-Proto are trusted (uvicorn's rule)
    forwarded_allow_ips: str = option(
        "127.0.0.1", "--forwarded-allow-ips", "Comma-separated proxy addresses whose X-Forwarded-For/X-Forwarded-Proto "
        "are trusted ('*': any; docs/serving.md 'Behind a proxy').", show_default=True, metavar="IPS")
    canary_share: float = option(
        0.0, "--canary-share", "On reload, the share of new requests the new version gets until POST /admin/promote.",
        kind=click.FloatRange(0, 1), show_default=True)
    drain_s: float = option(
        30.0, "--drain", "Seconds open requests may take to finish on SIGTERM or after a version swap.",
        kind=click.FloatRange(min=0), show_default=True)
    # serve refuses `none` (presence only): a server checks what it serves
    verify: VerifyMode = option(
        VerifyMode.SHA256, "--verify", "Check every file against its sha256 on load (sha256: through the verified-hash "
        "cache; full: re-hash every time; size: sizes only, the explicit opt-out).",
        choices=(VerifyMode.SHA256.value, VerifyMode.FULL.value, VerifyMode.SIZE.value), show_default=True)
    public_key: str | None = option(
        None, "--public-key",
        "PEM public key: every served folder's model.sig must verify with it (also on reload).",
        kind=click.Path(exists=True, dir_okay=False, path_type=Path))
    warm_phrases: int = option(
        8, "--warm-phrases", "Phrase-cache entries served once while warming a version.", kind=click.IntRange(min=0),
        show_default=True)
    # bytes of RSS the process stays under by shedding (serve.guard); None: no limit. The CLI gives SIZE
    # (e.g. 6G), which serve_config parses.
    memory_limit: int | None = option(
        None, "--memory-limit", "Keep the process's RSS under SIZE (e.g. 6G): admit a miss only while what the "
        "running ones may still add leaves room, else 503 with Retry-After; near SIZE, also lower the running batch "
        "and empty the in-memory caches (docs/serving.md Operations).", metavar="SIZE")
    retry_after_s: int = 1  # Retry-After of a refusal before any completion measured the drain rate
    memory_long_chars: int = 64  # under memory pressure, misses with longer texts are refused first
    heap_trim_s: float = 30.0  # seconds between trims of the C heap (serve.state); 0: never
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verify = VerifyMode(check_verify_mode(self.verify))


@dataclass(frozen=True)
class ServeLaunch:
    """How `chattts-forge serve` runs its ServeConfig: one server process, or Ray Serve replicas."""

    ray_address: str | None = option(
        None, "--ray", "Run the app as a Ray Serve deployment on this cluster (local: start one here); Ray Serve's "
        "HTTP proxy listens on --host/--port (the scale extra).", metavar="ADDRESS|local")
    replicas: int = option(
        1, "--replicas", "With --ray: replicas of the server, each loading the version (Ray Serve spreads requests).",
        kind=click.IntRange(min=1), show_default=True)


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
