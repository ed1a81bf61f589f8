"""`chattts-forge serve`: see chattts_forge.runtime.serve and docs/serving.md."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import click

from chattts_forge.cli_options import provider_option
from chattts_forge.errors import ForgeError
from chattts_forge.runtime.serve.config import ServeConfig, ensure_admin_token


@click.command("serve")
@click.option("--artifact", required=True, type=click.Path(path_type=Path),
              help="A published version folder (artifacts/<model>/<version>: routing by length, its phrase cache) "
              "or one artifact (variant) folder.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Rows of each variant's running GPT batch (continuous batching).")
@click.option("--first-chunk-priority/--no-first-chunk-priority", default=True, show_default=True,
              help="While a request has no audio yet, one GPT step in three runs it alone (with any newer ones), "
                   "the running requests' next chunks wait, so its first audio does not wait behind them.")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests that may wait per variant; beyond it requests get 429 with Retry-After.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="onnxruntime intra-op threads.")
@provider_option
@click.option("--voices", "voices_file", type=click.Path(path_type=Path), default=None,
              help="JSON {name: speaker string}: named voices besides OpenAI's thirteen and 'default'.")
@click.option("--cache", "phrase_cache", type=click.Path(path_type=Path), default=None,
              help="Phrase cache file (default: the version's phrase_cache.bin).")
@click.option("--cache-redis", default=None, help="redis://HOST:PORT/DB: a phrase cache shared by replicas.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of requests that give none (synth's and warm's default; a phrase cache never sets it).")
@click.option("--deadline", "deadline_s", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds a request may take (a request's deadline_s may lower it).")
@click.option("--max-input-chars", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--admin-token", default=None, envvar="FORGE_ADMIN_TOKEN",
              help="Bearer token for /admin/* (default: a random one, generated at start into --admin-token-file).")
@click.option("--admin-token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where the generated admin token is written, mode 0600 (default: "
                   "$XDG_CONFIG_HOME/chattts-forge/admin-token-PORT); its path is logged.")
@click.option("--admin-loopback", is_flag=True, default=False,
              help="Let loopback clients use /admin/* without a token (no token is generated unless given).")
@click.option("--admin-host", "admin_hosts", multiple=True, metavar="NAME",
              help="A Host name /admin/* answers besides localhost, IP addresses and --host (repeatable).")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              help="Longest request body accepted (longer: 413).")
@click.option("--body-timeout", "body_timeout_s", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds a request body may take to arrive (else 408, counted as a disconnect).")
@click.option("--header-timeout", "header_timeout_s", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds a connection may take to send a request's headers (slow or stalled "
              "clients are closed).")
@click.option("--max-connections", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Open connections served at once; beyond it a new one gets 503 and is closed.")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="A web origin (https://app.example.com) whose pages may call the API, with CORS headers; "
              "requests carrying any other Origin are refused (403). Repeatable; '*' allows every site.")
@click.option("--forwarded-allow-ips", default="127.0.0.1", show_default=True, metavar="IPS",
              help="Comma-separated proxy addresses whose X-Forwarded-For/X-Forwarded-Proto are trusted "
              "('*': any; docs/serving.md 'Behind a proxy').")
@click.option("--canary-share", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="On reload, the share of new requests the new version gets until POST /admin/promote.")
@click.option("--drain", "drain_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds open requests may take to finish on SIGTERM or after a version swap.")
@click.option("--verify", type=click.Choice(["sha256", "full", "size"]), default="sha256", show_default=True,
              help="Check every file against its sha256 on load (sha256: through the verified-hash cache; "
                   "full: re-hash every time; size: sizes only, the explicit opt-out).")
@click.option("--public-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="PEM public key: every served folder's model.sig must verify with it (also on reload).")
@click.option("--warm-phrases", type=click.IntRange(min=0), default=8, show_default=True,
              help="Phrase-cache entries served once while warming a version.")
@click.option("--memory-limit", default=None, metavar="SIZE",
              help="Keep the process's RSS under SIZE (e.g. 6G): admit a miss only while what the running ones may "
                   "still add leaves room, else 503 with Retry-After; near SIZE, also lower the running batch and "
                   "empty the in-memory caches (docs/serving.md Operations).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS|local",
              help="Run the app as a Ray Serve deployment on this cluster (local: start one here); "
                   "Ray Serve's HTTP proxy listens on --host/--port (the scale extra).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --ray: replicas of the server, each loading the version (Ray Serve spreads requests).")
def serve(ray_address: str | None, replicas: int, **options: Any) -> None:
    """Serve an artifact over HTTP: OpenAI's POST /v1/audio/speech, a ChatTTS-native endpoint, metrics.

    Every request runs through the continuous-batching scheduler; /readyz answers 200 once the
    version is loaded, verified and warmed. SIGTERM drains, SIGHUP reloads --artifact.

    \b
    Examples:
      chattts-forge serve --artifact artifacts/chattts-synthetic-full-seed0/v1 --port 8000
      curl -s localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
          -d '{"model": "tts-1", "input": "你好。", "voice": "alloy", "response_format": "wav"}' -o a.wav
      chattts-forge serve --artifact artifacts/chattts-synthetic-full-seed0/v1 --ray local --replicas 2
    """
    cfg = serve_config(options)
    ensure_admin_token(cfg)  # once, before any replica starts: every replica takes the same token
    if ray_address is not None:
        from chattts_forge.runtime.serve.ray_serve import serve_on_ray

        serve_on_ray(cfg, ray_address, replicas)
        return
    if replicas != 1:
        raise ForgeError("--replicas needs --ray (one server process serves one replica)")
    from chattts_forge.runtime.serve.server import serve as run

    run(cfg)
    _exit_drained()


def _exit_drained() -> None:
    """Exit 0 once the server has drained and closed its schedulers, without the interpreter's
    teardown: daemon threads may still be inside onnxruntime or kaldifst (a warm-up, a grammar read,
    a cache fill), and tearing the interpreter down under them can abort the process (SIGABRT)."""
    import logging
    import os
    import sys

    logging.shutdown()  # flush every log handler first: nothing said is lost
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def serve_config(options: dict[str, Any]) -> ServeConfig:
    """The ServeConfig of the command's options (paths checked, the provider resolved)."""
    from chattts_forge.artifact import ARTIFACT_JSON
    from chattts_forge.runtime.providers import resolve_provider
    from chattts_forge.runtime.router import ROUTING_NAME

    artifact: Path = options.pop("artifact")
    if not artifact.is_dir() or not ((artifact / ARTIFACT_JSON).is_file() or (artifact / ROUTING_NAME).is_file()):
        raise ForgeError(f"--artifact {artifact} is neither an artifact folder ({ARTIFACT_JSON}) nor a published "
                         f"version folder ({ROUTING_NAME})")
    voices_file = options.get("voices_file")
    if voices_file is not None and not voices_file.is_file():
        raise ForgeError(f"--voices {voices_file} does not exist")
    paths = {k: str(options[k]) if options[k] is not None else None
             for k in ("voices_file", "phrase_cache", "public_key", "admin_token_file")}
    options["admin_hosts"] = tuple(options["admin_hosts"])
    options["cors_origins"] = tuple(_cors_origin(o) for o in options.get("cors_origins", ()))
    if options.get("memory_limit") is not None:
        from chattts_forge.runtime.serve.guard import parse_size

        options["memory_limit"] = parse_size(options["memory_limit"])
    return ServeConfig(artifact=str(artifact), **{**options, **paths,
                                                  "provider": resolve_provider(options["provider"])})


def _cors_origin(origin: str) -> str:
    """A --cors-origin value as browsers send it in `Origin` (lowercase, no trailing slash), checked."""
    value = origin.strip().lower().rstrip("/")
    scheme, sep, host = value.partition("://")
    if value != "*" and (not sep or scheme not in ("http", "https") or not host or "/" in host):
        raise ForgeError(f"--cors-origin takes SCHEME://HOST[:PORT] (e.g. https://app.example.com) or *, got {origin!r}")
    return value
