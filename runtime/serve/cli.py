"""`chattts-forge serve`: see chattts_forge.runtime.serve and docs/serving.md."""

from __future__ import annotations

from pathlib import Path

import click

from chattts_forge.cli_options import provider_option
from chattts_forge.errors import ForgeError


@click.command("serve")
@click.option("--artifact", required=True, type=click.Path(path_type=Path),
              help="A published version folder (artifacts/<model>/<version>: routing by length, its phrase cache) "
              "or one artifact (variant) folder.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Rows of each variant's running GPT batch (continuous batching).")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests that may wait per variant; beyond it requests get 429 with Retry-After.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="onnxruntime intra-op threads.")
@provider_option
@click.option("--voices", "voices_file", type=click.Path(path_type=Path), default=None,
              help="JSON {name: speaker string}: named voices besides OpenAI's six and 'default'.")
@click.option("--cache", "phrase_cache", type=click.Path(path_type=Path), default=None,
              help="Phrase cache file (default: the version's phrase_cache.bin).")
@click.option("--cache-redis", default=None, help="redis://HOST:PORT/DB: a phrase cache shared by replicas.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Default seed of requests that give none (without a phrase cache to take the defaults from).")
@click.option("--deadline", "deadline_s", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds a request may take (a request's deadline_s may lower it).")
@click.option("--max-input-chars", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--admin-token", default=None, envvar="FORGE_ADMIN_TOKEN",
              help="Bearer token for /admin/* (without it only loopback clients may use them).")
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
def serve(artifact: Path, host: str, port: int, max_batch: int, max_queue: int, threads: int | None, provider: str,
          voices_file: Path | None, phrase_cache: Path | None, cache_redis: str | None, seed: int, deadline_s: float,
          max_input_chars: int, admin_token: str | None, canary_share: float, drain_s: float, verify: str,
          public_key: Path | None, warm_phrases: int) -> None:
    """Serve an artifact over HTTP: OpenAI's POST /v1/audio/speech, a ChatTTS-native endpoint, metrics.

    Every request runs through the continuous-batching scheduler; /readyz answers 200 once the
    version is loaded, verified and warmed. SIGTERM drains, SIGHUP reloads --artifact.

    \b
    Examples:
      chattts-forge serve --artifact artifacts/chattts-synthetic-full-seed0/v1 --port 8000
      curl -s localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
          -d '{"model": "tts-1", "input": "你好。", "voice": "alloy", "response_format": "wav"}' -o a.wav
    """
    from chattts_forge.artifact import ARTIFACT_JSON
    from chattts_forge.runtime.router import ROUTING_NAME

    if not artifact.is_dir() or not ((artifact / ARTIFACT_JSON).is_file() or (artifact / ROUTING_NAME).is_file()):
        raise ForgeError(f"--artifact {artifact} is neither an artifact folder ({ARTIFACT_JSON}) nor a published "
                         f"version folder ({ROUTING_NAME})")
    if voices_file is not None and not voices_file.is_file():
        raise ForgeError(f"--voices {voices_file} does not exist")
    from chattts_forge.runtime.providers import resolve_provider
    from chattts_forge.runtime.serve.app import ServeConfig
    from chattts_forge.runtime.serve.server import serve as run

    cfg = ServeConfig(artifact=str(artifact), host=host, port=port, max_batch=max_batch, max_queue=max_queue,
                      threads=threads, provider=resolve_provider(provider), verify=verify,
                      public_key=str(public_key) if public_key else None,
                      voices_file=str(voices_file) if voices_file else None,
                      phrase_cache=str(phrase_cache) if phrase_cache else None, cache_redis=cache_redis, seed=seed,
                      deadline_s=deadline_s, max_input_chars=max_input_chars, admin_token=admin_token,
                      canary_share=canary_share, drain_s=drain_s, warm_phrases=warm_phrases)
    run(cfg)
