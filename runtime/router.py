"""Precision routing by text length: a published version's `routing.json` and the `Router` that serves it.

Quantization error grows with the length of what is spoken, so a version does not serve one
precision: the build measures every variant per length bucket of the held-out corpus (evaluate's
`buckets` section) and writes `artifacts/<model>/<version>/routing.json`, naming for each bucket the
fastest variant that passes the gate in that bucket (FP32 as the fallback). The `Router` reads it,
measures texts with a session-free front end (`Router.front`, runtime.textfront), opens a variant on
its first text (its files checked, its sessions loaded) and sends each text to its bucket's variant;
a variant no bucket routes to (FP32 included) is never opened. `variant=` overrides the table.

Length: characters of the ChatTTS-normalised text, whitespace excluded (`text_length`). Buckets
are inclusive ranges `[min_chars, max_chars]` (`max_chars` None: no upper end); the default
buckets are <= 10, 11-40 and > 40 characters (`DEFAULT_BUCKETS`; a gate file may set others).

routing.json (schema ``chattts-forge/routing/1``, sorted keys, no wall clock: the same reports give
the same bytes)::

    {"schema", "model", "version", "length": "...", "fallback": "fp32",
     "buckets": [{"name", "min_chars", "max_chars", "variant", "reason",
                  "figures": {variant: {"passed", "rtf_p50", "seconds_p50", "code_agreement", ...}}}],
     "variants": {variant: {"manifest_sha256", "payload_sha256", "report_sha256", "evaluated_at",
                            "memory" (since issue 50; absent for reports without it): {"peak_rss_mb_by_batch":
                            {"1", "8"}, "after_load_mb", "python_baseline_mb", "steps", "threads", "provider",
                            "command"}}}}

`memory` is each variant's own peak RSS (MiB) through load and a synthesis at batch 1 and 8, each
measured in a process of its own by the build (runtime.memory_probe); `serve --memory-limit` warns at
start when the limit cannot hold the routed variants at its `--max-batch` (serve.guard.memory_warning).

A table naming a variant that is not published in the version folder (or whose payload differs from
the one it was measured on) is refused with a one-line ForgeError naming it; `verify` says the same.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from chattts_forge.artifact import ARTIFACT_JSON
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import resolve_inside
from chattts_forge.log import get_logger
from chattts_forge.runtime.phrase_cache import PhraseCache, payload_sha256
from chattts_forge.runtime.pipeline import Pipeline, SynthParams
from chattts_forge.runtime.routing_record import (
    ROUTING_SCHEMA,
    RoutingTable,
    encode_routing,
    routing_builtins,
    routing_from_builtins,
)
from chattts_forge.runtime.textfront import TextFront

if TYPE_CHECKING:
    from chattts_forge.runtime.autotune import AutotuneSettings
    from chattts_forge.runtime.pipeline import Result

log = get_logger(__name__)

ROUTING_NAME = "routing.json"
FALLBACK_VARIANT = "fp32"
LENGTH_DEFINITION = "characters of the ChatTTS-normalised text, whitespace excluded"


@dataclass(frozen=True)
class Bucket:
    """Texts of `min_chars` to `max_chars` normalised characters (both inclusive; None: no upper end)."""

    name: str
    min_chars: int
    max_chars: int | None

    def holds(self, length: int) -> bool:
        return length >= self.min_chars and (self.max_chars is None or length <= self.max_chars)

    def describe(self) -> str:
        if self.max_chars is None:
            return f"> {self.min_chars - 1} chars"
        return f"<= {self.max_chars} chars" if self.min_chars <= 1 else f"{self.min_chars}-{self.max_chars} chars"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min_chars": self.min_chars, "max_chars": self.max_chars}


def buckets_from_edges(edges: Sequence[int], names: Sequence[str] | None = None) -> tuple[Bucket, ...]:
    """Buckets split at `edges` (the inclusive upper ends, increasing): [10, 40] -> <=10, 11-40, >40."""
    if not isinstance(edges, (list, tuple)) or (names is not None and not isinstance(names, (list, tuple))):
        raise BadInput(f"bucket edges and names must be lists, got {type(edges).__name__} and {type(names).__name__}")
    edges = list(edges)
    if any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in edges) or edges != sorted(set(edges)):
        raise BadInput(f"bucket edges must be increasing whole numbers >= 1, got {edges}")
    if names is None:
        names = ("short", "medium", "long") if len(edges) == 2 else [f"b{i}" for i in range(len(edges) + 1)]
    names = list(names)
    if not all(isinstance(n, str) and n for n in names):
        raise BadInput(f"bucket names must be non-empty strings, got {names}")
    if len(names) != len(edges) + 1 or len(set(names)) != len(names):
        raise BadInput(f"give {len(edges) + 1} distinct bucket names for edges {edges}, got {names}")
    lows = [1, *(e + 1 for e in edges)]
    highs: list[int | None] = [*edges, None]
    return tuple(Bucket(n, lo, hi) for n, lo, hi in zip(names, lows, highs, strict=True))


DEFAULT_BUCKETS = buckets_from_edges([10, 40])


def text_length(normalised: str) -> int:
    """The routing length of a normalised text (see module docstring)."""
    return sum(1 for ch in normalised if not ch.isspace())


def bucket_of(length: int, buckets: Sequence[Bucket]) -> Bucket:
    for b in buckets:
        if b.holds(length):
            return b
    raise ForgeError(f"no bucket holds a text of {length} characters (buckets: {', '.join(b.describe() for b in buckets)})")


# ---- routing.json ------------------------------------------------------------------------------


def routing_bytes(table: dict[str, Any] | RoutingTable) -> bytes:
    """The canonical bytes of a routing table (sorted keys, indented, trailing newline), written
    through its record (runtime.routing_record), which checks every field's type first."""
    return encode_routing(table if isinstance(table, RoutingTable) else routing_from_builtins(table))


def load_routing(version_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check `version_dir/routing.json` (schema, buckets, every routed variant published)."""
    version_dir = Path(version_dir)
    path = version_dir / ROUTING_NAME
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{version_dir} has no {ROUTING_NAME}: not a published version folder with a routing table") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BadInput(f"{path}: not valid JSON ({e})") from None
    problems = routing_problems(table, version_dir)
    if problems:
        raise ForgeError(problems[0])
    try:  # every field's type, beyond what the router's own checks read
        return routing_builtins(routing_from_builtins(table))
    except msgspec.ValidationError as e:
        raise ForgeError(f"{path}: {e}") from None


def bucket_passing(entry: dict[str, Any], fallback: str = FALLBACK_VARIANT) -> list[str]:
    """The variants that pass the gate in a routing.json bucket, sorted. Tables written before the
    `passing` key: the variants whose figures say passed, else the routed variant unless it is the
    fallback of a bucket nothing passed in."""
    if isinstance(entry.get("passing"), list):
        return sorted(str(v) for v in entry["passing"])
    figures = entry.get("figures") or {}
    passed = sorted(v for v, f in figures.items() if isinstance(f, dict) and f.get("passed") is True)
    if passed:
        return passed
    return [] if entry["variant"] == fallback else [entry["variant"]]


def bucket_build_ranking(entry: dict[str, Any], fallback: str = FALLBACK_VARIANT) -> list[str]:
    """The passing variants of a bucket, fastest first on the build machine (`build_ranking`, else by
    the figures' median RTF; ties by name)."""
    passing = bucket_passing(entry, fallback)
    if isinstance(entry.get("build_ranking"), list):
        return [str(v) for v in entry["build_ranking"] if v in passing]
    figures = entry.get("figures") or {}

    def build_rtf(v: str) -> float:
        rtf = (figures.get(v) or {}).get("rtf_p50")
        return float(rtf) if isinstance(rtf, int | float) else float("inf")

    return sorted(passing, key=lambda v: (v != entry["variant"], build_rtf(v), v))


def table_buckets(table: dict[str, Any]) -> tuple[Bucket, ...]:
    return tuple(Bucket(b["name"], int(b["min_chars"]), b["max_chars"]) for b in table["buckets"])


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def routing_shape_problems(table: dict[str, Any], path: Path) -> list[str]:
    """Types and ranges of what the router reads (buckets, variants, fallback), before any is used."""
    buckets, variants, fallback = table.get("buckets"), table.get("variants"), table.get("fallback")
    if not isinstance(buckets, list) or not buckets:
        return [f"{path}: 'buckets' must be a non-empty list"]
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        return [f"{path}: 'variants' must be an object of variant records"]
    if not isinstance(fallback, str):
        return [f"{path}: 'fallback' must be a variant name string"]
    for i, b in enumerate(buckets):
        where = f"{path}: buckets[{i}]"
        if not isinstance(b, dict):
            return [f"{where} is not an object"]
        if not isinstance(b.get("name"), str) or not isinstance(b.get("variant"), str):
            return [f"{where}: 'name' and 'variant' must be strings"]
        if "max_chars" not in b:
            return [f"{where}: 'max_chars' is missing (null for no upper end)"]
        lo, hi = b.get("min_chars"), b.get("max_chars")
        if not _whole(lo) or lo < 1 or (hi is not None and (not _whole(hi) or hi < lo)):
            return [f"{where}: min_chars/max_chars must be whole numbers, 1 <= min_chars <= max_chars (or null), "
                    f"got {lo!r}/{hi!r}"]
        for key in ("passing", "build_ranking"):  # the gate's passing set, the build's speed order
            names = b.get(key)
            if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                return [f"{where}: '{key}' must be a list of variant names"]
        figures = b.get("figures")
        if figures is not None and not (isinstance(figures, dict) and all(isinstance(f, dict) for f in figures.values())):
            return [f"{where}: 'figures' must be an object of per-variant figures"]
    return []


def routing_problems(table: Any, version_dir: Path) -> list[str]:
    """What is wrong with a routing table in its version folder (each names routing.json)."""
    path = version_dir / ROUTING_NAME
    if not isinstance(table, dict) or table.get("schema") != ROUTING_SCHEMA:
        got = table.get("schema") if isinstance(table, dict) else None
        return [f"{path}: schema {got!r} is not {ROUTING_SCHEMA!r}"]
    shape = routing_shape_problems(table, path)
    if shape:
        return shape
    buckets = table_buckets(table)
    routed = {b["name"]: b["variant"] for b in table["buckets"]}
    recorded = table["variants"]
    fallback = table["fallback"]
    problems = []
    expect = 1
    for b in buckets:
        if b.min_chars != expect:
            problems.append(f"{path}: bucket {b.name!r} starts at {b.min_chars} chars, expected {expect} (gap or overlap)")
            break
        expect = (b.max_chars or 0) + 1
    if buckets and buckets[-1].max_chars is not None:
        problems.append(f"{path}: the last bucket must have no upper end")

    passing = [(f"bucket {b['name']!r} (passing)", b["name"], v) for b in table["buckets"]
               for v in bucket_passing(b, fallback) if v != b["variant"]]
    routes = [(f"bucket {n!r}", f"buckets[{n!r}].variant", v) for n, v in routed.items()]
    for where, field, variant in [*routes, ("the fallback", "fallback", fallback), *passing]:
        if where.endswith("(passing)"):
            field = f"buckets[{field!r}].passing"
        try:
            folder = variant_folder(version_dir, variant, file=path, field=field)
        except ForgeError as e:
            problems.append(str(e))
            continue
        if not (folder / ARTIFACT_JSON).is_file() or not (folder / "manifest.json").is_file():
            problems.append(f"{path}: {where} routes to variant {variant!r}, which is not published in {version_dir}")
        elif variant not in recorded:
            problems.append(f"{path}: {where} routes to variant {variant!r}, which its 'variants' section does not record")
        elif recorded[variant].get("payload_sha256") != payload_sha256(folder):
            problems.append(f"{path}: variant {variant!r} in {folder} is not the artifact the table was measured on "
                            "(payload hash differs)")
    return problems


def variant_folder(version_dir: Path, variant: str, *, file: str | os.PathLike[str], field: str) -> Path:
    """A variant's folder in a version folder: one plain name, confined to it (no path, no `..`, no
    symbolic link out); else a one-line ForgeError naming `file` and `field`."""
    if isinstance(variant, str) and ("/" in variant or "\\" in variant):
        raise BadInput(f"{file}: {field} must be a variant name, not a path ({variant!r})")
    return resolve_inside(version_dir, variant, file=file, field=field)


# ---- the router ------------------------------------------------------------------------------


class Router:
    """Serve a published version: each text goes to the variant its length bucket names.

    `Router(version_dir, variant=None, cache=None, autotune=None, **pipeline_kwargs)`; `variant` sends
    every text to that published variant instead. `cache` (a phrase cache file or `PhraseCache`) is
    attached to every variant it was built for (a cache covering none of them is refused).

    `autotune`: rank each bucket's gate-passing variants on this host at first load (cached;
    runtime.autotune) - True, False (the build's ranking), an `AutotuneSettings`, or None (the
    `CHATTTS_FORGE_AUTOTUNE` environment variable, on unless "0"). `self.autotune` records the
    choice, why, and its figures (`autotune.describe` / `autotune.metrics` render it).
    `keep_measured`: the variants it routes to keep the artifacts (open sessions) autotune measured,
    for their Pipelines (`Chat.load` serves one at once); off, they are dropped after measuring.
    """

    def __init__(
        self,
        version_dir: str | os.PathLike[str],
        variant: str | None = None,
        cache: PhraseCache | str | os.PathLike[str] | None = None,
        autotune: bool | AutotuneSettings | None = None,
        keep_measured: bool = False,
        **pipeline_kwargs: Any,
    ) -> None:
        # a cycle at the top: runtime.autotune leads back to this module
        from chattts_forge.runtime import autotune as tuning

        self.path = Path(version_dir)
        if not self.path.is_dir():
            raise NotFound(f"version folder {self.path} does not exist")
        if pipeline_kwargs.get("public_key") is not None:  # the version's own files: routing.json, phrase cache
            # signing: only with a public key; 3.6 ms to import
            from chattts_forge.signing import verify_folder

            verify_folder(self.path, pipeline_kwargs["public_key"])
        self.table = load_routing(self.path)
        self.buckets = table_buckets(self.table)
        self.override = variant
        if variant is not None and not (variant_folder(self.path, variant, file="--variant", field="variant")
                                        / ARTIFACT_JSON).is_file():
            published = sorted(p.name for p in self.path.iterdir() if (p / ARTIFACT_JSON).is_file())
            raise ForgeError(f"variant {variant!r} is not published in {self.path} (published: {', '.join(published)})")
        self.pipeline_kwargs = pipeline_kwargs
        steps = None
        self._settings: AutotuneSettings | None = None
        self._tune_lock = threading.Lock()
        if autotune is None:
            autotune = tuning.autotune_default()
        if variant is not None:
            self.autotune = tuning.build_choice(self.table, f"every text goes to --variant {variant}")
        elif autotune is False:
            self.autotune = tuning.build_choice(self.table, "autotune off")
        else:
            settings = autotune if isinstance(autotune, tuning.AutotuneSettings) else tuning.AutotuneSettings()
            self._settings = settings
            steps = self._runtime_steps()
            self.autotune = tuning.choose_routes(self.path, self.table, settings, steps=steps,
                                                 **self._tuning_kwargs())
        self.routes = {name: b["variant"] for name, b in self.autotune["buckets"].items()}
        # keep_measured: the artifacts autotune opened for the variants served here become their
        # Pipelines' (sessions opened once); else they go now and a variant opens on its first text.
        self._measured: dict[str, Any] = {}
        if steps is not None:
            if keep_measured:
                opened = {v: steps.opened_artifact(self.path / v) for v in self.variants_in_use()}
                self._measured = {v: a for v, a in opened.items() if a is not None}
            steps.close()
        where = f" ({self.autotune['source']}{': ' + self.autotune['cache_file'] if self.autotune.get('cache_file') else ''})"
        for line in tuning.describe(self.autotune):
            log.info("router%s: %s", where, line)
        self.cache = cache if cache is None or isinstance(cache, PhraseCache) else PhraseCache(cache)
        self._cached_variants: set[str] = set()
        if self.cache is not None:
            served = self.variants_in_use()
            covered = set(self.cache.artifacts.values())
            self._cached_variants = {v for v in served if payload_sha256(self.path / v) in covered}
            built_for = {b["variant"] for b in self.table["buckets"]} if self.override is None else served
            if not self._cached_variants and not {v for v in built_for if payload_sha256(self.path / v) in covered}:
                self.cache.check_artifact(payload_sha256(self.path / sorted(served)[0]), self.path)
            moved = sorted(v for v in built_for - served if payload_sha256(self.path / v) in covered)
            if moved:  # warmed for the build's routing; this host routes those buckets elsewhere
                log.warning("router: the phrase cache was built for %s, which this host's autotune does not "
                            "route to: those texts are served uncached (warm on this host, or --no-autotune)",
                            ", ".join(moved))
        self._pipes: dict[str, Pipeline] = {}
        self._front: TextFront | None = None

    # ---- the host's measurement, when it was deferred -------------------------------------------

    def _tuning_kwargs(self) -> dict[str, Any]:
        kw = self.pipeline_kwargs
        return {"provider": kw.get("provider", "cpu"), "threads": kw.get("threads"), "engine": kw.get("engine", "auto")}

    def _runtime_steps(self) -> Any:
        # a cycle at the top: runtime.autotune leads back to this module
        from chattts_forge.runtime.autotune import RuntimeSteps

        kw = self.pipeline_kwargs
        return RuntimeSteps(**self._tuning_kwargs(), verify=kw.get("verify", "sha256"), public_key=kw.get("public_key"))

    @property
    def tune_pending(self) -> bool:
        """True while the routes are the build's because this host's measurement was deferred (a cold
        autotune cache: `AutotuneSettings.cold_cache` "defer"); `tune_deferred` runs it."""
        return bool(self.autotune.get("pending"))

    def measure_deferred(self) -> dict[str, Any] | None:
        """This host's measurement that the first load deferred (every passing variant of each ranked
        bucket opened, timed and dropped; the record cached as a measuring load would), not yet applied:
        `apply_routes(record)` does. None when nothing is pending (or another call is measuring)."""
        # a cycle at the top: runtime.autotune leads back to this module
        from chattts_forge.runtime import autotune as tuning

        if not self.tune_pending or self._settings is None or not self._tune_lock.acquire(blocking=False):
            return None
        try:
            if not self.tune_pending:
                return None
            log.info("router: measuring this host's routes for %s (deferred from the first load)", self.path)
            settings = replace(self._settings, cold_cache="measure")
            record = tuning.choose_routes(self.path, self.table, settings, **self._tuning_kwargs())
            record["deferred"] = True
            return record
        finally:
            self._tune_lock.release()

    def apply_routes(self, record: dict[str, Any]) -> None:
        """Route by `record` (a measurement's) from now on; logs one line per bucket."""
        # a cycle at the top: runtime.autotune leads back to this module
        from chattts_forge.runtime import autotune as tuning

        routes = {name: b["variant"] for name, b in record["buckets"].items()}
        if self.cache is not None:
            covered = set(self.cache.artifacts.values())
            self._cached_variants |= {v for v in routes.values() if payload_sha256(self.path / v) in covered}
        self.autotune, self.routes = record, routes  # two assignments: a reader sees either whole dict
        where = f" ({record['source']}{': ' + record['cache_file'] if record.get('cache_file') else ''})"
        for line in tuning.describe(record):
            log.info("router%s: %s", where, line)

    def tune_deferred(self) -> dict[str, Any]:
        """Measure and apply what the first load deferred (`measure_deferred`, `apply_routes`); returns
        the record now routed by (unchanged when nothing was pending)."""
        record = self.measure_deferred()
        if record is not None:
            self.apply_routes(record)
        return self.autotune

    def build_route(self, normalised: str) -> str:
        """The variant the build's routing table sends a normalised text to (before this host's autotune)."""
        bucket = bucket_of(text_length(normalised), self.buckets)
        return next(str(b["variant"]) for b in self.table["buckets"] if b["name"] == bucket.name)

    def variants_in_use(self) -> set[str]:
        return {self.override} if self.override else set(self.routes.values())

    def pipeline(self, variant: str) -> Pipeline:
        """The variant's Pipeline, opened on first use."""
        if variant not in self._pipes:
            cache = self.cache if variant in self._cached_variants else None
            measured = self._measured.pop(variant, None)
            if measured is not None:
                log.info("router: serving variant %s with the sessions autotune opened (%s)", variant, measured.path)
                self._pipes[variant] = Pipeline.from_artifact(measured, self.pipeline_kwargs.get("engine", "auto"),
                                                              cache=cache)
            else:
                log.info("router: opening variant %s (%s)", variant, self.path / variant)
                self._pipes[variant] = Pipeline(self.path / variant, cache=cache, **self.pipeline_kwargs)
        return self._pipes[variant]

    def opened(self) -> dict[str, Pipeline]:
        """The variants whose Pipelines are open (their files checked), by name."""
        return dict(self._pipes)

    @property
    def front_variant(self) -> str:
        """The variant whose support files normalise and measure texts (every variant of a version
        shares them): one this router serves, so the front end reads nothing it would not read anyway."""
        return self.override or sorted(self.variants_in_use())[0]

    @property
    def front(self) -> TextFront:
        """The text front end that measures lengths: no model session, no graph hashed (runtime.textfront).
        With a public key it is the front variant's Pipeline's, whose signature is checked first."""
        if self._front is None:
            variant = self.front_variant
            if variant in self._pipes or self.pipeline_kwargs.get("public_key") is not None:
                self._front = self.pipeline(variant).text
            else:
                self._front = TextFront.open(self.path / variant, self.pipeline_kwargs.get("verify", "sha256"))
        return self._front

    def route(self, text: str, params: SynthParams | None = None) -> tuple[str, Bucket, int]:
        """(variant, bucket, length) for one input text."""
        length = text_length(self.front.normalize(text, params or SynthParams()))
        bucket = bucket_of(length, self.buckets)
        return self.override or self.routes[bucket.name], bucket, length

    def synthesize(self, texts: str | Sequence[str], params: SynthParams | None = None,
                   whole: bool = False) -> list[Result]:
        """One Result per text, in order; texts of the same variant are synthesized together
        (`whole`: as `Pipeline.synthesize`)."""
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        if not items:
            raise ForgeError("no text to synthesize")
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(items):
            variant, bucket, length = self.route(t, params)
            log.info("router: text %d (%d chars, bucket %s) -> %s", i, length, bucket.name, variant)
            groups.setdefault(variant, []).append(i)
        results: list[Result | None] = [None] * len(items)
        for variant, idx in groups.items():
            for i, r in zip(idx, self.pipeline(variant).synthesize([items[i] for i in idx], params, whole),
                                 strict=True):
                results[i] = r
        return [r for r in results if r is not None]
