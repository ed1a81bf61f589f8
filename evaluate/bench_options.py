"""`BenchOptions`: every option of `chattts-forge bench`, declared once on its field
(`chattts_forge.options`); the command's click options are derived from it, and it maps itself onto
what each of its three runs takes: `BenchConfig` (the plain benchmark), `LoadBenchConfig` (--load) or
`SoakConfig` (--soak SECONDS).

Light on purpose (no onnxruntime session, no torch): the command builds it before anything loads.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass

import click

from chattts_forge.choices import Choice, plain
from chattts_forge.cli_options import PROVIDER_HELP
from chattts_forge.errors import BadInput
from chattts_forge.evaluate.bench import DEFAULT_TEXT, BenchConfig
from chattts_forge.evaluate.load_bench_config import ArrivalKind, LoadBenchConfig
from chattts_forge.evaluate.soak_config import SoakConfig
from chattts_forge.options import (
    declared_fields,
    option,
    option_spec,
    parse_declared_choices,
    refuse_options_not_read,
)
from chattts_forge.runtime.generation import GptEngine
from chattts_forge.runtime.providers import Provider
from chattts_forge.runtime.stream_decode import STREAM_LOOKAHEAD_HELP
from chattts_forge.runtime.synth import StreamLookaheadParam

# bench's three runs, as its errors name them
PLAIN_RUN, LOAD_RUN, SOAK_RUN = "the plain benchmark", "--load", "--soak"
# --load and --soak pick the run: every run reads them
_PICKS = ("load", "soak_s")
# The fields each run reads (its config's, and those bench_cli reads beside it), declared once: an
# option set away from its default for a run that does not read it is refused (`BenchOptions.run`).
FIELDS_READ_BY: dict[str, frozenset[str]] = {
    PLAIN_RUN: frozenset({
        *_PICKS, "artifact", "baseline", "checkpoint", "batch", "steps", "threads", "reps", "warmup_steps", "engine",
        "text", "no_first_audio", "stream_lookahead", "baseline_device", "provider", "json_out"}),
    LOAD_RUN: frozenset({
        *_PICKS, "artifact", "concurrency", "requests", "arrival", "rate", "baseline", "checkpoint", "baseline_requests",
        "threads", "stream_lookahead", "phrase_cache_hit_ratio", "phrase_cache", "decode_overlap",
        "first_chunk_priority", "url", "json_out"}),
    SOAK_RUN: frozenset({
        *_PICKS, "artifact", "url", "concurrency", "rate", "reload_every", "admin_token", "phrase_cache", "json_out",
        "plot"}),
}


class Baseline(Choice):
    """What the runtime is compared with in the same run: ChatTTS's own PyTorch FP32 pipeline, or nothing."""

    PYTORCH = "pytorch"
    NONE = "none"


def batch_sizes(value: str, option: str = "--batch") -> list[int]:
    """A comma-separated list of whole numbers >= 1 (--batch, --concurrency)."""
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"{option} takes comma-separated integers, got '{value}'") from None
    if not out or min(out) < 1:
        raise BadInput(f"{option} takes values >= 1, got '{value}'")
    return out


def _positive_seconds() -> click.FloatRange:
    return click.FloatRange(min=0, min_open=True)


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """One `chattts-forge bench` command line (see its --help): the plain benchmark's options, then
    --load's and --soak's. `soak_s` (--soak) picks the soak, else `load` the load benchmark (`run`); an
    option set away from its default that the picked run does not read (`FIELDS_READ_BY`) is refused."""

    artifact: str = option(MISSING, "--artifact", "Artifact folder to benchmark.", kind=click.Path(file_okay=False))
    baseline: Baseline = option(
        Baseline.NONE, "--baseline", "Also run ChatTTS's own PyTorch FP32 pipeline in the same process, interleaved.",
        choices=Baseline, show_default=True)
    checkpoint: str | None = option(
        None, "--checkpoint", "Checkpoint for the PyTorch baseline (default: the artifact's source).")
    batch: str = option("1,4,8", "--batch", "Comma-separated batch sizes.", show_default=True)
    steps: int = option(422, "--steps", "GPT steps per row (422 = 9 s of audio); EOS masked.", kind=int,
                        show_default=True)
    threads: int = option(2, "--threads", "intra-op threads (inter-op 1); torch.set_num_threads too.", kind=int,
                          show_default=True)
    reps: int = option(3, "--reps", "Timed repetitions (after one warm-up run).", kind=int, show_default=True)
    warmup_steps: int = option(16, "--warmup-steps", "Steps of the warm-up run of each engine.", kind=int,
                               show_default=True)
    engine: GptEngine = option(
        GptEngine.AUTO, "--engine",
        "Runtime GPT step: fast (gpt_fast.onnx, in-place KV cache), plain (gpt.onnx), auto (fast if present).",
        choices=GptEngine, show_default=True, noun="GPT engine")
    text: str | None = option(None, "--text", "Text to synthesize (default: a fixed Mandarin sentence).")
    no_first_audio: bool = option(False, "--no-first-audio", "Skip the streaming first-audio measurement.",
                                  is_flag=True)
    stream_lookahead: int | str | None = option(None, "--stream-lookahead", STREAM_LOOKAHEAD_HELP,
                                                kind=StreamLookaheadParam())
    # a torch device name (bench's own check: cpu or cuda), not one of the runtime's closed sets
    baseline_device: str = option("cpu", "--baseline-device", "torch device of the PyTorch baseline: cpu or cuda.",
                                  show_default=True)
    # a plain string on the command line (not a click.Choice): a bad value is the project's one-line error
    provider: Provider = option(Provider.CPU, "--provider", PROVIDER_HELP, show_default=True, parsed_as=Provider)
    load: bool = option(
        False, "--load", "Load benchmark instead: mixed-length sentences through the continuous-batching scheduler.",
        is_flag=True)
    concurrency: str = option("1,4,8", "--concurrency", "--load: comma-separated concurrency levels.",
                              show_default=True)
    requests: int = option(16, "--requests", "--load: requests per concurrency level.", kind=int, show_default=True)
    arrival: ArrivalKind = option(
        ArrivalKind.CLOSED, "--arrival",
        "--load: closed loop (concurrency requests in flight) or Poisson arrivals at --rate.", choices=ArrivalKind,
        show_default=True)
    rate: float | None = option(
        None, "--rate", "--load --arrival poisson, or --soak (open loop instead of --concurrency clients): requests "
        "per second.", kind=float)
    baseline_requests: int = option(
        4, "--baseline-requests", "--load --baseline pytorch: requests ChatTTS serves one after another.", kind=int,
        show_default=True)
    phrase_cache_hit_ratio: float | None = option(
        None, "--phrase-cache-hit-ratio", "--load: this share (0..1) of the requests are phrases of a warm phrase "
        "cache, served from it (no GPT work); the report splits latency and first audio by hit and miss.", kind=float,
        metavar="R")
    phrase_cache: str | None = option(
        None, "--phrase-cache", "--load --phrase-cache-hit-ratio: this cache (e.g. a version's phrase_cache.bin) "
        "instead of one built from the hit requests' sentences; --soak: the hits' phrases (the file given to serve "
        "--cache).", kind=click.Path(dir_okay=False))
    decode_overlap: bool | None = option(
        None, "--decode-overlap/--no-decode-overlap", "--load: the scheduler's Decoder + Vocos on a worker thread, "
        "overlapping the next GPT steps (default: on when --threads leaves a core free).")
    first_chunk_priority: bool | None = option(
        None, "--first-chunk-priority/--no-first-chunk-priority",
        "--load: a request without audio yet runs alone one GPT step in three (default: on, as serve does).")
    url: str | None = option(
        None, "--url", "--load: also replay each concurrency over HTTP against `chattts-forge serve` serving "
        "--artifact (real concurrent streaming clients), beside the in-process figures of the same run.",
        metavar="http://HOST:PORT")
    soak_s: float | None = option(
        None, "--soak", "Soak test instead: --concurrency clients send a realistic mix to the server at --url for "
        "SECONDS (every format whole and streamed, phrase-cache hits of --artifact's cache, hang-ups, malformed "
        "bodies), sampling its RSS, fds, threads and queue; exit 2 on any lost healthy request.",
        kind=_positive_seconds(), metavar="SECONDS")
    reload_every: float | None = option(
        None, "--reload-every", "--soak: POST /admin/reload {\"artifact\": --artifact} every SECONDS during the soak.",
        kind=_positive_seconds(), metavar="SECONDS")
    admin_token: str | None = option(
        None, "--admin-token", "--soak --reload-every: the server's admin bearer token (default: $FORGE_ADMIN_TOKEN).",
        envvar="FORGE_ADMIN_TOKEN")
    plot: str | None = option(
        None, "--plot", "--soak: write a PNG of RSS, fds, threads, queue and per-minute p50/p99 here.",
        kind=click.Path(dir_okay=False))
    json_out: str | None = option(None, "--json", "Write the report here.", kind=click.Path(dir_okay=False))

    def __post_init__(self) -> None:
        parse_declared_choices(self)
        refuse_options_not_read(BenchOptions, self.given(), FIELDS_READ_BY, self.run)

    @property
    def run(self) -> str:
        """Which run the command line asks for: `SOAK_RUN` (--soak), `LOAD_RUN` (--load) or `PLAIN_RUN`."""
        return SOAK_RUN if self.soak_s is not None else LOAD_RUN if self.load else PLAIN_RUN

    def given(self) -> dict[str, object]:
        """The options set away from their defaults (field -> value, in declaration order). One the
        environment can set (--admin-token) is never counted: a shell that exports it for the soak
        runs every other bench with it too."""
        return {f.name: getattr(self, f.name) for f in declared_fields(self)
                if plain(getattr(self, f.name)) != plain(f.default) and not option_spec(f).envvar}

    @property
    def baseline_or_none(self) -> str | None:
        """The baseline as the runs take it: "pytorch", or None for none."""
        return None if self.baseline == Baseline.NONE else plain(self.baseline)

    def bench_config(self) -> BenchConfig:
        """The plain benchmark's config (`bench.run_bench`)."""
        return BenchConfig(
            baseline=self.baseline_or_none, checkpoint=self.checkpoint, batches=batch_sizes(self.batch),
            steps=self.steps, threads=self.threads, reps=self.reps, warmup_steps=self.warmup_steps,
            engine=plain(self.engine), text=self.text if self.text is not None else DEFAULT_TEXT,
            first_audio=not self.no_first_audio, stream_lookahead=self.stream_lookahead,
            provider=plain(self.provider), baseline_device=self.baseline_device,
        )

    def load_config(self) -> LoadBenchConfig:
        """--load's config (`load_bench.run_load_bench`)."""
        return LoadBenchConfig(
            self.artifact, concurrency=batch_sizes(self.concurrency, "--concurrency"), requests=self.requests,
            arrival=plain(self.arrival), rate=self.rate, baseline=self.baseline_or_none, checkpoint=self.checkpoint,
            baseline_requests=self.baseline_requests, threads=self.threads, stream_lookahead=self.stream_lookahead,
            phrase_cache_hit_ratio=self.phrase_cache_hit_ratio, phrase_cache=self.phrase_cache,
            decode_overlap=self.decode_overlap, first_chunk_priority=self.first_chunk_priority is not False,
            url=self.url, json_out=self.json_out,
        )

    def soak_config(self) -> SoakConfig:
        """--soak's config (`soak.run_soak`): the largest --concurrency level's clients."""
        if self.url is None:
            raise BadInput("--soak needs --url http://HOST:PORT (a running chattts-forge serve)")
        assert self.soak_s is not None
        return SoakConfig(
            url=self.url, seconds=self.soak_s, concurrency=max(batch_sizes(self.concurrency, "--concurrency")),
            artifact=self.artifact, reload_every=self.reload_every, admin_token=self.admin_token, rate=self.rate,
            phrase_cache=self.phrase_cache)

