"""Latency, throughput and memory of an artifact (and, on request, ChatTTS's PyTorch FP32 pipeline).

The evaluate stage's workload on the engines of `chattts_forge.runtime.timed_engine` and
`chattts_forge.torch_ref.engine` (the same engines,
spans and definitions as `bench`; docs/bench.md "Definitions"), set by one `LatencyConfig`:

`measure_artifact(artifact_dir, sentences, config)` loads the runtime (`load_seconds`), runs
`warmup` untimed syntheses, then synthesizes every sentence alone (batch 1, EOS free, a random
speaker of seed `seed + i`) and records per utterance: end-to-end seconds, audio seconds, codes and
RTF (end-to-end seconds / audio seconds); RTF p50/p95/p99; codes per second; first audio when
streaming (`stream_batch` steps); throughput at each batch size (one call with B sentences: streams
= audio seconds of all rows per wall second, codes/s); memory (`memory`): the artifact measured in a
process of its own as `bench` measures it (`memory_probe.measure_memory`: load, then bench's text
at `memory_steps` steps a row at each of `memory_batches`; peak RSS per batch size, resident size
after load, the command that repeats it). Timing may share a process with other artifacts; memory
never does (RSS is per process, and allocators keep what others freed). Bytes on disk. The
waveforms are returned too (the evaluate stage scores them).

`measure_against(artifact_dir, reference_dir, sentences, config)` is the gate's comparison (issue
27): both are loaded side by side and every sentence is synthesized by the two in turn, the order
rotated each round (`runtime.interleave.compare_rounds`), so load on a shared machine hits both
alike. Each round's artifact RTF over the reference's RTF (same sentence, same request) is one
ratio sample; after every sentence ran once, rounds go on over the sentences again until the 90%
interval of the median ratio is within +-`ratio_bound` or `ratio_time_cap_s` more seconds are spent
(and no longer than that first pass took: `RATIO_CAP_SCALE`) (`ratio`: the median, the interval, its `spread`, the rounds and what stopped it). Both records are
built as `measure_artifact`'s, an utterance's seconds being the median of its runs; first audio and
throughput are interleaved the same way (one run each in turn).

`measure_pytorch(checkpoint, sentences, ...)` measures ChatTTS's own PyTorch pipeline
(`torch_ref.engine.TorchEngine`: normalizer, code stage, Decoder + Vocos; no refinement, no sentence split)
per sentence the same way; torch is imported only there.

The report's `machine` section is `machine.machine_info(threads)`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput
from chattts_forge.log import get_logger
from chattts_forge.progress import Progress, track
from chattts_forge.runtime.interleave import RatioSettings, compare_rounds
from chattts_forge.runtime.memory_probe import PROBE_BATCHES, measure_memory
from chattts_forge.runtime.timed_engine import OnnxEngine
from chattts_forge.runtime.timing import (
    BENCH_STEPS,
    CLOCK,
    Request,
    RunFigures,
    median,
    per_second,
    percentiles,
    time_calls,
)

log = get_logger(__name__)


# The gate's RTF ratio: known to +-5% (90% interval of the median per-round ratio), or further
# interleaved rounds after one pass over the sentences for at most 30 s and at most as long as that
# pass took (a tiny model's pass is well under a second: its noise does not buy 30 s).
RATIO_BOUND = 0.05
RATIO_TIME_CAP_S = 30.0
RATIO_CAP_SCALE = 1.0
RATIO_MIN_ROUNDS = 6


@dataclass(frozen=True)
class LatencyConfig:
    """How evaluate times an artifact: `threads` (onnxruntime intra-op), `max_new_token` (EOS free
    below it), `seed` (sentence i: sampling and speaker seed `seed + i`), `batch_sizes` (throughput),
    `warmup` untimed syntheses, `stream_batch` and `first_audio_runs` (first audio when streaming),
    `isolate_memory` (the memory figures, each artifact in a fresh process: `memory_steps` steps a row
    at each of `memory_batches`, bench's workload), `provider` (cpu or cuda, resolved), `progress`
    (tqdm); for `measure_against`, the RTF ratio's `ratio_bound` and `ratio_time_cap_s` (module doc)."""

    threads: int | None = 2
    max_new_token: int = 96
    seed: int = 0
    batch_sizes: tuple[int, ...] = (1, 4, 8)
    warmup: int = 1
    stream_batch: int = 24
    first_audio_runs: int = 3
    isolate_memory: bool = True
    memory_steps: int = BENCH_STEPS
    memory_batches: tuple[int, ...] = PROBE_BATCHES
    provider: str = "cpu"
    progress: bool = True
    ratio_bound: float = RATIO_BOUND
    ratio_time_cap_s: float = RATIO_TIME_CAP_S

    def __post_init__(self) -> None:
        if self.max_new_token < 1 or self.warmup < 0 or self.first_audio_runs < 0 or self.stream_batch < 1:
            raise BadInput("latency: max_new_token and stream_batch must be >= 1, warmup and first_audio_runs >= 0")
        if any(b < 1 for b in (*self.batch_sizes, *self.memory_batches)) or not self.memory_batches:
            raise BadInput(f"latency: batch sizes must be >= 1, got {self.batch_sizes} and memory "
                             f"{self.memory_batches}")
        if self.memory_steps < 2:
            raise BadInput(f"latency: memory_steps must be >= 2, got {self.memory_steps}")
        if not (self.ratio_bound > 0 and self.ratio_time_cap_s >= 0):
            raise BadInput(f"latency: ratio_bound must be > 0 and ratio_time_cap_s >= 0, got {self.ratio_bound} "
                             f"and {self.ratio_time_cap_s}")

    def request(self, i: int) -> Request:
        """Sentence i's request (the same for every engine)."""
        return Request(max_new_token=self.max_new_token, seed=self.seed + i, speaker_seed=self.seed + i,
                       stream_batch=self.stream_batch)

    def ratio_settings(self, sentences: int) -> RatioSettings:
        """The interleaved comparison's stopping rules: every sentence at least once (uncapped), then
        until the bound or the cap; a round cap large enough that the time cap decides."""
        rounds = max(RATIO_MIN_ROUNDS, sentences)
        return RatioSettings(bound=self.ratio_bound, time_cap_s=max(self.ratio_time_cap_s, 1e-9), min_rounds=rounds,
                             max_rounds=max(400, 4 * rounds), warmup_rounds=0, cap_after_rounds=sentences,
                             cap_scale=RATIO_CAP_SCALE)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def _summary(utterances: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sum(u["seconds"] for u in utterances)
    steps = sum(u["steps"] for u in utterances)
    return {
        "rtf": percentiles([u["rtf"] for u in utterances]),
        "seconds": percentiles([u["seconds"] for u in utterances]),
        "seconds_per_step": percentiles([u["seconds"] / max(u["steps"], 1) for u in utterances]),
        "steps_per_second": per_second(steps, seconds),
        "total_seconds": seconds,
        "total_audio_seconds": sum(u["audio_seconds"] for u in utterances),
        "total_steps": steps,
    }


def _utterance(i: int, text: str, run: RunFigures) -> dict[str, Any]:
    return {
        "id": f"{i + 1:03d}",
        "text": text,
        "seconds": run.e2e_s,
        "audio_seconds": run.audio_s,
        "steps": run.row_codes[0],
        "rtf": run.e2e_rtf,
    }


def measure_utterances(
    engine: Any,
    sentences: list[str],
    request_of: Callable[[int], Request],
    warmup: int = 1,
    progress: bool = False,
    desc: str = "synth",
    keep_audio: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, tuple[np.ndarray, int]], float]:
    """(per-utterance records, {id: (waveform, sample_rate)} if kept, warm-up seconds): `warmup`
    untimed runs of the first sentence, then every sentence alone (batch 1) with `request_of(i)`.
    An utterance's `rtf` is the engine run's end-to-end RTF: bench's `e2e_rtf` at batch 1."""
    warmup_seconds = sum(time_calls(lambda: engine.run([sentences[0]], request_of(0)), warmup))
    utterances: list[dict[str, Any]] = []
    waves: dict[str, tuple[np.ndarray, int]] = {}
    for i, text in enumerate(track(sentences, desc, "utt", enabled=progress, leave=False)):
        run: RunFigures = engine.run([text], request_of(i), keep_audio=keep_audio)
        utterances.append(_utterance(i, text, run))
        if run.wavs is not None:
            waves[utterances[-1]["id"]] = (run.wavs[0], run.sample_rate)
    return utterances, waves, warmup_seconds


class _Measured:
    """One artifact's engine under measurement and what its record is built from."""

    def __init__(self, artifact_dir: str | os.PathLike[str], config: LatencyConfig) -> None:
        self.artifact_dir = artifact_dir
        self.config = config
        self.engine = OnnxEngine(artifact_dir, config.threads, provider=config.provider)
        self.warmup_seconds = 0.0
        self.first_audio: list[float] = []
        self.first_audio_samples: list[dict[str, Any]] = []  # per sentence, for the regression gate's interval
        self.throughput: dict[str, dict[str, Any]] = {}

    def warm_up(self, text: str) -> None:
        self.warmup_seconds += sum(time_calls(lambda: self.engine.run([text], self.config.request(0)), 1))

    def time_first_audio(self, text: str, i: int) -> None:
        s = self.engine.first_audio(text, self.config.request(i))
        if not np.isnan(s):  # a run that streamed no audio measured nothing
            self.first_audio.append(s)
            self.first_audio_samples.append({"text": text, "seconds": s})

    def time_batch(self, sentences: list[str], b: int) -> None:
        run = self.engine.run([sentences[j % len(sentences)] for j in range(b)], self.config.request(0))
        self.throughput[str(b)] = {
            "batch": b,
            "seconds": run.e2e_s,
            "audio_seconds": run.total_audio_s,
            "steps": sum(run.row_codes),
            "aggregate_rtf": run.aggregate_rtf,  # wall seconds per second of audio
            "realtime_streams": run.streams,  # seconds of audio per wall second
            "steps_per_second": per_second(sum(run.row_codes), run.e2e_s),
        }

    def memory(self, probe: bool = True) -> dict[str, Any] | None:
        """The artifact's memory figures, measured in a process of its own (None: not asked for)."""
        cfg = self.config
        if not (cfg.isolate_memory and probe):
            return None
        # the variant's name in the command: the folder a published version holds it in, never this path
        label = self.engine.pipe.artifact.meta.variant or Path(self.artifact_dir).name
        return measure_memory(self.artifact_dir, threads=cfg.threads, steps=cfg.memory_steps, provider=cfg.provider,
                              batches=cfg.memory_batches, label=label)

    def record(self, utterances: list[dict[str, Any]], probe_memory: bool = True) -> dict[str, Any]:
        cfg = self.config
        return {
            "artifact": str(self.artifact_dir),
            "threads": cfg.threads,
            "max_new_token": cfg.max_new_token,
            "gpt_engine": self.engine.gpt_engine,
            "load_seconds": self.engine.load_seconds,
            "warmup_runs": cfg.warmup,
            "warmup_seconds": self.warmup_seconds,
            "utterances": utterances,
            **_summary(utterances),
            "first_audio_seconds": {**percentiles(self.first_audio), "stream_batch": cfg.stream_batch,
                                    # the artifact's recorded look-ahead (mel frames; None: the exact stream)
                                    "stream_lookahead_frames": self.engine.stream_lookahead,
                                    "runs": len(self.first_audio), "samples": self.first_audio_samples},
            "throughput": self.throughput,
            "memory": self.memory(probe_memory),
            "bytes_on_disk": dir_bytes(Path(self.artifact_dir)),
        }


def measure_artifact(
    artifact_dir: str | os.PathLike[str],
    sentences: list[str],
    config: LatencyConfig | None = None,
    desc: str = "synth",
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, int]]]:
    """(latency record, {utterance id: (waveform, sample_rate)}) of one artifact; see module doc."""
    cfg = config or LatencyConfig()
    if not sentences:
        raise BadInput("latency: no sentences to time")
    m = _Measured(artifact_dir, cfg)
    utterances, waves, m.warmup_seconds = measure_utterances(m.engine, sentences, cfg.request, cfg.warmup,
                                                             cfg.progress, desc, True)
    _log_tail_phases(cfg, min(cfg.first_audio_runs, len(sentences)))
    for i in range(min(cfg.first_audio_runs, len(sentences))):
        m.time_first_audio(sentences[i], i)
    for b in cfg.batch_sizes:
        m.time_batch(sentences, b)
    return m.record(utterances), waves


def _log_tail_phases(cfg: LatencyConfig, first_audio_runs: int) -> None:
    """What runs after the per-sentence timing (silent otherwise for a minute at full size)."""
    log.info("latency: first audio (%d streamed runs), throughput at batch %s%s", first_audio_runs,
             "/".join(map(str, cfg.batch_sizes)),
             f", memory in a fresh process per artifact (batch {'/'.join(map(str, cfg.memory_batches))}, "
             f"{cfg.memory_steps} steps)" if cfg.isolate_memory else "")


@dataclass(frozen=True)
class PairLatency:
    """`measure_against`'s result: each side's record and audio, and the interleaved RTF ratio."""

    artifact: dict[str, Any]
    artifact_waves: dict[str, tuple[np.ndarray, int]]
    reference: dict[str, Any]
    reference_waves: dict[str, tuple[np.ndarray, int]]
    ratio: dict[str, Any]


def measure_against(
    artifact_dir: str | os.PathLike[str],
    reference_dir: str | os.PathLike[str],
    sentences: list[str],
    config: LatencyConfig | None = None,
    desc: str = "synth",
    clock: Callable[[], float] = CLOCK,
) -> PairLatency:
    """The artifact and its reference timed interleaved, with the RTF ratio and its spread (module doc)."""
    return measure_against_many({"artifact": artifact_dir}, reference_dir, sentences, config, desc, clock)["artifact"]


def _rotated(names: list[str], k: int) -> list[str]:
    return names[k % len(names):] + names[:k % len(names)]


def measure_against_many(
    artifacts: dict[str, str | os.PathLike[str]],
    reference_dir: str | os.PathLike[str],
    sentences: list[str],
    config: LatencyConfig | None = None,
    desc: str = "synth",
    clock: Callable[[], float] = CLOCK,
) -> dict[str, PairLatency]:
    """Every artifact of `artifacts` (name -> folder) timed against one reference in the same
    interleaved rounds (module doc): per round each sentence once on the reference and once on every
    artifact, the order rotated, so the reference is timed once per round for all of them (the build's
    latency run, evaluate.latency_run). Rounds go on until every ratio's spread is within the bound
    or the time cap; the reference's first audio and throughput are measured once, in turn with the
    artifacts'; each artifact's memory in a process of its own, the reference's not here (its record's
    `memory` is None: the reference's own run, `measure_artifact`, measures it). One artifact:
    `measure_against`."""
    cfg = config or LatencyConfig()
    if not sentences:
        raise BadInput("latency: no sentences to time")
    if not artifacts or "reference" in artifacts:
        raise BadInput("latency: name one artifact or more to time against the reference (not 'reference')")
    n = len(sentences)
    sides = {"reference": _Measured(reference_dir, cfg)}
    sides |= {name: _Measured(folder, cfg) for name, folder in artifacts.items()}
    names = list(sides)
    for _ in range(cfg.warmup):
        for side in sides.values():
            side.warm_up(sentences[0])
    firsts: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    runs: dict[str, list[list[float]]] = {name: [[] for _ in sentences] for name in sides}
    waves: dict[str, dict[str, tuple[np.ndarray, int]]] = {name: {} for name in sides}
    last = names[-1]
    bar = Progress(n, f"{desc} vs reference", "utt", enabled=cfg.progress, leave=False)

    def measure(round_: int, name: str) -> float:
        i = round_ % n
        first = round_ < n
        run = sides[name].engine.run([sentences[i]], cfg.request(i), keep_audio=first)
        runs[name][i].append(run.e2e_s)
        if first:
            firsts[name].append(_utterance(i, sentences[i], run))
            if run.wavs is not None:
                waves[name][firsts[name][-1]["id"]] = (run.wavs[0], run.sample_rate)
        if name == last and first:
            bar.update(1)
        elif name == last:
            bar.set_postfix_str(f"round {round_ + 1}")
        return run.e2e_rtf if run.e2e_rtf is not None else math.inf

    settings = cfg.ratio_settings(n)
    try:
        comparison = compare_rounds("reference", names[1:], measure, settings, clock)
    finally:
        bar.close()
    _log_tail_phases(cfg, min(cfg.first_audio_runs, n))
    runs_fa = min(cfg.first_audio_runs, n)
    # with several artifacts the tail runs minutes at full size: its own progress (done / total, ETA)
    tail = Progress((runs_fa + len(cfg.batch_sizes) + 1) * len(names), f"{desc}: first audio, throughput, memory",
                    "run", enabled=cfg.progress and len(names) > 2, leave=False)
    try:
        for i in range(runs_fa):  # one run each in turn, the order rotated
            for name in _rotated(names, i):
                sides[name].time_first_audio(sentences[i], i)
                tail.update(1)
        for k, b in enumerate(cfg.batch_sizes):
            for name in _rotated(names, k):
                sides[name].time_batch(sentences, b)
                tail.update(1)
        records = {}
        for name in sides:
            # the reference's memory is its own run's (evaluate.reference_run): probed once per build
            records[name] = sides[name].record(_with_median_seconds(firsts[name], runs[name]),
                                               probe_memory=name != "reference")
            tail.update(1)
    finally:
        tail.close()
    pairs = {}
    for name in names[1:]:
        est = comparison.estimates[name]
        shared = f" ({len(names) - 1} artifacts in the same rounds, the reference timed once per round)" \
            if len(names) > 2 else ""
        ratio = {
            "ratio": round(est.ratio, 4), "low": round(est.low, 4), "high": round(est.high, 4),
            "spread": round(est.spread, 4), "artifact_rtf": est.seconds, "reference_rtf": est.reference_seconds,
            "rounds": comparison.rounds, "sentences": n, "stopped": comparison.stopped,
            "converged": comparison.converged, "bound": cfg.ratio_bound, "time_cap_s": cfg.ratio_time_cap_s,
            "seconds": round(comparison.seconds, 3),
            "method": f"artifact and FP32 reference synthesize each sentence in turn (order rotated per round; "
                      f"{cfg.threads} threads, max_new_token {cfg.max_new_token}){shared}; ratio = median of the "
                      f"per-round RTF ratios; after one pass over the {n} sentences, rounds repeat until the ratio's "
                      f"90% interval is within +-{cfg.ratio_bound} or {cfg.ratio_time_cap_s:g} s more (at most the "
                      "first pass's time again)",
        }
        log.info("latency: %sRTF ratio vs reference %.3f (90%% interval %.3f-%.3f, %d interleaved rounds, %s)",
                 f"{name} " if len(names) > 2 else "", est.ratio, est.low, est.high, comparison.rounds, comparison.stopped)
        pairs[name] = PairLatency(records[name], waves[name], records["reference"], waves["reference"], ratio)
    return pairs


def _with_median_seconds(firsts: list[dict[str, Any]], runs: list[list[float]]) -> list[dict[str, Any]]:
    """The first pass's utterance records, seconds (and RTF) the median of every run of the sentence."""
    out = []
    for u, seconds in zip(firsts, runs, strict=True):
        mid = median(seconds)
        out.append({**u, "seconds": mid, "rtf": mid / u["audio_seconds"] if u["audio_seconds"] > 0 else None,
                    "runs": len(seconds)})
    return out


def interleaved_ratios(ratios: dict[str, float | None], pair: PairLatency | None) -> dict[str, float | None]:
    """The gate's `vs_reference` ratios with `rtf_p50` the interleaved median RTF ratio when there is
    one (the ratio of the two p50s is kept as `rtf_p50_of_p50s`)."""
    if pair is None:
        return ratios
    return {**ratios, "rtf_p50_of_p50s": ratios.get("rtf_p50"), "rtf_p50": pair.ratio["ratio"]}


def measure_pytorch(
    checkpoint: str | os.PathLike[str],
    sentences: list[str],
    threads: int | None = 2,
    max_new_token: int = 96,
    seed: int = 0,
    warmup: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """ChatTTS's PyTorch FP32 pipeline on the same sentences and requests (torch imported here only)."""
    from chattts_forge.torch_ref.engine import TorchEngine

    engine = TorchEngine(checkpoint, threads)
    try:
        def request(i: int) -> Request:
            return Request(max_new_token=max_new_token, seed=seed + i, speaker_seed=seed + i)

        utterances, _, _ = measure_utterances(engine, sentences, request, warmup, progress, "pytorch", False)
    finally:
        engine.close()
    return {
        "checkpoint": Path(checkpoint).name,  # the folder's name: the record travels in published reports
        "pipeline": "ChatTTS normalizer + Chat._infer_code + Chat._decode_to_wavs (PyTorch FP32; no refinement, "
                    "no sentence split)",
        "threads": threads,
        "torch": engine.torch.__version__,
        "load_seconds": engine.load_seconds,
        "warmup_runs": warmup,
        "utterances": utterances,
        **_summary(utterances),
    }


# Re-timing a variant against the baseline's same variant (publish.regression, issue 38): a few interleaved
# rounds, not the gate's full latency run. After `RETIME_MIN_ROUNDS` rounds, further rounds run until the
# ratio is within `ratio_bound` or for at most as long again as those rounds took, and never more than
# `RETIME_TIME_CAP_S` (a full-size round is two syntheses of seconds each; a build re-times every changed
# variant).
RETIME_MIN_ROUNDS = 4
RETIME_TIME_CAP_S = 20.0


def retime_against(
    artifact_dir: str | os.PathLike[str],
    baseline_dir: str | os.PathLike[str],
    sentences: list[str],
    config: LatencyConfig | None = None,
    time_cap_s: float = RETIME_TIME_CAP_S,
    clock: Callable[[], float] = CLOCK,
) -> dict[str, Any]:
    """The artifact's RTF against `baseline_dir`'s (another build of the same variant), both loaded here
    and synthesizing sentence i (request `config.request(i)`) in turn, the order rotated per round
    (`runtime.interleave.compare_rounds`); one warm-up run each first. Returns the per-round RTF ratios
    (`ratios`: artifact / baseline of the same round), each side's median RTF, the rounds, the seconds
    taken (loading included) and what stopped it. No first audio, throughput or memory: RTF only."""
    cfg = config or LatencyConfig()
    if not sentences:
        raise BadInput("latency: no sentences to re-time")
    started = clock()
    engines = {"baseline": OnnxEngine(baseline_dir, cfg.threads, provider=cfg.provider),
               "artifact": OnnxEngine(artifact_dir, cfg.threads, provider=cfg.provider)}
    for engine in engines.values():
        engine.run([sentences[0]], cfg.request(0))
    rtfs: dict[str, list[float]] = {name: [] for name in engines}

    def measure(round_: int, name: str) -> float:
        i = round_ % len(sentences)
        run = engines[name].run([sentences[i]], cfg.request(i))
        rtf = run.e2e_rtf if run.e2e_rtf is not None else math.inf
        rtfs[name].append(rtf)
        return rtf

    settings = RatioSettings(bound=cfg.ratio_bound, time_cap_s=max(time_cap_s, 1e-9), min_rounds=RETIME_MIN_ROUNDS,
                             max_rounds=400, warmup_rounds=0, cap_after_rounds=RETIME_MIN_ROUNDS,
                             cap_scale=RATIO_CAP_SCALE)
    comparison = compare_rounds("baseline", ["artifact"], measure, settings, clock)
    ratios = [a / b if b > 0 else math.inf for a, b in zip(rtfs["artifact"], rtfs["baseline"], strict=True)]
    return {"ratios": ratios, "artifact_rtf": median(rtfs["artifact"]), "baseline_rtf": median(rtfs["baseline"]),
            "rounds": comparison.rounds, "stopped": comparison.stopped, "sentences": len(sentences),
            "seconds": round(clock() - started, 3), "threads": cfg.threads, "max_new_token": cfg.max_new_token,
            "time_cap_s": time_cap_s, "bound": cfg.ratio_bound}
