"""`chattts-forge serve`: see chattts_forge.runtime.serve and docs/serving.md."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from chattts_forge.artifact import ARTIFACT_JSON
from chattts_forge.errors import ForgeError
from chattts_forge.options import declared_options
from chattts_forge.runtime.providers import resolve_provider
from chattts_forge.runtime.serve.config import ServeConfig, ServeLaunch, ensure_admin_token


@click.command("serve")
@declared_options(ServeConfig)  # every option, declared once on its field (runtime/serve/config.py)
@declared_options(ServeLaunch)
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
    logging.shutdown()  # flush every log handler first: nothing said is lost
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def serve_config(options: dict[str, Any]) -> ServeConfig:
    """The ServeConfig of the command's options (paths checked, the provider resolved)."""
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
