"""`calibrate`: run an FP32 artifact over a text corpus, streaming what quantize needs into statistics.

    from chattts_forge.calibration_data.calibrate import calibrate
    calibrate("artifacts/fp32", "builtin:calibration", "build/calib")          # 512 sentences
    calibrate("artifacts/fp32", "builtin:calibration", "build/calib2", max_samples="all",
              merge=["build/calib"])                                           # the rest, merged in

Sentences are generated `batch_size` at a time (each row its own speaker) by the torch-free runtime,
`chattts_forge.runtime.Pipeline`, whose session runs `recorder.instrument` observes through the
runtime's public observer hook (the fused GPT graph generates; its observed steps are replayed as the
plain graph's feeds, `recorder.PlainFeedGptStep`). What is recorded:

- `gpt`: the prefill of every sentence (its own unpadded row) plus `decode_positions` decode steps per
  batch (drawn with the seed of its first sentence; one row per sentence still generating); each is
  run at once through an observer session of gpt.onnx (`observe.Observer`) and folded into
  `statistics.Statistics` (ranges, |x| histograms, per-channel importance and X^T X of every
  projection MatMul input; the KV cache's per-channel max |x|). The fused gpt_fast.onnx's statistics
  are gpt.onnx's under its names (the same activations, matched on a probe at start-up);
- `head_code`: the hidden state of `head_steps` steps per batch (statistics likewise);
- `decoder`, `dvae`: the GPT hidden states and the codes of each sentence (raw sample only: a
  sentence the raw sample would not keep is counted without running the graph).

Only a seeded sample of the raw inputs is kept (`store.RawSample`: at most `RAW_SAMPLE_COUNTS` per
component, within the disk budget, and only steps whose past is at most `max_past`). Memory: the
statistics (fixed by the graphs), one sentence's synthesis and the raw sample's keys; disk: the
statistics plus the raw sample. Neither grows with the corpus.

Sentences: `sentence_plan.select_sentences` draws `max_samples` (default 512; "all" for every usable one) stratified
by corpus file (every file represented). Lines the runtime's front end refuses are skipped and
counted before any synthesis. A sentence's speaker depends on the seed and its text only; its code
sampling and observed steps on its batch's first sentence. A run is deterministic, and `merge` of
earlier runs (their sentences are not synthesized again) gives, at batch size 1, the statistics and
raw sample of one run over all their sentences.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import DECODER, DVAE, FAST_GPT, GPT, HEAD_CODE, ArtifactMeta
from chattts_forge.calibration_data.calibrate_config import CalibrateConfig, parse_max_samples
from chattts_forge.calibration_data.corpus import Corpus, is_builtin_spec, load_corpus
from chattts_forge.calibration_data.observe import fused_feed
from chattts_forge.calibration_data.observers import (
    HESSIAN_GRAPHS,
    ObserverSet,
    open_observers,
    statistics_bytes,
)
from chattts_forge.calibration_data.recorder import check_recorded, instrument, new_pipeline, synth_params
from chattts_forge.calibration_data.sentence_plan import (
    SentencePlan,
    check_corpus,
    plan_sentences,
    sentence_seed,
    sentence_sha256,
)
from chattts_forge.calibration_data.statistics import (
    STATS_FILE,
    Statistics,
    sample_key,
)
from chattts_forge.calibration_data.store import (
    MANIFEST,
    SCHEMA,
    CalibrationStore,
    RawSample,
    RawSampleBounds,
)
from chattts_forge.errors import BadInput, ForgeError, IntegrityError
from chattts_forge.fsutil import atomic_output_dir, atomic_write_json, portable_path
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.progress import Progress
from chattts_forge.runtime.generation import PromptBatch, iter_generate
from chattts_forge.runtime.sampling import SeedGroups
from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

log = get_logger(__name__)

# X^T X of a prefill sums at most this many of its tokens (a seeded draw per sentence; decode steps: all
# rows): the products cost K^2 per token and 140 of them per GPT token at full size, while a few dozen
# thousand rows over the corpus already pin a 768-channel Hessian down.
HESSIAN_PREFILL_TOKENS = 32
COMPONENTS = (GPT, HEAD_CODE, DECODER, DVAE)
# The raw sample: enough for auto's sensitivity (8), the fused graph's parity check (8) and legacy static,
# with room to spare; its byte share of the disk budget per component.
RAW_SAMPLE_COUNTS = {GPT: 64, HEAD_CODE: 64, DECODER: 16, DVAE: 16}
RAW_SAMPLE_SHARES = {GPT: 0.80, HEAD_CODE: 0.05, DECODER: 0.10, DVAE: 0.05}
# Disk kept free of raw samples for statistics.npz and the manifest at least (more when the graphs'
# Hessians need it: ~170 MB at full size).
STATISTICS_RESERVE_BYTES = 32 << 20
# Settings that shape the statistics: runs merge only when they agree on all of them.
MERGE_SETTINGS = ("max_new_token", "decode_positions_per_batch", "head_steps_per_batch")



def _artifact_identity(artifact_dir: Path, meta: ArtifactMeta, recorded_in: Path) -> dict[str, Any]:
    """The FP32 artifact a calibration set was recorded on; its path relative to the set's folder
    `recorded_in` (a build records the same bytes wherever it sits)."""
    gpt_file = meta.component_path(artifact_dir, GPT)
    return {
        "path": portable_path(artifact_dir, recorded_in),
        "variant": meta.variant,
        "gpt_sha256": meta.component(GPT).get("sha256") or (sha256_file(gpt_file) if gpt_file.is_file() else None),
        "source": meta.source,
    }



def _check_merge(paths: Sequence[Path], identity: dict[str, Any], corp: Corpus, seed: int,
                 settings: dict[str, Any]) -> list[CalibrationStore]:
    stores = []
    files = {Path(f).name: sha256_file(f) for f in corp.files}
    for p in paths:
        store = CalibrationStore(p)
        m = store.manifest
        if (m.get("artifact") or {}).get("gpt_sha256") != identity["gpt_sha256"]:
            raise IntegrityError(f"--merge {p}: its statistics were recorded from another artifact (gpt sha256 differs)")
        if m.get("seed") != seed:
            raise BadInput(f"--merge {p}: recorded with seed {m.get('seed')}, this run uses {seed}")
        theirs = m.get("settings") or {}
        for k in MERGE_SETTINGS:
            if theirs.get(k) != settings[k]:
                raise BadInput(f"--merge {p}: recorded with {k}={theirs.get(k)}, this run uses {settings[k]}")
        # Built-in corpora are versioned: statistics of two versions (or of edited files) do not mix.
        theirs_corpus = m.get("corpus") or {}
        their_name = str(theirs_corpus.get("name", ""))
        if is_builtin_spec(their_name) and is_builtin_spec(corp.name):
            version, their_version = corp.name.partition(":")[0], their_name.partition(":")[0]
            if version != their_version:
                raise BadInput(f"--merge {p}: recorded from corpus version {their_version}, this run reads {version}")
            for name, sha in (theirs_corpus.get("file_sha256") or {}).items():
                if name in files and files[name] != sha:
                    raise IntegrityError(f"--merge {p}: recorded from another version of corpus file {name} "
                                     "(sha256 differs)")
        stores.append(store)
    return stores


def calibrate(artifact_dir: str | os.PathLike[str], corpus: str | os.PathLike[str] | Corpus,
              out_dir: str | os.PathLike[str], config: CalibrateConfig | None = None, **options: Any) -> Path:
    """Stream calibration statistics (and a bounded raw sample) into `out_dir` (written atomically).
    `options`: `CalibrateConfig` fields (overriding `config`'s). See the module docstring."""
    started = time.perf_counter()
    try:
        cfg = replace(config or CalibrateConfig(), **options)
    except TypeError as e:
        raise ForgeError(f"calibrate: {e}") from None
    artifact_dir, out_dir = Path(artifact_dir), Path(out_dir)
    count = parse_max_samples(cfg.max_samples)
    cfg.check()
    corp = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    check_corpus(corp, cfg.allow_one_language)
    settings = cfg.settings(count)
    pipe = new_pipeline(artifact_dir, cfg.threads)
    meta = pipe.artifact.meta
    if meta.quantization or meta.component(GPT).get("precision", "fp32") != "fp32":
        raise ForgeError(f"{artifact_dir} is not an FP32 artifact; calibrate the FP32 artifact from `convert`")
    identity = _artifact_identity(artifact_dir, meta, Path(out_dir))
    earlier = _check_merge([Path(p) for p in cfg.merge], identity, corp, cfg.seed, settings)
    plan = plan_sentences(pipe, corp, earlier, count, cfg.seed)
    observers = open_observers(pipe, artifact_dir, cfg.threads)
    budget = int(cfg.disk_budget_mb * (1 << 20))
    reserve = min(max(STATISTICS_RESERVE_BYTES, statistics_bytes(observers) + (8 << 20)), budget // 2)
    counts = {**RAW_SAMPLE_COUNTS, **(cfg.raw_sample_counts or {})}
    bounds = {c: RawSampleBounds(counts[c], int((budget - reserve) * RAW_SAMPLE_SHARES[c])) for c in COMPONENTS}

    with atomic_output_dir(out_dir) as tmp:
        rec = _Recorder(pipe, observers, cfg, {c: RawSample(tmp, c, bounds[c]) for c in COMPONENTS})
        rec.adopt(earlier)
        used = rec.record_sentences(corp, plan)
        if not used and not earlier:
            raise ForgeError(f"no sentence of corpus '{corp.name}' could be synthesized")
        rec.stats.save(tmp / STATS_FILE)
        stats_bytes = (tmp / STATS_FILE).stat().st_size
        if stats_bytes > reserve:
            log.warning("statistics take %.2f MB, more than the %.2f MB of the disk budget reserved for them",
                        stats_bytes / (1 << 20), reserve / (1 << 20))
        manifest = _manifest(_RunSummary(identity, corp, cfg.seed, settings, plan, used, earlier, rec, stats_bytes,
                                         budget, reserve, started))
        atomic_write_json(tmp / MANIFEST, manifest)
    c = rec.counters
    log.info(
        "calibration statistics written to %s: %d sentences (+%d merged), gpt %d steps (%d prefill, %d decode), "
        "raw sample %.1f MB, statistics %.1f MB, peak RSS %.0f MB, %.0f s",
        out_dir, len(used), len(plan.seen), c["prefill"] + c["decode"], c["prefill"], c["decode"],
        sum(r.bytes for r in rec.raw.values()) / (1 << 20), stats_bytes / (1 << 20),
        manifest["run"]["peak_rss_bytes"] / (1 << 20), manifest["run"]["seconds"],
    )
    return out_dir




def row_feed(feed: Mapping[str, np.ndarray], row: int) -> dict[str, np.ndarray]:
    """One batch row of a plain-GPT feed without its left padding: the feed of that sentence alone."""
    mask = np.asarray(feed["attention_mask"])[row]
    pad = int(np.argmax(mask != 0)) if mask.any() else 0
    first = feed.get("past_key_values.0.key")
    past = 0 if first is None else int(first.shape[2])
    cut_past, cut_new = min(pad, past), pad - min(pad, past)
    out: dict[str, np.ndarray] = {}
    for name, arr in feed.items():
        a = np.asarray(arr)[row : row + 1]
        if name == "attention_mask":
            a = a[:, pad:]
        elif name in ("inputs_embeds", "position_ids"):
            a = a[:, cut_new:]
        elif name.startswith("past_key_values."):
            a = a[:, :, cut_past:]
        out[name] = np.ascontiguousarray(a)
    return out


def _rows_feed(feed: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    select = getattr(feed, "select", None)  # a fused step's plain feed copies only these rows of its cache
    if select is not None:
        return select(np.asarray(rows))
    return {name: np.ascontiguousarray(np.asarray(arr)[rows]) for name, arr in feed.items()}


@dataclass
class _Batch:
    """Sentences observed together (one seed) and which of their steps are observed; `first_row`: where
    its rows start in the GPT call it is generated in (with the other batches of its `_Call`)."""

    shas: list[str]
    positions: set[int]  # observed decode steps (GPT calls after the prefill)
    heads: set[int]  # observed code-head calls
    index: list[dict[str, int]]  # per row: raw inputs offered so far per component (their keys)
    first_row: int = 0

    def rows(self) -> range:
        return range(self.first_row, self.first_row + len(self.shas))


@dataclass
class _Call:
    """One generation: the batches generated together, the GPT and code-head calls so far."""

    batches: list[_Batch]
    call: int = 0
    head_call: int = 0
    state: Any = None  # the runtime's StepState once the first step is out (rows that ended)

    def active(self, batch: _Batch) -> np.ndarray:
        """`batch`'s rows still generating, as rows of the call: finished rows keep running but are not observed."""
        rows = np.asarray(batch.rows())
        if self.state is None:
            return rows
        return rows[~np.asarray(self.state.finish, dtype=bool)[rows]]


class _Recorder:
    """Folds what the runtime's sessions are fed into the statistics and the raw sample, batch by batch."""

    def __init__(self, pipe: Any, observers: ObserverSet, cfg: CalibrateConfig, raw: dict[str, RawSample]) -> None:
        self.pipe, self.observers, self.derived, self.cfg, self.raw = pipe, observers.run, observers.derived, cfg, raw
        self.stats = Statistics()
        self.stats.hessian_graphs = set(HESSIAN_GRAPHS)
        for g, obs in observers.run.items():
            self.stats.graph_sha256[g] = sha256_file(obs.path)
        if observers.derived_path is not None:
            self.stats.graph_sha256[FAST_GPT] = sha256_file(observers.derived_path)
        self.sample_sentence: dict[str, str] = {}
        self.counters: dict[str, Any] = {"prefill": 0, "decode": 0, "head": 0, "past_min": None, "past_max": 0,
                                         "batches": 0}
        self.skipped: list[dict[str, str]] = []
        self.gen: _Call | None = None
        self._decoding: tuple[_Batch, int] | None = None  # the batch and row whose Decoder/DVAE input is recorded
        self._source: list[str] = []  # the corpus sentences (by index)

    def adopt(self, earlier: Sequence[CalibrationStore]) -> None:
        """Earlier runs' statistics and raw samples, as if recorded here."""
        for store in earlier:
            self.stats.merge(store.statistics)
            for c in COMPONENTS:
                rec = store.manifest["components"].get(c, {})
                for key, size, rel in zip(rec.get("keys", []), rec.get("sizes", []), rec.get("shards", []), strict=True):
                    self.raw[c].adopt(key, size, store.path / rel)
                    self.sample_sentence[f"{c}/{Path(rel).name}"] = store.manifest.get("sample_sentences", {}).get(rel, "")

    def raw_wanted(self, component: str, batch: _Batch, row: int) -> bool:
        """Whether the raw sample would keep the next input of `component` of `batch`'s `row` (its key is below the cut)."""
        idx = batch.index[row].get(component, 0)
        return self.raw[component].would_keep(sample_key(self.cfg.seed, batch.shas[row], component, idx))

    def keep_raw(self, component: str, batch: _Batch, row: int, feed: Mapping[str, Any], condition: bool = True) -> None:
        sha = batch.shas[row]
        idx = batch.index[row].get(component, 0)
        batch.index[row][component] = idx + 1
        key = sample_key(self.cfg.seed, sha, component, idx)
        sample = {k: np.asarray(v) for k, v in feed.items()} if condition and self.raw[component].would_keep(key) else None
        if self.raw[component].offer(key, sample):
            self.sample_sentence[f"{component}/sample-{int(key * 2**64):016x}.npz"] = sha

    def observe_gpt(self, feed: Mapping[str, np.ndarray], sha: str | None = None) -> None:
        """gpt.onnx's (and, unless derived, the fused graph's) MatMul inputs and the KV cache of one feed;
        `sha`: a one-sentence prefill, whose X^T X sums a seeded draw of `HESSIAN_PREFILL_TOKENS` tokens."""
        rows = None
        tokens = int(feed["inputs_embeds"].shape[1])
        if sha is not None and tokens > HESSIAN_PREFILL_TOKENS:
            rng = np.random.default_rng([self.cfg.seed, int(sha[:8], 16)])
            rows = np.sort(rng.choice(tokens, size=HESSIAN_PREFILL_TOKENS, replace=False))
        self.stats.update_graph(GPT, self.observers[GPT].run(feed), hessian_rows=rows)
        if FAST_GPT in self.observers:
            self.stats.update_graph(FAST_GPT, self.observers[FAST_GPT].run(fused_feed(feed)))
        self.stats.update_kv(feed)

    def on_run(self, component: str, feeds: Any, names: list[str], outs: list[Any]) -> None:
        gen = self.gen
        if gen is None:
            return
        if component == GPT:
            call = gen.call
            gen.call += 1
            for batch in gen.batches:
                if call == 0:  # the prefill, row by row: each sentence's own (unpadded) prompt
                    for row in range(len(batch.shas)):
                        feed = row_feed(feeds, batch.first_row + row)
                        self.observe_gpt(feed, sha=batch.shas[row])
                        self._observe_step(feed, batch, row, "prefill")
                elif call in batch.positions:
                    active = gen.active(batch)
                    if len(active):  # one observation of the batch's rows still generating
                        rows = _rows_feed(feeds, active)
                        self.observe_gpt(rows)
                        for k, row in enumerate(active):
                            self._observe_step(row_feed(rows, k), batch, int(row) - batch.first_row, "decode")
        elif component == HEAD_CODE:
            call = gen.head_call
            gen.head_call += 1
            for batch in gen.batches:
                active = gen.active(batch)
                if call in batch.heads and len(active):
                    if HEAD_CODE in self.observers:
                        self.stats.update_graph(HEAD_CODE, self.observers[HEAD_CODE].run(_rows_feed(feeds, active)))
                    self.counters["head"] += len(active)
                    for row in active:
                        self.keep_raw(HEAD_CODE, batch, int(row) - batch.first_row, _rows_feed(feeds, np.array([row])))
        elif component in (DECODER, DVAE) and self._decoding is not None:
            self.keep_raw(component, *self._decoding, feeds)

    def _observe_step(self, feed: dict[str, np.ndarray], batch: _Batch, row: int, kind: str) -> None:
        """Count one observed GPT step of a batch's row and offer its feed to the raw sample."""
        first = feed.get("past_key_values.0.key")
        past = 0 if first is None else int(first.shape[2])
        c = self.counters
        c[kind] += 1
        c["past_min"] = past if c["past_min"] is None else min(c["past_min"], past)
        c["past_max"] = max(c["past_max"], past)
        self.keep_raw(GPT, batch, row, feed, past <= self.cfg.max_past)

    def record_sentences(self, corp: Corpus, plan: SentencePlan) -> list[int]:
        """Synthesize the planned sentences in batches (recording as they run); the indices used."""
        recording = instrument(self.pipe, self.on_run, COMPONENTS)
        used: list[int] = []
        self._source = corp.sentences
        batches = self._batches(corp, plan)
        with Progress(len(plan.picked), "calibrate", "sent", enabled=self.cfg.progress) as bar:
            per_call = self.cfg.batches_per_call
            for k in range(0, len(batches), per_call):
                group = batches[k : k + per_call]
                used.extend(self._record_call(group, plan.stems))
                bar.update(sum(len(b) for b in group))
                bar.set_postfix_str(f"raw sample {sum(r.bytes for r in self.raw.values()) / (1 << 20):.0f} MB")
        if plan.picked:
            check_recorded(recording, GPT)
        recording.remove()
        plan.skipped.extend(self.skipped)
        if self.derived and GPT in self.stats.graphs:
            self.stats.derive(FAST_GPT, GPT, self.derived)
        return sorted(used)

    def _batches(self, corp: Corpus, plan: SentencePlan) -> list[list[tuple[int, Any]]]:
        """(corpus index, code-stage inputs) batches; sentences the runtime refuses here (normalisation,
        length) are skipped and counted. Each row's speaker comes from its own seed."""
        pipe, cfg = self.pipe, self.cfg
        rows: list[tuple[int, Any]] = []
        with quiet_logger():
            for i in plan.picked:
                params = synth_params(pipe, sentence_seed(cfg.seed, sentence_sha256(corp.sentences[i])),
                                      cfg.max_new_token)
                try:
                    norm = pipe.prepare_texts([corp.sentences[i]], params)[0]
                    rows.append((i, pipe.prepare_code_inputs(norm, params.code)))
                except ForgeError as e:
                    self.skipped.append({"sentence": corp.sentences[i], "file": plan.stems[i], "reason": str(e)})
        if cfg.batch_size > 1:  # similar prompt lengths together: less padding in the batched prefill
            rows.sort(key=lambda r: r[1][0].shape[1])
        size = cfg.batch_size
        return [rows[k : k + size] for k in range(0, len(rows), size)]

    def _record_call(self, group: list[list[tuple[int, Any]]], stems: list[str]) -> list[int]:
        """Generate batches in one GPT call (each row its own speaker, each batch sampled with its first
        sentence's seed as if alone), observe them, record the Decoder/DVAE inputs. A batch the runtime
        refuses there is skipped and counted: the call is then made again batch by batch."""
        pipe, cfg = self.pipe, self.cfg
        batches: list[_Batch] = []
        seeds: list[int] = []
        for rows in group:
            shas = [sentence_sha256(self._source[i]) for i, _ in rows]
            seed = sentence_seed(cfg.seed, shas[0])
            srng = np.random.default_rng(seed)  # the batch's observed steps: from its first sentence
            steps = np.arange(1, cfg.max_new_token)
            batches.append(_Batch(
                shas=shas, index=[{} for _ in rows], first_row=sum(len(b.shas) for b in batches),
                positions=set(srng.choice(steps, size=min(cfg.decode_positions, len(steps)), replace=False).tolist()),
                heads=set(srng.choice(cfg.max_new_token, size=min(cfg.head_steps, cfg.max_new_token),
                                      replace=False).tolist()),
            ))
            seeds.append(seed)
        parts = [p for rows in group for _, p in rows]
        self.gen = _Call(batches)
        try:
            with quiet_logger():
                gen = self._generate(parts, SeedGroups(tuple(seeds), tuple(len(b.shas) for b in batches)))
        except ForgeError as e:
            self.gen = None
            if len(group) > 1:  # as alone: only the batch the runtime refuses is skipped
                return [i for rows in group for i in self._record_call([rows], stems)]
            for i, _ in group[0]:  # refused late: the batch is skipped and counted
                self.skipped.append({"sentence": self._source[i], "file": stems[i], "reason": str(e)})
            return []
        self.counters["batches"] += len(batches)
        for batch in batches:
            for row in range(len(batch.shas)):
                codes, hiddens = gen.ids[batch.first_row + row], gen.hiddens[batch.first_row + row]
                self._decoding = (batch, row)
                for component, steps in ((DECODER, hiddens), (DVAE, codes)):
                    if not (len(steps) and pipe.artifact.has_component(component)):
                        continue
                    if self.raw_wanted(component, batch, row):  # records the input (on_run); its mel is not needed
                        pipe.decode_mel(steps, use_decoder=component == DECODER)
                    else:  # counted as offered, as if decoded, without running the graph
                        self.keep_raw(component, batch, row, {}, condition=False)
        self.gen, self._decoding = None, None
        return [i for rows in group for i, _ in rows]

    def _generate(self, parts: list[Any], seeds: SeedGroups) -> Any:
        """The code stage of the rows' (embeds, ids, mask) as one left-padded batch (what the runtime's
        tokenizer does for a batch), each seed group sampled with its seed."""
        pipe, cfg = self.pipe, self.cfg
        width = max(p[0].shape[1] for p in parts)
        emb = np.zeros((len(parts), width, parts[0][0].shape[2]), np.float32)
        ids = np.zeros((len(parts), width, parts[0][1].shape[2]), np.int64)
        mask = np.zeros((len(parts), width), np.int64)
        for b, (e, i, m) in enumerate(parts):
            emb[b, width - e.shape[1]:], ids[b, width - e.shape[1]:], mask[b, width - e.shape[1]:] = e[0], i[0], m[0]
        params = synth_params(pipe, seeds.seeds[0], cfg.max_new_token).code
        state = None
        for state in iter_generate(pipe, PromptBatch(emb, ids, mask), pipe.code_sampling(params), infer_text=False,
                                   max_new_token=params.max_new_token, seed=seeds,
                                   ensure_non_empty=params.ensure_non_empty):
            assert self.gen is not None
            self.gen.state = state
        assert state is not None
        return state.result()


@dataclass
class _RunSummary:
    """What the manifest is written from."""

    identity: dict[str, Any]
    corp: Corpus
    seed: int
    settings: dict[str, Any]
    plan: SentencePlan
    used: list[int]
    earlier: list[CalibrationStore]
    rec: _Recorder
    stats_bytes: int
    budget: int
    reserve: int
    started: float



def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _manifest(run: _RunSummary) -> dict[str, Any]:
    corp, stems, used, earlier, stats, raw = run.corp, run.plan.stems, run.used, run.earlier, run.rec.stats, run.rec.raw
    counters = run.rec.counters
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
    components = {c: r.record() for c, r in raw.items()}
    for c, rec in components.items():
        rec["statistics_steps"] = {GPT: counters["prefill"] + counters["decode"], HEAD_CODE: counters["head"]}.get(c)
    raw_bytes = sum(r.bytes for r in raw.values())
    return {
        "schema": SCHEMA,
        "artifact": run.identity,
        "corpus": describe,
        "seed": run.seed,
        "sentences": {
            "requested": len(run.plan.picked), "used": len(sha_list), "skipped": run.plan.skipped, "merged_from_earlier_runs":
            sum(len(s.manifest.get("sentence_sha256", [])) for s in earlier),
            "already_in_merged_runs": run.plan.already, "per_file": dict(sorted(per_file.items())),
            "selection": "stratified by corpus file (largest remainder, at least one each), seeded within a file",
        },
        "sentence_sha256": sorted(sha_list),
        "statistics": {
            "file": STATS_FILE,
            "bytes": run.stats_bytes,
            "sentences": "every used sentence (sentence_sha256)",
            "graphs": {g: {"tensors": len(t), "steps": stats.samples(g), "sha256": stats.graph_sha256.get(g)}
                       for g, t in sorted(stats.graphs.items())},
            "kv_cache_steps": stats.kv_samples,
            "nonfinite_rows_left_out": stats.nonfinite_rows(),
            "kinds": "per tensor min/max and |x| histogram; per channel max |x| and mean square; KV per channel max "
                     "|x|; X^T X (block-diagonal) of the MatMul inputs of " + ", ".join(HESSIAN_GRAPHS),
            "hessian_graphs": list(HESSIAN_GRAPHS),
            "hessian_rows": f"X^T X: every observed decode row and code-head row; of a prefill, a seeded draw of at most "
                            f"{HESSIAN_PREFILL_TOKENS} of its tokens (all when shorter)",
        },
        "merged": [str(s.path.resolve()) for s in earlier],
        "settings": run.settings,
        "bounds": {
            "disk_budget_bytes": run.budget,
            "statistics_reserve_bytes": run.reserve,
            "raw_sample": {c: {"count": r.bounds.count, "bytes": r.bounds.bytes} for c, r in raw.items()},
            "memory": "statistics (fixed by the graphs) + one sentence's synthesis + the raw sample's keys; "
                      "raw inputs are spilled to disk as they are kept",
        },
        "disk_budget_bytes": run.budget,
        "bytes_total": raw_bytes + run.stats_bytes,
        "truncated_by_budget": any(r.offered > len(r.kept) for r in raw.values()),
        "components": components,
        "sample_sentences": {rel: run.rec.sample_sentence.get(rel, "") for r in raw.values() for _, _, rel in r.kept},
        "gpt_samples": {
            "batches": counters["batches"],
            "prefill": counters["prefill"],
            "decode": counters["decode"],
            "past_length_min": int(counters["past_min"] or 0),
            "past_length_max": int(counters["past_max"]),
        },
        "run": {"seconds": round(time.perf_counter() - run.started, 1), "peak_rss_bytes": _peak_rss_bytes()},
        "versions": library_versions(),
        "toolchain": toolchain_info(),
        "created_at": build_timestamp(),
    }
