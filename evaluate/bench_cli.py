"""`chattts-forge bench`: the artifact's runtime against ChatTTS's PyTorch FP32, in one run.

The command maps its options onto a `BenchConfig` for `chattts_forge.evaluate.bench.run_bench` (or, with
--load, onto `load_bench.run_load_bench`); docs/bench.md lists the JSON keys.
"""

from __future__ import annotations

from typing import Any

import click

from chattts_forge.cli_options import provider_option
from chattts_forge.errors import ForgeError
from chattts_forge.runtime.stream_decode import STREAM_LOOKAHEAD_HELP
from chattts_forge.runtime.synth import StreamLookaheadParam

# Options (parameter names) of the load benchmark alone, refused without --load.
LOAD_ONLY = ("phrase_cache_hit_ratio", "phrase_cache", "decode_overlap", "first_chunk_priority", "url")
# Options of the soak alone (--soak), refused without it.
SOAK_ONLY = ("reload_every", "plot")


def _batches(value: str, option: str = "--batch") -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ForgeError(f"{option} takes comma-separated integers, got '{value}'") from None
    if not out or min(out) < 1:
        raise ForgeError(f"{option} takes values >= 1, got '{value}'")
    return out


@click.command("bench")
@click.option("--artifact", required=True, type=click.Path(file_okay=False), help="Artifact folder to benchmark.")
@click.option(
    "--baseline",
    type=click.Choice(["pytorch", "none"]),
    default="none",
    show_default=True,
    help="Also run ChatTTS's own PyTorch FP32 pipeline in the same process, interleaved.",
)
@click.option("--checkpoint", default=None, help="Checkpoint for the PyTorch baseline (default: the artifact's source).")
@click.option("--batch", "batch", default="1,4,8", show_default=True, help="Comma-separated batch sizes.")
@click.option("--steps", default=422, show_default=True, type=int, help="GPT steps per row (422 = 9 s of audio); EOS masked.")
@click.option("--threads", default=2, show_default=True, type=int, help="intra-op threads (inter-op 1); torch.set_num_threads too.")
@click.option("--reps", default=3, show_default=True, type=int, help="Timed repetitions (after one warm-up run).")
@click.option("--warmup-steps", default=16, show_default=True, type=int, help="Steps of the warm-up run of each engine.")
@click.option(
    "--engine",
    type=click.Choice(["auto", "fast", "plain"]),
    default="auto",
    show_default=True,
    help="Runtime GPT step: fast (gpt_fast.onnx, in-place KV cache), plain (gpt.onnx), auto (fast if present).",
)
@click.option("--text", default=None, help="Text to synthesize (default: a fixed Mandarin sentence).")
@click.option("--no-first-audio", is_flag=True, help="Skip the streaming first-audio measurement.")
@click.option(
    "--stream-lookahead",
    type=StreamLookaheadParam(),
    default=None,
    help=STREAM_LOOKAHEAD_HELP,
)
@click.option(
    "--baseline-device",
    default="cpu",
    show_default=True,
    help="torch device of the PyTorch baseline: cpu or cuda.",
)
@provider_option
@click.option("--load", is_flag=True,
              help="Load benchmark instead: mixed-length sentences through the continuous-batching scheduler.")
@click.option("--concurrency", default="1,4,8", show_default=True, help="--load: comma-separated concurrency levels.")
@click.option("--requests", default=16, show_default=True, type=int, help="--load: requests per concurrency level.")
@click.option("--arrival", type=click.Choice(["closed", "poisson"]), default="closed", show_default=True,
              help="--load: closed loop (concurrency requests in flight) or Poisson arrivals at --rate.")
@click.option("--rate", type=float, default=None,
              help="--load --arrival poisson, or --soak (open loop instead of --concurrency clients): requests per "
                   "second.")
@click.option("--baseline-requests", default=4, show_default=True, type=int,
              help="--load --baseline pytorch: requests ChatTTS serves one after another.")
@click.option("--phrase-cache-hit-ratio", type=float, default=None, metavar="R",
              help="--load: this share (0..1) of the requests are phrases of a warm phrase cache, served from it "
                   "(no GPT work); the report splits latency and first audio by hit and miss.")
@click.option("--phrase-cache", "phrase_cache", default=None, type=click.Path(dir_okay=False),
              help="--load --phrase-cache-hit-ratio: this cache (e.g. a version's phrase_cache.bin) instead of one "
                   "built from the hit requests' sentences; --soak: the hits' phrases (the file given to serve --cache).")
@click.option("--decode-overlap/--no-decode-overlap", default=None,
              help="--load: the scheduler's Decoder + Vocos on a worker thread, overlapping the next GPT steps "
                   "(default: on when --threads leaves a core free).")
@click.option("--first-chunk-priority/--no-first-chunk-priority", default=None,
              help="--load: a request without audio yet runs alone one GPT step in three (default: on, as serve does).")
@click.option("--url", default=None, metavar="http://HOST:PORT",
              help="--load: also replay each concurrency over HTTP against `chattts-forge serve` serving --artifact "
                   "(real concurrent streaming clients), beside the in-process figures of the same run.")
@click.option("--soak", "soak_s", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Soak test instead: --concurrency clients send a realistic mix to the server at --url for SECONDS "
                   "(every format whole and streamed, phrase-cache hits of --artifact's cache, hang-ups, malformed "
                   "bodies), sampling its RSS, fds, threads and queue; exit 2 on any lost healthy request.")
@click.option("--reload-every", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="--soak: POST /admin/reload {\"artifact\": --artifact} every SECONDS during the soak.")
@click.option("--admin-token", default=None, envvar="FORGE_ADMIN_TOKEN",
              help="--soak --reload-every: the server's admin bearer token (default: $FORGE_ADMIN_TOKEN).")
@click.option("--plot", default=None, type=click.Path(dir_okay=False),
              help="--soak: write a PNG of RSS, fds, threads, queue and per-minute p50/p99 here.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False), help="Write the report here.")
def bench(**options: Any) -> None:
    """Benchmark an artifact against ChatTTS's PyTorch pipeline in one run.

    \b
    Per-step latency (GPT alone and full step), code-stage and end-to-end RTF for `--steps`
    steps of audio, first audio when streaming, real-time streams per batch size, peak RSS,
    each as a ratio to the PyTorch baseline of the same run. Timings are medians [p10-p90].
    """
    soak_s = options.pop("soak_s")
    if soak_s is not None:
        _soak(soak_s, options)
        return
    if any(options[name] is not None for name in SOAK_ONLY):
        raise ForgeError("--reload-every and --plot belong to the soak test (--soak SECONDS --url URL)")
    options.pop("admin_token")
    if options.pop("load"):
        _load_bench(options)
        return
    if any(options[name] is not None for name in LOAD_ONLY):
        raise ForgeError("--phrase-cache-hit-ratio, --phrase-cache, --decode-overlap, --first-chunk-priority and "
                         "--url belong to the load benchmark (--load)")
    from chattts_forge.evaluate.bench import DEFAULT_TEXT, BenchConfig, format_table, run_bench

    config = BenchConfig(
        baseline=None if options["baseline"] == "none" else options["baseline"],
        checkpoint=options["checkpoint"],
        batches=_batches(options["batch"]),
        steps=options["steps"],
        threads=options["threads"],
        reps=options["reps"],
        warmup_steps=options["warmup_steps"],
        engine=options["engine"],
        text=options["text"] if options["text"] is not None else DEFAULT_TEXT,
        first_audio=not options["no_first_audio"],
        stream_lookahead=options["stream_lookahead"],
        provider=options["provider"],
        baseline_device=options["baseline_device"],
    )
    json_out = options["json_out"]
    report = run_bench(options["artifact"], config, json_out=json_out, progress=lambda msg: click.echo(msg, err=True))
    click.echo(format_table(report))
    if json_out:
        click.echo(f"wrote {json_out}")


def _load_bench(o: dict[str, Any]) -> None:
    """`bench --load`: the options mapped onto `load_bench.run_load_bench`."""
    from chattts_forge.evaluate.load_bench import LoadBenchConfig, format_load_table, run_load_bench

    report = run_load_bench(LoadBenchConfig(
        o["artifact"], concurrency=_batches(o["concurrency"], "--concurrency"), requests=o["requests"],
        arrival=o["arrival"], rate=o["rate"], baseline=None if o["baseline"] == "none" else o["baseline"],
        checkpoint=o["checkpoint"], baseline_requests=o["baseline_requests"], threads=o["threads"],
        stream_lookahead=o["stream_lookahead"], phrase_cache_hit_ratio=o["phrase_cache_hit_ratio"],
        phrase_cache=o["phrase_cache"], decode_overlap=o["decode_overlap"],
        first_chunk_priority=o["first_chunk_priority"] is not False, url=o["url"], json_out=o["json_out"],
    ), progress=lambda msg: click.echo(msg, err=True))
    click.echo(format_load_table(report))
    if o["json_out"]:
        click.echo(f"wrote {o['json_out']}")


def _soak(seconds: float, o: dict[str, Any]) -> None:
    """`bench --soak SECONDS --url URL`: evaluate.soak against a running server."""
    from chattts_forge.evaluate.soak import SoakConfig, format_soak, run_soak

    if o["url"] is None:
        raise ForgeError("--soak needs --url http://HOST:PORT (a running chattts-forge serve)")
    cfg = SoakConfig(url=o["url"], seconds=seconds, concurrency=max(_batches(o["concurrency"], "--concurrency")),
                     artifact=o["artifact"], reload_every=o["reload_every"], admin_token=o["admin_token"],
                     rate=o["rate"], phrase_cache=o["phrase_cache"])
    report = run_soak(cfg, json_out=o["json_out"], plot_out=o["plot"], progress=lambda msg: click.echo(msg, err=True))
    click.echo(format_soak(report))
    for path in (o["json_out"], o["plot"]):
        if path:
            click.echo(f"wrote {path}")
