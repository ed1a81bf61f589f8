"""A published version's own files: `routing.json`, the warm phrase cache and the version manifest.

After the variants of one version are published, the build writes beside them::

    artifacts/<model>/<version>/
      routing.json        per length bucket, the fastest variant that passes the gate in it (runtime.router)
      phrase_cache.bin    the warm phrase cache of the shipped phrase list (runtime.phrase_cache), optional
      report.html         the version page: every variant built, published or refused, by eye and by ear
                          (evaluate.version_page; self-contained), optional
      manifest.json       this version's manifest (schema chattts-forge/version-manifest/1)
      model.sig           the OpenSSF Model Signing signature of the files above (not of the variant
                          folders, which it records as ignored: each has its own model.sig)
      <variant>/...       the published variants (their own manifests and signatures)

`routing_table(version_dir)` is a pure function of the published variants (their reports' ``buckets``
sections, manifests and payloads): the same reports give the same bytes (sorted keys, no wall clock).
For each bucket it records the variants whose bucket verdict passed (`passing`) and their order by
the bucket's median RTF on the build machine (`build_ranking`, ties by name), and routes to the
first of them (`variant`; FP32 when none passed or the reports hold no per-bucket results), unless
its per-sentence seconds over FP32's in its report are not below 1 beyond the noise: then FP32, the
simpler one, and the reason says so. The runtime ranks `passing` again on the host that serves
(runtime.autotune).

The version manifest (`manifest.json` in the version folder; keys sorted)::

    {"schema": "chattts-forge/version-manifest/1", "model", "version",
     "variants": {variant: manifest sha256}, "routing": {bucket: variant},
     "phrase_cache": {"file", "phrases", "variants": {variant: payload sha256}, "knobs", "phrase_list"} | null,
     "files": [{"path", "bytes", "sha256"}]}

`verify` (publish.verify) checks every listed file (size, sha256), refuses unlisted files in the
version folder, re-checks routing.json against the published variants (a routed variant that is not
published, or whose payload changed, is named), opens the phrase cache (its own sha256 trailer;
built for published variants of this version only) and reads the version page's data block (it must
show every published variant with the report it was published with: evaluate.version_page). Writes go through temp + rename, the data files
first and the manifest last, all under the publish lock; a kill in between leaves a version that
fails `verify` until the next build rewrites it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from chattts_forge.errors import BadInput, ForgeError, IntegrityError, NotFound
from chattts_forge.evaluate.report_record import ReportRecord, check_report, section_builtins
from chattts_forge.evaluate.version_page import PAGE_NAME, page_problems
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import SIGNATURE_NAME, sha256_file
from chattts_forge.log import get_logger
from chattts_forge.publish.index import iter_variant_dirs, publish_lock, rewrite_index
from chattts_forge.publish.manifest import (
    MANIFEST_NAME,
    REPORT_COPY_NAME,
    FileEntry,
    check_file_entries,
    manifest_file_problems,
    read_json_document,
)
from chattts_forge.runtime.interleave import median_interval
from chattts_forge.runtime.phrase_cache import PhraseCache, payload_sha256
from chattts_forge.runtime.router import (
    DEFAULT_BUCKETS,
    FALLBACK_VARIANT,
    LENGTH_DEFINITION,
    ROUTING_NAME,
    ROUTING_SCHEMA,
    routing_bytes,
    routing_problems,
)
from chattts_forge.signing import SigningKey, resolve_signing_key, sign_folder, verify_folder

log = get_logger(__name__)

VERSION_MANIFEST_SCHEMA = "chattts-forge/version-manifest/1"
PHRASE_CACHE_NAME = "phrase_cache.bin"
# Figures routing.json quotes per bucket and variant (from the report's buckets section).
ROUTING_FIGURES = ("rtf_p50", "rtf_ratio_vs_reference", "code_agreement", "code_agreement_stream", "hidden_cosine",
                   "mel_snr_db", "wer", "cer")


def published_variants(version_dir: Path) -> dict[str, Path]:
    """{variant: folder} of the variants published in a version folder."""
    return {p.name: p for p in sorted(version_dir.iterdir()) if p.is_dir() and (p / MANIFEST_NAME).is_file()
            and not p.name.startswith(".")}


def _read_json(path: Path) -> Any:
    return read_json_document(path)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _bucket_seconds(report: ReportRecord, bucket: str) -> tuple[list[float | None], list[float | None]]:
    """(the variant's per-sentence seconds, FP32's) in its report's latency of `bucket` (empty: not timed)."""
    res = report.buckets.result_map().get(bucket)
    latency = res.latency if res else None
    if not latency:
        return [], []
    return ([_finite(u.seconds) for u in latency.artifact.utterances],
            [_finite(u.seconds) for u in latency.reference.utterances])


def _simpler_inside_the_noise(choice: str, reason: str, passing: list[str], mine: list[float | None],
                              fp32: list[float | None]) -> tuple[str, str]:
    """FP32 instead of the fastest quantized variant when its per-sentence seconds over FP32's (`mine`,
    `fp32`: the same sentences, seeds and speakers in its report's bucket latency) do not lie below 1
    with ~90% confidence (runtime.interleave.median_interval): inside the noise the simpler variant routes."""
    if choice == FALLBACK_VARIANT or FALLBACK_VARIANT not in passing:
        return choice, reason
    ratios = [a / r for a, r in zip(mine, fp32, strict=False) if _finite(a) and _finite(r) and r > 0]
    if not ratios or len(mine) != len(fp32):
        return choice, reason  # no paired timings recorded: the median RTF decides alone
    median, low, high = median_interval(ratios)
    if high < 1.0:
        return choice, f"{reason}; {median:.3f}x of fp32 per sentence (90% interval {low:.3f}-{high:.3f})"
    return FALLBACK_VARIANT, (f"{choice} has the lowest median RTF, but its per-sentence seconds over fp32's "
                              f"({median:.3f}x, 90% interval {low:.3f}-{high:.3f}, {len(ratios)} sentences) are "
                              "inside the noise: the simpler fp32")


def routing_table(version_dir: Path) -> dict[str, Any]:
    """The routing table of a published version (see module docstring)."""
    variants = published_variants(version_dir)
    if FALLBACK_VARIANT not in variants:
        raise BadInput(f"{version_dir}: no {FALLBACK_VARIANT} variant published; routing needs it as the fallback")
    reports = {v: check_report(_read_json(d / REPORT_COPY_NAME)) for v, d in variants.items()}
    definitions = {v: json.dumps(None if r.buckets.definition is UNSET else msgspec.to_builtins(r.buckets.definition),
                                 sort_keys=True)
                   for v, r in reports.items() if r.buckets.results}
    if len(set(definitions.values())) > 1:
        raise BadInput(f"{version_dir}: the variants' reports use different length buckets "
                         f"({', '.join(sorted(definitions))}); evaluate them with the same gate")
    if definitions:
        first = next(iter(definitions))
        defined = reports[first].buckets.definition
        bucket_defs = [] if defined is UNSET else [msgspec.to_builtins(b) for b in defined]
    else:
        bucket_defs = [b.to_dict() for b in DEFAULT_BUCKETS]
    buckets = []
    for b in bucket_defs:
        figures: dict[str, Any] = {}
        for v, report in reports.items():
            res = report.buckets.result_map().get(b["name"])
            if not res:
                figures[v] = {"passed": None, "sentences": 0, "note": "no per-bucket evaluation in its report"}
                continue
            figures[v] = {"passed": res.passed, "sentences": len(res.sentences),
                          **{k: _finite(res.metrics.get(k)) for k in ROUTING_FIGURES}}
        passing = [v for v, f in figures.items() if f["passed"] is True]
        if passing:
            choice = min(passing, key=lambda v: (figures[v]["rtf_p50"] if figures[v]["rtf_p50"] is not None else math.inf, v))
            rtf = figures[choice]["rtf_p50"]
            reason = (f"fastest of the variants that pass the gate in this bucket ({', '.join(sorted(passing))}): "
                      f"median RTF {rtf:.4g}" if rtf is not None else "passes the gate in this bucket")
            choice, reason = _simpler_inside_the_noise(choice, reason, passing,
                                                       *_bucket_seconds(reports[choice], b["name"]))
        else:
            choice = FALLBACK_VARIANT
            reason = "no variant was judged in this bucket: the fallback" if not any(
                f["passed"] is not None for f in figures.values()) else "no variant passes in this bucket: the fallback"
        # The passing set is quality (hardware-independent); the ranking is the build machine's speed:
        # the runtime ranks the set again on the host (runtime.autotune), `variant` is the build's pick.
        ranking = sorted(passing, key=lambda v: (figures[v]["rtf_p50"] if figures[v]["rtf_p50"] is not None else math.inf, v))
        buckets.append({**{k: b[k] for k in ("name", "min_chars", "max_chars")}, "variant": choice, "reason": reason,
                        "figures": figures, "passing": sorted(passing), "build_ranking": ranking})
    return {
        "schema": ROUTING_SCHEMA,
        "model": version_dir.parent.name,
        "version": version_dir.name,
        "length": LENGTH_DEFINITION,
        "fallback": FALLBACK_VARIANT,
        "buckets": buckets,
        "variants": {v: {"manifest_sha256": sha256_file(d / MANIFEST_NAME), "payload_sha256": payload_sha256(d),
                         "report_sha256": sha256_file(d / REPORT_COPY_NAME),
                         "evaluated_at": reports[v].created_at,
                         **({"memory": mem} if (mem := memory_figures(reports[v])) else {})}
                     for v, d in variants.items()},
    }


# What routing.json records of each variant's memory (serve --memory-limit reads it: serve.guard).
MEMORY_KEYS = ("peak_rss_mb_by_batch", "after_load_mb", "python_baseline_mb", "steps", "threads", "provider", "command")


def memory_figures(report: ReportRecord) -> dict[str, Any] | None:
    """A variant's memory as its report measured it (the ``memory`` section, each variant in a process of
    its own, since issue 50): peak RSS per batch size (MiB), resident size after load, the runtime's own
    start (python_baseline_mb), the workload and the command; None for a report without one."""
    # the probe's record (runtime.memory_probe's layout), read as its map
    art = section_builtins(report.memory.artifact) if report.memory else {}
    by_batch = art.get("peak_rss_mb_by_batch") or {}
    if not by_batch or any(_finite(v) is None for v in by_batch.values()):
        return None
    return {k: art.get(k) for k in MEMORY_KEYS}


def _entry(path: Path) -> FileEntry:
    return FileEntry(path.name, path.stat().st_size, sha256_file(path))


def version_manifest(version_dir: Path, table: dict[str, Any] | None, cache: dict[str, Any] | None,
                     page: bool = False) -> dict[str, Any]:
    """`table` None: a version without FP32 (a build that re-published only some variants), so no routing."""
    files = [_entry(version_dir / ROUTING_NAME)] if table is not None else []
    if cache is not None:
        files.append(_entry(version_dir / PHRASE_CACHE_NAME))
    if page:
        files.append(_entry(version_dir / PAGE_NAME))
    return {
        "schema": VERSION_MANIFEST_SCHEMA,
        "model": version_dir.parent.name,
        "version": version_dir.name,
        "variants": ({v: rec["manifest_sha256"] for v, rec in table["variants"].items()} if table is not None else
                     {v: sha256_file(d / MANIFEST_NAME) for v, d in published_variants(version_dir).items()}),
        "routing": {b["name"]: b["variant"] for b in table["buckets"]} if table is not None else {},
        "phrase_cache": cache,
        "files": [f.to_dict() for f in sorted(files, key=lambda f: f.path)],
    }


def version_manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    atomic_write_bytes(path, data)
    return True


def cache_record(cache_file: Path, version_dir: Path, phrase_list: dict[str, Any] | None) -> dict[str, Any]:
    """What the version manifest says about a phrase cache; ForgeError unless it was built for
    published variants of this version."""
    cache = PhraseCache(cache_file)
    try:
        published = {v: payload_sha256(d) for v, d in published_variants(version_dir).items()}
        for variant, payload in sorted(cache.artifacts.items()):
            if published.get(variant) != payload:
                raise IntegrityError(f"phrase cache {cache_file} was built for variant {variant!r} (payload {payload[:12]}), "
                                 f"which is not published in {version_dir}")
        return {"file": PHRASE_CACHE_NAME, "phrases": len(cache), "variants": dict(sorted(cache.artifacts.items())),
                "knobs": cache.knobs, "phrase_list": phrase_list}
    finally:
        cache.close()


def version_signature_ignores(version_dir: Path) -> list[str]:
    """What a version folder's signature leaves out: its variant folders (each signed on its own)."""
    return sorted(p.name for p in version_dir.iterdir() if p.is_dir())


def sign_version_folder(version_dir: Path, key: SigningKey) -> Path:
    """Sign a version folder's own files (routing.json, phrase cache, version manifest): model.sig
    over every file in it but its variant folders, which the signature records as ignored."""
    signature = sign_folder(version_dir, key, ignore=version_signature_ignores(version_dir))
    log.info("signed %s", signature)
    return signature


def _signature_current(version_dir: Path, public_key: Path) -> bool:
    try:
        verify_folder(version_dir, public_key)
    except ForgeError:
        return False
    return True


def publish_version_files(
    version_dir: str | Path,
    cache_file: str | Path | None = None,
    phrase_list: dict[str, Any] | None = None,
    page: bytes | None = None,
    sign_key: str | Path | None = None,
    sign: bool = True,
) -> dict[str, Any]:
    """Write routing.json (and the phrase cache and the version page `page` (report.html), when given)
    and the version manifest of a published version, under the publish lock; files already holding
    these bytes are left alone, a cache or page no longer given is removed. Then sign the version
    folder (`sign_key`, a PEM private key, or the user's own key pair) unless its signature already
    holds for these files and this key (so a rebuild that ends with the same bytes keeps its
    model.sig). `sign=False`: an intermediate state (the build writes routing.json, warms the phrase
    cache through it, then calls again with the cache), left unsigned. Returns the version manifest."""
    from chattts_forge.publish.publish import record_public_key

    version_dir = Path(version_dir).resolve()
    root = version_dir.parent.parent
    if not version_dir.is_dir():
        raise NotFound(f"version folder {version_dir} does not exist")
    key = resolve_signing_key(sign_key)
    with publish_lock(root):
        public_key = record_public_key(root, key)
        table = routing_table(version_dir) if FALLBACK_VARIANT in published_variants(version_dir) else None
        if table is not None:
            changed = _write_if_changed(version_dir / ROUTING_NAME, routing_bytes(table))
        else:  # nothing to route to without the fallback: the version page and manifest only
            changed = (version_dir / ROUTING_NAME).exists()
            (version_dir / ROUTING_NAME).unlink(missing_ok=True)
        cache = None
        if cache_file is not None:
            cache = cache_record(Path(cache_file), version_dir, phrase_list)
            changed |= _write_if_changed(version_dir / PHRASE_CACHE_NAME, Path(cache_file).read_bytes())
        elif (version_dir / PHRASE_CACHE_NAME).exists():
            (version_dir / PHRASE_CACHE_NAME).unlink()  # a cache no longer built is no longer listed
            changed = True
        if page is not None:
            changed |= _write_if_changed(version_dir / PAGE_NAME, page)
        elif (version_dir / PAGE_NAME).exists():
            (version_dir / PAGE_NAME).unlink()
            changed = True
        manifest = version_manifest(version_dir, table, cache, page=page is not None)
        changed |= _write_if_changed(version_dir / MANIFEST_NAME, version_manifest_bytes(manifest))
        if sign and not _signature_current(version_dir, public_key):
            sign_version_folder(version_dir, key)
        rewrite_index(root)
    routes = ", ".join(f"{b['name']} -> {b['variant']}" for b in table["buckets"]) if table else "no routing"
    log.info("%s %s (%s)%s", "wrote" if changed else "up to date:", version_dir / ROUTING_NAME, routes,
             f"; phrase cache {version_dir / PHRASE_CACHE_NAME} ({cache['phrases']} phrases)" if cache else "")
    return manifest


def is_version_manifest(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("schema") == VERSION_MANIFEST_SCHEMA
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, AttributeError):
        return False


def load_version_manifest(path: Path) -> dict[str, Any]:
    """A version folder's manifest.json, validated by type before use (one-line ForgeError)."""
    manifest = read_json_document(path, "version manifest")
    if not isinstance(manifest, dict) or manifest.get("schema") != VERSION_MANIFEST_SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else None
        raise BadInput(f"{path}: schema {str(got)[:80]!r} is not {VERSION_MANIFEST_SCHEMA!r}")
    check_file_entries(manifest.get("files"), path)
    for key in ("model", "version"):
        if not isinstance(manifest.get(key), str):
            raise BadInput(f"{path}: '{key}' must be a string")
    for key in ("variants", "routing"):
        value = manifest.get(key)
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise BadInput(f"{path}: '{key}' must be an object of strings")
    cache = manifest.get("phrase_cache")
    if cache is not None and not (isinstance(cache, dict) and isinstance(cache.get("file"), str)
                                  and isinstance(cache.get("phrases"), int) and isinstance(cache.get("variants"), dict)):
        raise BadInput(f"{path}: 'phrase_cache' must be null or an object with file, phrases and variants")
    return manifest


def verify_version(version_dir: Path) -> list[str]:
    """Problems of a version folder's own files, each naming the file."""
    path = version_dir / MANIFEST_NAME
    try:
        manifest = load_version_manifest(path)
    except ForgeError as e:
        return [str(e)]
    listed = {f["path"]: FileEntry(f["path"], int(f["bytes"]), f["sha256"]) for f in manifest["files"]}
    problems = []
    if (manifest.get("model"), manifest.get("version")) != (version_dir.parent.name, version_dir.name):
        problems.append(f"{path}: names {manifest.get('model')}/{manifest.get('version')}, not this folder")
    present = {p.name for p in version_dir.iterdir() if p.is_file()}
    problems += manifest_file_problems(version_dir, listed, present, {MANIFEST_NAME, SIGNATURE_NAME})
    published = published_variants(version_dir)
    for variant, sha in sorted(manifest["variants"].items()):
        if variant not in published:
            problems.append(f"{path}: lists variant {variant!r}, which is not published in {version_dir}")
        elif sha256_file(published[variant] / MANIFEST_NAME) != sha:
            problems.append(f"{path}: variant {variant!r} has another manifest than the one routing was made from")
    if ROUTING_NAME in listed and ROUTING_NAME in present:
        try:
            problems += routing_problems(read_json_document(version_dir / ROUTING_NAME, "routing table"), version_dir)
        except ForgeError as e:
            problems.append(str(e))
    if PAGE_NAME in listed and PAGE_NAME in present:
        integrity, regressions = {}, {}
        for variant, vdir in published.items():
            try:
                integrity[variant] = _read_json(vdir / REPORT_COPY_NAME).get("integrity")
                record = _read_json(vdir / MANIFEST_NAME).get("regression")
                regressions[variant] = record if isinstance(record, dict) else None
            except ForgeError as e:
                problems.append(str(e))
        problems += page_problems(version_dir / PAGE_NAME, version_dir.parent.name, version_dir.name, integrity,
                                  regressions)
    if PHRASE_CACHE_NAME in listed and PHRASE_CACHE_NAME in present:
        try:
            cache_record(version_dir / PHRASE_CACHE_NAME, version_dir, None)
        except ForgeError as e:
            problems.append(str(e))
    return problems


def version_index_entries(root: Path) -> list[dict[str, Any]]:
    """index.json's `versions` entries: every version folder with a version manifest."""
    seen: list[Path] = []
    for vdir in iter_variant_dirs(root):
        version_dir = vdir.parent
        if version_dir not in seen and is_version_manifest(version_dir / MANIFEST_NAME):
            seen.append(version_dir)
    out = []
    for version_dir in seen:
        manifest = load_version_manifest(version_dir / MANIFEST_NAME)
        cache = manifest.get("phrase_cache")
        out.append({
            "model": manifest["model"], "version": manifest["version"],
            "path": version_dir.relative_to(root).as_posix(),
            "manifest_sha256": sha256_file(version_dir / MANIFEST_NAME),
            "routing": manifest["routing"],
            "phrase_cache": None if cache is None else {"file": cache["file"], "phrases": cache["phrases"],
                                                        "variants": sorted(cache["variants"])},
        })
    return out
