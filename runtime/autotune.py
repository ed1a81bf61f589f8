"""Host-side routing: rank a version's gate-passing variants on the machine that serves them.

Quality is a property of an artifact, speed a property of an artifact on a machine. routing.json
records, per length bucket, the set of variants that pass the gate there (`passing`: measured by
the build, hardware-independent) beside the build machine's speed ranking (`build_ranking`,
`variant`). At its first load on a host the `Router` ranks each bucket's passing variants there:

- per bucket with two or more passing variants, one GPT decode step per variant at batch 1 with the
  bucket's context (`bucket_context`), the variants interleaved against the build's choice through
  `runtime.interleave.compare_interleaved` until every ratio's ~90% interval is within
  `AutotuneSettings.bound` or the bucket's share of `time_cap_s` is spent;
- a variant replaces the build's choice only when it is faster beyond the noise (`prefer_simpler`);
  the reason and the figures (ratio, interval, step ms, rounds, how it stopped) are recorded;
- the result is cached under the user cache (`$XDG_CACHE_HOME/chattts-forge/autotune/`, else
  `~/.cache/...`), keyed by the CPU model and SIMD flags, the onnxruntime version, the provider, threads and engine,
  and the manifest hashes of the version's variants: the second load reads it (no timing). The write
  is atomic; an unreadable or mismatched cache file is ignored (measured again, rewritten).

On a host with no cached record (`AutotuneSettings.cold_cache`, default "defer") the first load
times nothing: it serves the build's ranking (source "build", `pending` True) and the measurement
runs later, off the path to the first audio (`Router.tune_deferred`: `synth` after its files are
written, `serve` in the background after its first reply); "measure" times before the first text.

`autotune=False` (Router), `synth --no-autotune` or `CHATTTS_FORGE_AUTOTUNE=0` take the build's
ranking as it is. The record (`Router.autotune`) is what `synth` logs and a server can export.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.log import get_logger
from chattts_forge.runtime import machine
from chattts_forge.runtime.generation import open_gpt_step
from chattts_forge.runtime.interleave import (
    Clock,
    Comparison,
    RatioSettings,
    compare_interleaved,
    prefer_simpler,
)
from chattts_forge.runtime.loaded_artifact import LoadedArtifact
from chattts_forge.runtime.providers import resolve_provider
from chattts_forge.runtime.router import Bucket, bucket_build_ranking, bucket_passing, table_buckets
from chattts_forge.runtime.timed_engine import decode_step_call

log = get_logger(__name__)

AUTOTUNE_SCHEMA = "chattts-forge/autotune/1"
AUTOTUNE_ENV = "CHATTTS_FORGE_AUTOTUNE"  # "0"/"false"/"off": the build's ranking unless asked otherwise
# The context a bucket's texts decode at, on average: the prompt ([Stts], speaker, [Ptts] and one
# token per character) plus half the codes they generate (the past grows from prompt to prompt +
# codes). ChatTTS speaks ~4 Chinese characters a second at 46.875 codes a second: ~12 codes a char.
PROMPT_POSITIONS = 8
CODES_PER_CHAR = 12
OPEN_BUCKET_SPAN = 1.5  # an open-ended bucket (> N chars) is taken at 1.5 N characters
COLD_CACHE_CHOICES = ("defer", "measure")

# (variant folder, context positions) -> one repeatable GPT decode step at that context
StepFactory = Callable[[Path, int], Callable[[], object]]


def autotune_default() -> bool:
    """Whether the Router autotunes when not told (the `CHATTTS_FORGE_AUTOTUNE` environment variable)."""
    return os.environ.get(AUTOTUNE_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def bucket_context(bucket: Bucket, max_positions: int | None = None) -> int:
    """Positions of context a typical decode step of this bucket's texts sees (see the constants)."""
    chars = (bucket.min_chars + bucket.max_chars) / 2 if bucket.max_chars is not None else bucket.min_chars * OPEN_BUCKET_SPAN
    context = int(round(PROMPT_POSITIONS + chars + CODES_PER_CHAR * chars / 2))
    return max(1, min(context, max_positions - 2)) if max_positions else max(1, context)


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "chattts-forge" / "autotune"


@dataclass
class AutotuneSettings:
    """The first-load self-benchmark. `time_cap_s` bounds all buckets together (each gets its share);
    `step_factory` and `clock` replace the real GPT steps and timer (tests inject step costs).
    `cold_cache`: what a load that finds no cached record does - "defer" (the build's ranking now,
    the measurement later through `Router.tune_deferred`) or "measure" (time now, before any text).
    `batching`: rank only the variants the continuous-batching scheduler runs (`batchable`): `serve`
    sets it, since a variant served one request at a time loses under concurrency what it wins a step."""

    time_cap_s: float = 6.0
    cold_cache: str = "defer"
    bound: float = 0.03
    use_cache: bool = True
    cache_dir: Path | None = None
    clock: Clock = time.perf_counter
    step_factory: StepFactory | None = None
    extra_key: dict[str, Any] = field(default_factory=dict)
    batching: bool = False


# ---- one repeatable decode step --------------------------------------------------------------


def decode_call_at(step: Any, hidden_size: int, context: int, seed: int = 0) -> Callable[[], object]:
    """One decode step (batch 1) of a runtime GPT step object with `context` cached positions,
    repeatable: the cache is put back to `context` positions before every call."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((1, 1, hidden_size), dtype=np.float32)
    mask = np.ones((1, context + 1), dtype=np.int64)
    pos = np.full((1, 1), context, dtype=np.int64)
    if hasattr(step, "rewind"):  # the fused step: fill the cache once with a prefill, then rewind
        if hasattr(step, "reserve"):
            step.reserve(context + 1)
        step.reset(1)
        step(rng.standard_normal((1, context, hidden_size), dtype=np.float32), np.ones((1, context), dtype=np.int64),
             np.arange(context, dtype=np.int64)[None])

        def fused() -> object:
            step.rewind(context)
            return step(emb, mask, pos)

        return fused
    if hasattr(step, "past") and hasattr(step, "kv_heads"):
        return decode_step_call(step, hidden_size, context, batch=1, seed=seed)
    raise ForgeError(f"cannot time a {type(step).__name__} at a fixed context")


class RuntimeSteps:
    """The default step factory: each variant's own GPT step, as `Pipeline` would open it (`verify`,
    `public_key`: its files checked as the Pipeline would, so a Router can hand the opened artifact on)."""

    def __init__(self, provider: str = "cpu", threads: int | None = None, engine: str = "auto",
                 verify: str = "sha256", public_key: str | os.PathLike[str] | None = None) -> None:
        self.provider, self.threads, self.engine = provider, threads, engine
        self.verify, self.public_key = verify, public_key
        self._opened: dict[Path, tuple[Any, Any]] = {}

    def max_positions(self, folder: Path) -> int:
        """The model's positions, from artifact.json alone: a cache hit opens no variant."""
        return int(ArtifactMeta.load(folder).require_dims().max_position_embeddings)

    def _open(self, folder: Path) -> tuple[Any, Any]:
        if folder not in self._opened:
            # Not saved (runtime.saved_sessions): a variant timed here may never be served on this host,
            # and FP32's saved GPT graph alone is 1.5 GB written at the first load.
            artifact = LoadedArtifact(folder, provider=self.provider, threads=self.threads, verify=self.verify,
                                public_key=self.public_key, saved_sessions=False)
            self._opened[folder] = (artifact, open_gpt_step(artifact, self.engine))
        return self._opened[folder]

    def opened_artifact(self, folder: Path) -> Any:
        """The `runtime.loaded_artifact.LoadedArtifact` measured for `folder` (its sessions open), or None."""
        entry = self._opened.get(folder)
        return None if entry is None else entry[0]

    def __call__(self, folder: Path, context: int) -> Callable[[], object]:
        artifact, step = self._open(folder)
        return decode_call_at(step, artifact.dims.hidden_size, context)

    def close(self) -> None:
        self._opened.clear()  # the sessions go with the last reference


# ---- the cache -------------------------------------------------------------------------------


def cache_key(table: dict[str, Any], contexts: dict[str, int], *, provider: str, threads: int | None,
              engine: str, bound: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    return {"schema": AUTOTUNE_SCHEMA, "cpu_model": machine.cpu_model(), "cpu_flags": machine.cpu_flags(),
            "onnxruntime": ort.__version__,
            "provider": provider, "threads": threads, "engine": engine, "bound": bound, "contexts": contexts,
            "manifests": {v: rec.get("manifest_sha256") for v, rec in sorted(table["variants"].items())},
            **(extra or {})}


def cache_path(key: dict[str, Any], cache_dir: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]
    return (cache_dir or user_cache_dir()) / f"{digest}.json"


def read_cache(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached record for `key`, or None (absent, unreadable or another key: measured again)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("schema") != AUTOTUNE_SCHEMA or record.get("key") != key:
            raise ValueError("written for another machine, runtime or artifact")
        if not all(isinstance(b.get("variant"), str) for b in record["buckets"].values()):
            raise ValueError("a bucket without a variant")
        return record
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("autotune cache %s ignored (%s): measuring again", path, e)
        return None


# ---- the choice ------------------------------------------------------------------------------


def batchable(version_dir: Path, variants: list[str], provider: str = "cpu") -> list[str]:
    """Those of `variants` the continuous-batching scheduler runs (a fused GPT graph, on the CPU); all
    of them where none does (on CUDA every variant runs the plain graph, one request at a time)."""
    if resolve_provider(provider) != "cpu":
        return variants

    keep = [v for v in variants if FAST_GPT in ArtifactMeta.load(version_dir / v).components]
    return keep or variants


def candidates(version_dir: Path, table: dict[str, Any], batching: bool, provider: str = "cpu") -> dict[str, list[str]]:
    """Per bucket, the passing variants a host may route to (only `batchable` ones when `batching`)."""
    passing = {b["name"]: bucket_passing(b, table["fallback"]) for b in table["buckets"]}
    if batching:  # each variant's artifact.json read once, not once per bucket that lists it
        batched = set(batchable(version_dir, sorted({v for p in passing.values() for v in p}), provider))
        passing = {name: [v for v in p if v in batched] or p for name, p in passing.items()}
    return passing


def build_choice(table: dict[str, Any], why: str, allowed: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The record of taking the build's ranking as it is (its fastest `allowed` variant per bucket
    where the build's own choice is not allowed: `candidates`)."""
    buckets = {}
    for b in table["buckets"]:
        passing = bucket_passing(b, table["fallback"])
        reason = f"the build's ranking ({why}): {b.get('reason', '')}".rstrip(": ")
        variant = b["variant"]
        if allowed is not None and allowed[b["name"]] and variant not in allowed[b["name"]]:
            variant = next(v for v in bucket_build_ranking(b, table["fallback"]) if v in allowed[b["name"]])
            reason = f"the build's fastest variant the scheduler batches ({why}; the build's {b['variant']} is not)"
        buckets[b["name"]] = {"variant": variant, "build_variant": b["variant"], "passing": passing,
                              "reason": reason, "context": None, "comparison": None}
    return {"schema": AUTOTUNE_SCHEMA, "source": "build", "why": why, "cache_file": None, "seconds": 0.0,
            "buckets": buckets}


def choose_routes(
    version_dir: Path,
    table: dict[str, Any],
    settings: AutotuneSettings | None = None,
    *,
    provider: str = "cpu",
    threads: int | None = None,
    engine: str = "auto",
    steps: RuntimeSteps | None = None,
) -> dict[str, Any]:
    """The host's choice per bucket (cached; see the module docstring). Returns the record:
    {"schema", "source": "measured" | "cache", "cache_file", "seconds", "key",
     "buckets": {name: {"variant", "build_variant", "passing", "reason", "context", "comparison"}}}.
    `steps`: the caller's `RuntimeSteps` (left open: a Router reuses the artifacts it measured);
    default a private one, closed at the end."""
    settings = settings or AutotuneSettings()
    factory = settings.step_factory
    runtime_steps = None
    if factory is None:
        factory = runtime_steps = steps if steps is not None else RuntimeSteps(provider, threads, engine)
    entries = {b["name"]: b for b in table["buckets"]}
    allowed = candidates(version_dir, table, settings.batching, provider)
    to_rank = {n: p for n, p in allowed.items() if len(p) > 1}
    max_positions = None
    if runtime_steps is not None and to_rank:
        max_positions = runtime_steps.max_positions(version_dir / table["fallback"])
    contexts = {b.name: bucket_context(b, max_positions) for b in table_buckets(table) if b.name in to_rank}
    extra = {**settings.extra_key, "batching": True} if settings.batching else settings.extra_key
    key = cache_key(table, contexts, provider=provider, threads=threads, engine=engine, bound=settings.bound,
                    extra=extra)
    path = cache_path(key, settings.cache_dir)
    if settings.use_cache and to_rank:
        cached = read_cache(path, key)
        if cached is not None:
            cached["source"] = "cache"
            cached["cache_file"] = str(path)
            return cached
    if settings.cold_cache not in COLD_CACHE_CHOICES:
        raise BadInput(f"AutotuneSettings.cold_cache must be one of {', '.join(COLD_CACHE_CHOICES)}, "
                         f"got {settings.cold_cache!r}")
    if to_rank and settings.cold_cache == "defer":
        # Opening and timing every passing variant (FP32's 1.9 GB hashed and packed included) is most of
        # a fresh host's cold start: serve what the build measured until this host's figures exist.
        record = build_choice(table, "this host has not measured the version yet: the measurement runs "
                                     "after the first texts", allowed if settings.batching else None)
        record.update(pending=True, key=key)
        return record
    t0 = settings.clock()
    record: dict[str, Any] = {"schema": AUTOTUNE_SCHEMA, "source": "measured", "key": key, "cache_file": None,
                              "buckets": {}}
    share = settings.time_cap_s / max(1, len(to_rank))
    try:
        for name, entry in entries.items():
            build_variant = entry["variant"]
            passing = bucket_passing(entry, table["fallback"])
            if name not in to_rank:
                why = "the only variant that passes the gate here" if passing else "no variant passes here: the fallback"
                choice = build_variant
                if allowed[name] and build_variant not in allowed[name]:
                    choice, why = allowed[name][0], "the only passing variant the scheduler batches"
                record["buckets"][name] = {"variant": choice, "build_variant": build_variant, "passing": passing,
                                           "reason": why, "context": None, "comparison": None}
                continue
            pool = allowed[name]
            ranked = [v for v in bucket_build_ranking(entry, table["fallback"]) if v in pool]
            reference = build_variant if build_variant in pool else ranked[0]
            comparison = _compare(version_dir, reference, pool, contexts[name], factory, settings, share)
            choice, reason = prefer_simpler(comparison, reference)
            if reference != build_variant:
                why_not = "is not batched by the scheduler" if build_variant in passing else "does not pass here"
                reason += f" (the build's {build_variant} {why_not})"
            record["buckets"][name] = {"variant": choice, "build_variant": build_variant, "passing": passing,
                                       "reason": reason, "context": contexts[name], "comparison": comparison.to_dict()}
    finally:
        if runtime_steps is not None and runtime_steps is not steps:
            runtime_steps.close()
    record["seconds"] = round(settings.clock() - t0, 3)
    if to_rank and settings.use_cache:
        try:
            atomic_write_json(path, record)
            record["cache_file"] = str(path)
        except OSError as e:  # a read-only home still serves; it measures again next time
            log.warning("autotune: could not write its cache %s (%s)", path, e)
    return record


def _compare(version_dir: Path, reference: str, passing: list[str], context: int, factory: StepFactory,
             settings: AutotuneSettings, time_cap_s: float) -> Comparison:
    calls = {v: factory(version_dir / v, context) for v in passing}
    ratio = RatioSettings(bound=settings.bound, time_cap_s=time_cap_s, warmup_rounds=2)
    return compare_interleaved((reference, calls.pop(reference)), calls, ratio, clock=settings.clock)


def describe(record: dict[str, Any]) -> list[str]:
    """One line per bucket: the choice, why, and its figures (what synth logs)."""
    lines = []
    for name, b in record["buckets"].items():
        figures = ""
        comp = b.get("comparison")
        if comp:
            figures = "; " + ", ".join(f"{v} {c['ratio']:.3f}x [{c['low']:.3f}-{c['high']:.3f}] {c['step_ms']:.3f} ms"
                                       for v, c in comp["candidates"].items())
            figures += f" vs {comp['reference']} {next(iter(comp['candidates'].values()))['reference_step_ms']:.3f} ms" \
                if comp["candidates"] else ""
            figures += f" at context {b['context']}, {comp['rounds']} rounds ({comp['stopped']})"
        lines.append(f"bucket {name} -> {b['variant']} (build: {b['build_variant']}): {b['reason']}{figures}")
    return lines


def metrics(record: dict[str, Any]) -> dict[str, Any]:
    """Flat figures of the choice (for a server's /metrics): per bucket the variant and every ratio."""
    out: dict[str, Any] = {"autotune_source": record["source"], "autotune_seconds": record.get("seconds", 0.0)}
    for name, b in record["buckets"].items():
        out[f"route_{name}"] = b["variant"]
        for v, c in ((b.get("comparison") or {}).get("candidates") or {}).items():
            out[f"ratio_{name}_{v}"] = c["ratio"]
            out[f"spread_{name}_{v}"] = c["spread"]
    return out
