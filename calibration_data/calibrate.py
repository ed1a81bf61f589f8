"""`calibrate`: run an FP32 artifact over a text corpus, streaming what quantize needs into statistics.

    from chattts_forge.calibration_data.calibrate import calibrate
    calibrate("artifacts/fp32", "builtin:calibration", "build/calib")          # 512 sentences
    calibrate("artifacts/fp32", "builtin:calibration", "build/calib2", max_samples="all",
              merge=["build/calib"])                                           # the rest, merged in

What is recorded (with the torch-free runtime, `chattts_forge.runtime.Pipeline`, whose session runs
`recorder.instrument` observes through the runtime's public observer hook):

- `gpt`: the prefill of every sentence plus `decode_positions` decode steps per sentence (drawn with
  the seed); each is run at once through observer sessions of gpt.onnx and the fused gpt_fast.onnx
  (`observe.Observer`) and folded into `statistics.Statistics` (ranges, |x| histograms, per-channel
  importance of every projection MatMul input; the KV cache's per-channel max |x|);
- `head_code`: the hidden state of up to `head_steps` steps per sentence (statistics likewise);
- `decoder`, `dvae`: the GPT hidden states and the codes of each sentence (raw sample only).

Only a seeded sample of the raw inputs is kept (`store.RawSample`: at most `RAW_SAMPLE_COUNTS` per
component, within the disk budget, and only steps whose past is at most `max_past`). Memory: the
statistics (fixed by the graphs), one sentence's synthesis and the raw sample's keys; disk: the
statistics plus the raw sample. Neither grows with the corpus.

Sentences: `select_sentences` draws `max_samples` (default 512; "all" for every usable one) stratified
by corpus file (every file represented). Lines the runtime's front end refuses are skipped and
counted before any synthesis. A sentence's speaker, code sampling and recorded steps depend on the
seed and its text only, so a run is deterministic, and `merge` of earlier runs (their sentences are
not synthesized again) gives the statistics and raw sample of one run over all their sentences.
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from chattts_forge.artifact import FAST_GPT, ArtifactMeta
from chattts_forge.calibration_data.corpus import Corpus, is_builtin_spec, load_corpus
from chattts_forge.calibration_data.observe import Observer, fused_feed
from chattts_forge.calibration_data.recorder import check_recorded, instrument, new_pipeline, synth_params
from chattts_forge.calibration_data.statistics import STATS_FILE, Statistics, sample_key
from chattts_forge.calibration_data.store import (
    MANIFEST,
    SCHEMA,
    CalibrationStore,
    RawSample,
    RawSampleBounds,
)
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_output_dir, atomic_write_json, sha256_file
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

log = get_logger(__name__)

DEFAULT_MAX_SAMPLES = 512  # the seed note's "500 business sentences"
COMPONENTS = ("gpt", "head_code", "decoder", "dvae")
# The raw sample: enough for GPTQ (MAX_GPTQ_SAMPLES 32 per graph), auto's sensitivity (8) and the fused
# graph's parity check (8), with room to spare; its byte share of the disk budget per component.
RAW_SAMPLE_COUNTS = {"gpt": 64, "head_code": 64, "decoder": 16, "dvae": 16}
RAW_SAMPLE_SHARES = {"gpt": 0.80, "head_code": 0.05, "decoder": 0.10, "dvae": 0.05}
# Disk kept free of raw samples for statistics.npz and the manifest (a few MB at full size).
STATISTICS_RESERVE_BYTES = 32 << 20
# Settings that shape the statistics: runs merge only when they agree on all of them.
MERGE_SETTINGS = ("max_new_token", "decode_positions_per_sentence", "head_steps_per_sentence")


def sentence_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _artifact_identity(artifact_dir: Path, meta: ArtifactMeta) -> dict[str, Any]:
    gpt_file = meta.component_path(artifact_dir, "gpt")
    return {
        "path": str(artifact_dir.resolve()),
        "variant": meta.variant,
        "gpt_sha256": meta.component("gpt").get("sha256") or (sha256_file(gpt_file) if gpt_file.is_file() else None),
        "source": meta.source,
    }


def _file_stems(corp: Corpus) -> list[str]:
    """The corpus file of each sentence (its stem; the corpus name when origins are unknown)."""
    if len(corp.origins) == len(corp.sentences) and corp.files:
        return [corp.files[i].stem for i in corp.origins]
    return [corp.name] * len(corp.sentences)


def select_sentences(stems: Sequence[str], count: int | None, seed: int) -> list[int]:
    """Indices of `count` sentences (all when None) stratified by file: each file gets its share by
    largest remainder, at least one while `count` allows, the sentences within a file a seeded draw.
    Returned in corpus order."""
    by_file: dict[str, list[int]] = {}
    for i, stem in enumerate(stems):
        by_file.setdefault(stem, []).append(i)
    total = len(stems)
    if count is None or count >= total:
        return list(range(total))
    files = sorted(by_file)
    quota = dict.fromkeys(files, 0)
    if count >= len(files):  # one each first, then the rest by share
        for f in files:
            quota[f] = 1
    rest = count - sum(quota.values())
    exact = {f: (len(by_file[f]) - quota[f]) * rest / max(total - sum(quota.values()), 1) for f in files}
    for f in files:
        quota[f] += math.floor(exact[f])
    by_remainder = sorted(files, key=lambda f: (-(exact[f] - math.floor(exact[f])), f))
    for f in by_remainder[: count - sum(quota.values())]:
        quota[f] += 1
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for f in files:
        members = by_file[f]
        chosen.extend(members[j] for j in rng.permutation(len(members))[: min(quota[f], len(members))])
    return sorted(chosen)


def _languages(sentences: Sequence[str]) -> dict[str, int]:
    from chattts_forge.runtime.frontend import Normalizer

    counts: dict[str, int] = {}
    for s in sentences:
        lang = Normalizer.detect_language(s)
        counts[lang] = counts.get(lang, 0) + 1
    return counts


def _sentence_seed(seed: int, sha: str) -> int:
    """The speaker/sampling seed of one sentence: depends on the run seed and the text only."""
    return (seed + int(sha[:8], 16)) % (2**31 - 1)


def _check_merge(paths: Sequence[Path], identity: dict[str, Any], corp: Corpus, seed: int,
                 settings: dict[str, Any]) -> list[CalibrationStore]:
    stores = []
    files = {Path(f).name: sha256_file(f) for f in corp.files}
    for p in paths:
        store = CalibrationStore(p)
        m = store.manifest
        if (m.get("artifact") or {}).get("gpt_sha256") != identity["gpt_sha256"]:
            raise ForgeError(f"--merge {p}: its statistics were recorded from another artifact (gpt sha256 differs)")
        if m.get("seed") != seed:
            raise ForgeError(f"--merge {p}: recorded with seed {m.get('seed')}, this run uses {seed}")
        theirs = m.get("settings") or {}
        for k in MERGE_SETTINGS:
            if theirs.get(k) != settings[k]:
                raise ForgeError(f"--merge {p}: recorded with {k}={theirs.get(k)}, this run uses {settings[k]}")
        # Built-in corpora are versioned: statistics of two versions (or of edited files) do not mix.
        theirs_corpus = m.get("corpus") or {}
        their_name = str(theirs_corpus.get("name", ""))
        if is_builtin_spec(their_name) and is_builtin_spec(corp.name):
            version, their_version = corp.name.partition(":")[0], their_name.partition(":")[0]
            if version != their_version:
                raise ForgeError(f"--merge {p}: recorded from corpus version {their_version}, this run reads {version}")
            for name, sha in (theirs_corpus.get("file_sha256") or {}).items():
                if name in files and files[name] != sha:
                    raise ForgeError(f"--merge {p}: recorded from another version of corpus file {name} "
                                     "(sha256 differs)")
        stores.append(store)
    return stores


def _check_settings(max_new_token: int, decode_positions: int, max_past: int, head_steps: int,
                    disk_budget_mb: float) -> None:
    if max_new_token < 2:
        raise ForgeError(f"--max-new-token must be >= 2, got {max_new_token}")
    if decode_positions < 0 or max_past < 1 or head_steps < 0:
        raise ForgeError("decode positions and head steps must be >= 0 and max past >= 1")
    if disk_budget_mb <= 0:
        raise ForgeError(f"--disk-budget-mb must be > 0, got {disk_budget_mb}")


def parse_max_samples(value: int | str | None) -> int | None:
    """`--max-samples`: a count >= 1, or "all" (None: every usable sentence)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ForgeError(f"--max-samples must be a count or 'all', got {value!r}") from None
    if n < 1:
        raise ForgeError(f"--max-samples must be >= 1, got {n}")
    return n


def calibrate(
    artifact_dir: str | os.PathLike[str],
    corpus: str | os.PathLike[str] | Corpus,
    out_dir: str | os.PathLike[str],
    max_samples: int | str | None = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
    max_new_token: int = 96,
    decode_positions: int = 6,
    max_past: int = 192,
    head_steps: int = 16,
    disk_budget_mb: float = 512.0,
    threads: int | None = None,
    progress: bool | None = None,
    merge: Sequence[str | os.PathLike[str]] = (),
    allow_one_language: bool = False,
    raw_sample_counts: dict[str, int] | None = None,
) -> Path:
    """Stream calibration statistics (and a bounded raw sample) into `out_dir` (written atomically).
    See the module docstring."""
    started = time.perf_counter()
    artifact_dir, out_dir = Path(artifact_dir), Path(out_dir)
    count = parse_max_samples(max_samples)
    _check_settings(max_new_token, decode_positions, max_past, head_steps, disk_budget_mb)
    budget = int(disk_budget_mb * (1 << 20))
    reserve = min(STATISTICS_RESERVE_BYTES, budget // 2)
    corp = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    if not corp.sentences:
        raise ForgeError(f"corpus '{corp.name}' has no sentences")
    languages = _languages(corp.sentences)
    if len(languages) < 2 and not allow_one_language:
        raise ForgeError(f"corpus '{corp.name}' holds only {next(iter(languages))} sentences: static ranges would "
                         "miss the other language (pass --allow-one-language to calibrate on it anyway)")
    settings = {
        "max_samples": count if count is not None else "all",
        "max_new_token": max_new_token,
        "decode_positions_per_sentence": decode_positions,
        "max_past": max_past,
        "head_steps_per_sentence": head_steps,
        "threads": threads,
        "sampling": "ChatTTS InferCodeParams defaults; speaker and code seed from the run seed and the sentence",
        "past_kv_storage": "float16",
    }
    pipe = new_pipeline(artifact_dir, threads)
    meta = pipe.artifact.meta
    if meta.quantization or meta.component("gpt").get("precision", "fp32") != "fp32":
        raise ForgeError(f"{artifact_dir} is not an FP32 artifact; calibrate the FP32 artifact from `convert`")
    identity = _artifact_identity(artifact_dir, meta)
    earlier = _check_merge([Path(p) for p in merge], identity, corp, seed, settings)
    seen = {sha for s in earlier for sha in s.manifest.get("sentence_sha256", [])}

    # Lines the front end refuses, and sentences an earlier (merged) run saw, are set aside first.
    from chattts_forge.runtime.frontend import is_speakable

    stems = _file_stems(corp)
    usable: list[int] = []
    skipped: list[dict[str, str]] = []
    already = 0
    with quiet_logger():
        for i, text in enumerate(corp.sentences):
            if sentence_sha256(text) in seen:
                already += 1
            elif not is_speakable(pipe.normalizer(text)):
                skipped.append({"sentence": text, "file": stems[i], "reason": "normalises to nothing speakable"})
            else:
                usable.append(i)
    if not usable and not earlier:
        raise ForgeError(f"no sentence of corpus '{corp.name}' is speakable ({len(skipped)} refused by the front end)")
    if skipped:
        log.warning("calibrate: %d corpus line(s) the front end refuses are skipped", len(skipped))
    picked = [usable[j] for j in select_sentences([stems[i] for i in usable], count, seed)]

    counts = {**RAW_SAMPLE_COUNTS, **(raw_sample_counts or {})}
    raw_budget = budget - reserve
    bounds = {c: RawSampleBounds(counts[c], int(raw_budget * RAW_SAMPLE_SHARES[c])) for c in COMPONENTS}
    gpt_file = meta.component_file(artifact_dir, "gpt")
    observers = {"gpt": Observer(gpt_file, threads)}
    if meta.has_component(FAST_GPT):
        observers[FAST_GPT] = Observer(meta.component_file(artifact_dir, FAST_GPT), threads)
    if pipe.artifact.has_component("head_code"):
        observers["head_code"] = Observer(meta.component_file(artifact_dir, "head_code"), threads)

    with atomic_output_dir(out_dir) as tmp:
        stats = Statistics()
        for g, obs in observers.items():
            stats.graph_sha256[g] = sha256_file(obs.path)
        raw = {c: RawSample(tmp, c, bounds[c]) for c in COMPONENTS}
        sample_sentence: dict[str, str] = {}
        for store in earlier:  # their statistics and raw samples, as if recorded here
            stats.merge(store.statistics)
            for c in COMPONENTS:
                rec = store.manifest["components"].get(c, {})
                for key, size, rel in zip(rec.get("keys", []), rec.get("sizes", []), rec.get("shards", []), strict=True):
                    raw[c].adopt(key, size, store.path / rel)
                    sample_sentence[f"{c}/{Path(rel).name}"] = store.manifest.get("sample_sentences", {}).get(rel, "")
        counters = {"prefill": 0, "decode": 0, "head": 0, "past_min": None, "past_max": 0}
        state: dict[str, Any] = {"call": 0, "head_call": 0, "positions": set(), "heads": set(), "sha": "", "index": {}}

        def keep_raw(component: str, feeds: Any, condition: bool = True) -> None:
            idx = state["index"].get(component, 0)
            state["index"][component] = idx + 1
            key = sample_key(seed, state["sha"], component, idx)
            sample = {k: np.asarray(v) for k, v in feeds.items()} if condition and raw[component].would_keep(key) else None
            if raw[component].offer(key, sample):
                sample_sentence[f"{component}/sample-{int(key * 2**64):016x}.npz"] = state["sha"]

        def on_run(component: str, feeds: Any, names: list[str], outs: list[Any]) -> None:
            if component == "gpt":
                call = state["call"]
                state["call"] += 1
                if not (call == 0 or call in state["positions"]):
                    return
                past = int(feeds["past_key_values.0.key"].shape[2]) if "past_key_values.0.key" in feeds else 0
                stats.update_graph("gpt", observers["gpt"].run(feeds))
                if FAST_GPT in observers:
                    stats.update_graph(FAST_GPT, observers[FAST_GPT].run(fused_feed(feeds)))
                stats.update_kv(feeds)
                counters["prefill" if call == 0 else "decode"] += 1
                counters["past_min"] = past if counters["past_min"] is None else min(counters["past_min"], past)
                counters["past_max"] = max(counters["past_max"], past)
                keep_raw("gpt", feeds, past <= max_past)
            elif component == "head_code":
                call = state["head_call"]
                state["head_call"] += 1
                if call in state["heads"]:
                    if "head_code" in observers:
                        stats.update_graph("head_code", observers["head_code"].run(feeds))
                    counters["head"] += 1
                    keep_raw("head_code", feeds)
            elif component in ("decoder", "dvae"):
                keep_raw(component, feeds)

        recording = instrument(pipe, on_run, COMPONENTS)
        used: list[int] = []
        bar = tqdm(picked, desc="calibrate", unit="sent", disable=progress is False if progress is not None else None)
        for i in bar:
            text = corp.sentences[i]
            sha = sentence_sha256(text)
            sseed = _sentence_seed(seed, sha)
            srng = np.random.default_rng(sseed)
            steps = np.arange(1, max_new_token)
            state.update(
                call=0, head_call=0, sha=sha, index={},
                positions=set(srng.choice(steps, size=min(decode_positions, len(steps)), replace=False).tolist()),
                heads=set(srng.choice(max_new_token, size=min(head_steps, max_new_token), replace=False).tolist()),
            )
            try:
                with quiet_logger():
                    results = pipe.synthesize(text, synth_params(pipe, sseed, max_new_token))
            except ForgeError as e:  # refused late (e.g. by the tokenizer): skipped and counted
                skipped.append({"sentence": text, "file": stems[i], "reason": str(e)})
                continue
            used.append(i)
            codes = results[0].codes
            if len(codes) and pipe.artifact.has_component("dvae"):
                pipe.decode_mel(codes, use_decoder=False)  # records the DVAE input
            bar.set_postfix(raw_MB=f"{sum(r.bytes for r in raw.values()) / (1 << 20):.0f}")
        bar.close()
        if picked:
            check_recorded(recording, "gpt")
        recording.remove()
        if not used and not earlier:
            raise ForgeError(f"no sentence of corpus '{corp.name}' could be synthesized")
        stats.save(tmp / STATS_FILE)
        stats_bytes = (tmp / STATS_FILE).stat().st_size
        if stats_bytes > reserve:
            log.warning("statistics take %.2f MB, more than the %.2f MB of the disk budget reserved for them",
                        stats_bytes / (1 << 20), reserve / (1 << 20))
        manifest = _manifest(
            identity=identity, corp=corp, seed=seed, settings=settings, stems=stems, picked=picked, used=used,
            skipped=skipped, already=already, earlier=earlier, stats=stats, raw=raw, stats_bytes=stats_bytes,
            budget=budget, reserve=reserve, counters=counters, sample_sentence=sample_sentence, started=started,
        )
        atomic_write_json(tmp / MANIFEST, manifest)
    log.info(
        "calibration statistics written to %s: %d sentences (+%d merged), gpt %d steps (%d prefill, %d decode), "
        "raw sample %.1f MB, statistics %.1f MB, peak RSS %.0f MB, %.0f s",
        out_dir, len(used), len(seen), counters["prefill"] + counters["decode"], counters["prefill"],
        counters["decode"], sum(r.bytes for r in raw.values()) / (1 << 20), stats_bytes / (1 << 20),
        manifest["run"]["peak_rss_bytes"] / (1 << 20), manifest["run"]["seconds"],
    )
    return out_dir


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _manifest(*, identity: dict[str, Any], corp: Corpus, seed: int, settings: dict[str, Any], stems: list[str],
              picked: list[int], used: list[int], skipped: list[dict[str, str]], already: int,
              earlier: list[CalibrationStore], stats: Statistics, raw: dict[str, RawSample], stats_bytes: int,
              budget: int, reserve: int, counters: dict[str, Any], sample_sentence: dict[str, str], started: float,
              ) -> dict[str, Any]:
    per_file: dict[str, dict[str, int]] = {}
    for stem in stems:
        per_file.setdefault(stem, {"available": 0, "used": 0})["available"] += 1
    for i in used:
        per_file[stems[i]]["used"] += 1
    sha_list = [sentence_sha256(corp.sentences[i]) for i in used]
    for store in earlier:  # merged runs: their sentences and per-file counts add up
        sha_list.extend(store.manifest.get("sentence_sha256", []))
        for stem, rec in (store.manifest.get("sentences") or {}).get("per_file", {}).items():
            per_file.setdefault(stem, {"available": rec.get("available", 0), "used": 0})["used"] += rec.get("used", 0)
    describe = corp.describe()
    describe["file_sha256"] = {Path(f).name: sha256_file(f) for f in corp.files}
    components = {c: r.record() for c, r in raw.items()}
    for c, rec in components.items():
        rec["statistics_steps"] = {"gpt": counters["prefill"] + counters["decode"], "head_code": counters["head"]}.get(c)
    raw_bytes = sum(r.bytes for r in raw.values())
    return {
        "schema": SCHEMA,
        "artifact": identity,
        "corpus": describe,
        "seed": seed,
        "sentences": {
            "requested": len(picked), "used": len(sha_list), "skipped": skipped, "merged_from_earlier_runs":
            sum(len(s.manifest.get("sentence_sha256", [])) for s in earlier),
            "already_in_merged_runs": already, "per_file": dict(sorted(per_file.items())),
            "selection": "stratified by corpus file (largest remainder, at least one each), seeded within a file",
        },
        "sentence_sha256": sorted(sha_list),
        "statistics": {
            "file": STATS_FILE,
            "bytes": stats_bytes,
            "sentences": "every used sentence (sentence_sha256)",
            "graphs": {g: {"tensors": len(t), "steps": stats.samples(g), "sha256": stats.graph_sha256.get(g)}
                       for g, t in sorted(stats.graphs.items())},
            "kv_cache_steps": stats.kv_samples,
            "kinds": "per tensor min/max and |x| histogram; per channel max |x| and mean square; KV per channel max |x|",
        },
        "merged": [str(s.path.resolve()) for s in earlier],
        "settings": settings,
        "bounds": {
            "disk_budget_bytes": budget,
            "statistics_reserve_bytes": reserve,
            "raw_sample": {c: {"count": r.bounds.count, "bytes": r.bounds.bytes} for c, r in raw.items()},
            "memory": "statistics (fixed by the graphs) + one sentence's synthesis + the raw sample's keys; "
                      "raw inputs are spilled to disk as they are kept",
        },
        "disk_budget_bytes": budget,
        "bytes_total": raw_bytes + stats_bytes,
        "truncated_by_budget": any(r.offered > len(r.kept) for r in raw.values()),
        "components": components,
        "sample_sentences": {rel: sample_sentence.get(rel, "") for r in raw.values() for _, _, rel in r.kept},
        "gpt_samples": {
            "prefill": counters["prefill"],
            "decode": counters["decode"],
            "past_length_min": int(counters["past_min"] or 0),
            "past_length_max": int(counters["past_max"]),
        },
        "run": {"seconds": round(time.perf_counter() - started, 1), "peak_rss_bytes": _peak_rss_bytes()},
        "versions": library_versions(),
        "toolchain": toolchain_info(),
        "created_at": build_timestamp(),
    }
