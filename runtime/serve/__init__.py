"""`chattts-forge serve`: the published artifacts behind an OpenAI-compatible streaming HTTP API.

- `formats`: wav/pcm/flac/mp3/opus/aac, whole or chunk by chunk;
- `engine`: `ServedVersion`, one loaded (verified, warmed) artifact or version folder with a
  continuous-batching scheduler per variant, length routing and the phrase caches;
- `redis_cache`: the optional phrase cache shared by replicas;
- `requests`: the OpenAI and ChatTTS-native request bodies, checked by type and range;
- `voices`: OpenAI's thirteen names, the voices file's, custom ids and weighted mixes as speakers;
- `connections`: uvicorn's h11 protocol with a header timeout, a connection bound and JSON errors;
- `metrics`: Prometheus metrics; `app`: the Starlette app and the version swaps; `refusals`: the
  server's own refusals as ForgeError types and the JSON error body its one handler sends; `server`: uvicorn
  with SIGTERM drain and SIGHUP reload; `config`: `ServeConfig`; `cli`: the command;
- `ray_serve`: the same app as a Ray Serve deployment (`--ray`; the scale extra, imported only then).

Needs the `serve` extra (starlette, uvicorn, prometheus-client; redis for --cache-redis). See
docs/serving.md "The server".
"""
