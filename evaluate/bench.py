"""`bench`: the artifact's runtime against ChatTTS's own PyTorch FP32 pipeline, in one process.

Both engines (`chattts_forge.runtime.timed_engine.OnnxEngine` / `torch_ref.engine.TorchEngine`, the ones the evaluate
stage's latency metrics use) synthesize the same text with the same number of GPT steps (EOS masked
with `min_new_token = max_new_token = steps`, so every row has exactly `steps` codes), after a
warm-up, for several repetitions, interleaved (onnx, pytorch, onnx, pytorch, ...) so that the load
of a shared machine hits both alike. Every figure is a median with its p10/p90 spread, and every
ONNX figure also appears as a ratio to the PyTorch figure of the same run. What each figure times
and the definitions of RTF, streams and first audio: `runtime.timing` and docs/bench.md.

Library use::

    from chattts_forge.evaluate.bench import BenchConfig, run_bench
    cfg = BenchConfig(baseline="pytorch", checkpoint="ckpt/", batches=(1, 8), steps=422, threads=2, reps=3)
    report = run_bench("artifacts/int4", cfg, json_out="bench.json")

torch is imported only when the PyTorch baseline is asked for.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, GPT, ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_write_json, recorded_path
from chattts_forge.log import get_logger
from chattts_forge.runtime.costmodel import cost_report, host_speed_info
from chattts_forge.runtime.generation import check_engine
from chattts_forge.runtime.machine import machine_info
from chattts_forge.runtime.memory_probe import RssSampler
from chattts_forge.runtime.providers import resolve_provider
from chattts_forge.runtime.timed_engine import OnnxEngine
from chattts_forge.runtime.timing import (
    BENCH_STEPS,
    BENCH_TEXT,
    CONTEXT_LIMIT,
    Request,
    RunFigures,
    audio_seconds,
    codes_per_audio_second,
    spread,
)

log = get_logger(__name__)

SCHEMA = "chattts-forge/bench/1"
DEFAULT_STEPS = BENCH_STEPS  # 9 s of audio at 24 kHz, hop 256
DEFAULT_TEXT = BENCH_TEXT  # the report's memory figures synthesize the same (runtime.memory_probe)


# ------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------


def _summarize(runs: list[RunFigures], batch: int, first_audio: list[float]) -> dict[str, Any]:
    pooled = lambda f: [x for r in runs for x in f(r)]  # noqa: E731 - tiny local helper
    out: dict[str, Any] = {
        "batch": batch,
        "steps": int(np.median([r.steps for r in runs])),
        "gpt_step_ms": spread(pooled(lambda r: r.gpt_step_ms)),
        "gpt_step_ms_ctx400": spread(pooled(lambda r: r.gpt_step_ms_ctx400)),
        "full_step_ms": spread(pooled(lambda r: r.full_step_ms)),
        "prefill_ms": spread([r.prefill_ms for r in runs]),
        "code_stage_s": spread([r.code_stage_s for r in runs]),
        "code_rtf": spread([r.code_rtf for r in runs]),
        "e2e_s": spread([r.e2e_s for r in runs]),
        "e2e_rtf": spread([r.e2e_rtf for r in runs]),
        "aggregate_rtf_per_stream": spread([r.aggregate_rtf for r in runs]),
        "streams": spread([r.streams for r in runs]),
        "code_streams": spread([r.code_streams for r in runs]),
    }
    if first_audio:
        out["first_audio_s"] = spread(first_audio)
    return out


# figures where smaller is better (ratio = onnx / pytorch < 1 means faster than the baseline)
RATIO_KEYS = (
    "gpt_step_ms",
    "gpt_step_ms_ctx400",
    "full_step_ms",
    "prefill_ms",
    "code_stage_s",
    "code_rtf",
    "e2e_s",
    "e2e_rtf",
    "aggregate_rtf_per_stream",
    "first_audio_s",
)
# figures where larger is better (ratio = onnx / pytorch > 1 means more than the baseline)
RATIO_KEYS_HIGHER = ("streams", "code_streams")


def _ratios(onnx: dict[str, Any], torch: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS + RATIO_KEYS_HIGHER:
        a = (onnx.get(key) or {}).get("median")
        b = (torch.get(key) or {}).get("median")
        out[key] = float(a / b) if a is not None and b not in (None, 0) else None
    return out


def _goals(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def med(batch: int, key: str) -> float | None:
        return ((res.get(str(batch)) or {}).get(key) or {}).get("median")

    goals = {
        "code_rtf_b1": {"target": 0.5, "value": med(1, "code_rtf")},
        "gpt_step_ms_ctx400_b1": {"target": 15.0, "value": med(1, "gpt_step_ms_ctx400")},
        "streams_b8": {"target": 8.0, "value": med(8, "streams"), "higher_is_better": True},
        "first_audio_s_b1": {"target": 0.5, "value": med(1, "first_audio_s")},
    }
    for g in goals.values():
        v = g["value"]
        g["met"] = None if v is None else (v >= g["target"] if g.get("higher_is_better") else v <= g["target"])
    return goals


def default_checkpoint(artifact: Path) -> Path | None:
    try:
        meta = ArtifactMeta.load(artifact)
    except ForgeError:
        return None
    src = (meta.source or {}).get("asset_dir")
    if not src:
        return None

    path = recorded_path(src, artifact)  # relative to the artifact folder
    return path if path.is_dir() else None


@dataclass(frozen=True)
class BenchConfig:
    """What `chattts-forge bench` measures (one field per option of the plain benchmark).

    `baseline`: "pytorch" also runs ChatTTS's PyTorch FP32 on `checkpoint` (default: the artifact's
    recorded source folder), on the torch device `baseline_device` (cpu, cuda); `stream_lookahead`: mel
    frames of right context the runtime's stream waits for before emitting ("exact": the receptive field;
    None: the artifact's recorded look-ahead, exact when it has none; see `Pipeline.resolve_lookahead`); `provider`: the runtime's onnxruntime provider (cpu, cuda, auto: see
    runtime.providers)."""

    baseline: str | None = None
    checkpoint: str | os.PathLike[str] | None = None
    batches: Sequence[int] = (1, 4, 8)
    steps: int = DEFAULT_STEPS
    threads: int = 2
    reps: int = 3
    warmup_steps: int = 16
    engine: str = "auto"
    text: str = DEFAULT_TEXT
    first_audio: bool = True
    stream_lookahead: int | str | None = None
    provider: str = "cpu"
    baseline_device: str = "cpu"


def checked_config(art: Path, cfg: BenchConfig, chat: Any = None) -> tuple[BenchConfig, Path | None]:
    """`cfg` checked and normalised (baseline None or "pytorch", provider resolved, batch sizes sorted),
    and the checkpoint of the PyTorch baseline (None without one): every refusal before any work."""
    ArtifactMeta.load(art)  # a folder that is not an artifact fails here, before anything is timed
    if cfg.baseline not in (None, "none", "pytorch"):
        raise BadInput(f"unknown baseline '{cfg.baseline}' (pytorch or none)")
    check_engine(cfg.engine)
    if cfg.baseline_device not in ("cpu", "cuda"):
        raise BadInput(f"unknown baseline device '{cfg.baseline_device}' (cpu or cuda)")
    provider = resolve_provider(cfg.provider)  # `cuda` without a usable GPU fails here, before any work
    batches = sorted({int(b) for b in cfg.batches})
    if not batches or batches[0] < 1:
        raise BadInput("batch sizes must be >= 1")
    if cfg.steps < 2:
        raise BadInput("--steps must be >= 2")
    if cfg.reps < 1:
        raise BadInput("--reps must be >= 1")
    if cfg.threads < 1:
        raise BadInput("--threads must be >= 1")
    if not cfg.text.strip():
        raise BadInput("empty benchmark text")
    cfg = replace(cfg, baseline=None if cfg.baseline == "none" else cfg.baseline, provider=provider, batches=batches)
    ckpt: Path | None = None
    if cfg.baseline == "pytorch":
        ckpt = Path(cfg.checkpoint).expanduser() if cfg.checkpoint is not None else default_checkpoint(art)
        if ckpt is None and chat is not None:
            ckpt = Path(str(getattr(chat, "forge_asset_dir", "<given Chat>")))
        if ckpt is None:
            raise BadInput("the pytorch baseline needs --checkpoint (the artifact records no existing source folder)")
    return cfg, ckpt


def run_bench(
    artifact: str | os.PathLike[str],
    config: BenchConfig | None = None,
    *,
    json_out: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    chat: Any = None,
    **knobs: Any,
) -> dict[str, Any]:
    """Benchmark `artifact` (and ChatTTS's PyTorch FP32 when `config.baseline="pytorch"`).

    `knobs`: fields of `BenchConfig` that replace `config`'s (`run_bench(art, steps=8)`). `chat`: an
    already loaded ChatTTS `Chat` of the checkpoint to use as the baseline (library use; it is left
    as it was). Returns the report dict (documented in docs/bench.md) and writes it to `json_out` if
    given.
    """
    art = Path(artifact).expanduser()
    cfg, ckpt = checked_config(art, replace(config or BenchConfig(), **knobs), chat)
    say = progress or (lambda msg: log.info("%s", msg))
    measured = _measure(art, cfg, ckpt, chat, say)
    report = _report(art, cfg, ckpt, measured)
    if json_out is not None:
        atomic_write_json(json_out, report)
        log.info("wrote %s", json_out)
    return report


@dataclass
class _Measured:
    """What the timed runs of `_measure` leave for the report."""

    onnx_engine: Any
    runs: dict[str, dict[int, list[RunFigures]]]
    firsts: dict[str, list[float]]
    rss_method: str
    base_rss: int
    onnx_loaded: int
    torch_loaded: int | None
    peaks: dict[str, int]
    process_peak: int


def _measure(art: Path, cfg: BenchConfig, ckpt: Path | None, chat: Any, say: Callable[[str], None]) -> _Measured:
    """Load the engines (each warmed up), then the timed runs, interleaved (onnx, pytorch, ...) per
    repetition and batch size, with the peak RSS of every phase."""
    steps, batches, text = cfg.steps, list(cfg.batches), cfg.text
    timed = Request.fixed_steps(steps)
    warm = Request.fixed_steps(min(cfg.warmup_steps, steps))
    engines: list[Any] = []
    try:
        with RssSampler() as rss:
            base_rss = rss.rss()
            with rss.during("onnx_load"):
                onnx_engine = OnnxEngine(art, cfg.threads, cfg.engine, cfg.stream_lookahead, provider=cfg.provider)
                engines.append(onnx_engine)
                onnx_engine.run([text], warm)
            onnx_loaded = rss.rss()
            torch_loaded = None
            if ckpt is not None:
                # The runtime's own peak per batch size, before torch shares the process (RSS is
                # per process: once the PyTorch model is loaded, every figure would include it).
                for b in batches:
                    say(f"runtime memory alone: batch {b}, {steps} steps")
                    gc.collect()
                    with rss.during(f"onnx:{b}"):
                        onnx_engine.run([text] * b, timed)
                from chattts_forge.torch_ref.engine import TorchEngine

                with rss.during("pytorch_load"):
                    torch_engine = TorchEngine(ckpt, cfg.threads, chat=chat, device=cfg.baseline_device)
                    engines.append(torch_engine)
                    torch_engine.run([text], warm)
                torch_loaded = rss.rss()
            runs: dict[str, dict[int, list[RunFigures]]] = {e.name: {b: [] for b in batches} for e in engines}
            firsts: dict[str, list[float]] = {e.name: [] for e in engines}
            for rep in range(cfg.reps):
                for b in batches:
                    for eng in engines:  # interleaved: both engines see the same machine load
                        say(f"rep {rep + 1}/{cfg.reps}: {eng.name} batch {b}, {steps} steps")
                        gc.collect()
                        # without a baseline the timed runs give the runtime's per-batch peaks
                        phase = f"onnx:{b}" if eng.name == "onnx" and ckpt is None else eng.name
                        with rss.during(phase):
                            runs[eng.name][b].append(eng.run([text] * b, timed))
                if cfg.first_audio and 1 in batches:
                    for eng in engines:
                        say(f"rep {rep + 1}/{cfg.reps}: {eng.name} first audio (streaming)")
                        with rss.during(eng.name):
                            firsts[eng.name].append(eng.first_audio(text, timed))
            peaks = dict(rss.peaks)
            process_peak = rss.peak_process()
    finally:
        for eng in engines:
            if eng.name == "pytorch":  # the timing hooks come off a Chat the caller may share
                eng.close()
    return _Measured(onnx_engine, runs, firsts, rss.method, base_rss, onnx_loaded, torch_loaded, peaks, process_peak)


def _memory(m: _Measured, batches: Sequence[int]) -> dict[str, Any]:
    mb = 1 / (1 << 20)
    peaks = m.peaks
    memory: dict[str, Any] = {
        "method": m.rss_method,
        "process_start_rss_mb": m.base_rss * mb,
        "process_peak_rss_mb": m.process_peak * mb if m.process_peak else None,
        "onnx": {
            "load_rss_mb": (m.onnx_loaded - m.base_rss) * mb,
            "peak_rss_mb": max(peaks.get("onnx", 0), peaks.get("onnx_load", 0),
                               *(peaks.get(f"onnx:{b}", 0) for b in batches)) * mb,
            # per batch size, measured before any PyTorch model shared the process
            "peak_rss_mb_by_batch": {str(b): peaks.get(f"onnx:{b}", 0) * mb for b in batches},
        },
    }
    if m.torch_loaded is not None:
        memory["pytorch"] = {
            "load_rss_mb": (m.torch_loaded - m.onnx_loaded) * mb,
            "peak_rss_mb": max(peaks.get("pytorch", 0), peaks.get("pytorch_load", 0)) * mb,
        }
        memory["ratio_load_rss"] = memory["onnx"]["load_rss_mb"] / memory["pytorch"]["load_rss_mb"] if memory["pytorch"]["load_rss_mb"] > 0 else None
    return memory


def _report(art: Path, cfg: BenchConfig, ckpt: Path | None, m: _Measured) -> dict[str, Any]:
    from chattts_forge.versions import library_versions, toolchain_info

    batches, steps, onnx_engine = list(cfg.batches), cfg.steps, m.onnx_engine
    results: dict[str, dict[str, Any]] = {}
    for name, per_batch in m.runs.items():
        results[name] = {
            str(b): _summarize(rs, b, m.firsts[name] if b == 1 else []) for b, rs in per_batch.items()
        }
    ratios = None
    if "pytorch" in results:
        ratios = {str(b): _ratios(results["onnx"][str(b)], results["pytorch"][str(b)]) for b in batches}
    meta = onnx_engine.pipe.artifact.meta
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifact": {
            "path": str(art),
            "variant": meta.variant,
            "gpt_engine": onnx_engine.gpt_engine,
            "gpt_precision": meta.components.get(FAST_GPT if onnx_engine.gpt_engine == "fast" else GPT, {}).get("precision"),
        },
        "baseline": None if ckpt is None else {"kind": "pytorch", "engine": "ChatTTS Chat (PyTorch FP32)", "checkpoint": str(ckpt)},
        "settings": {
            "steps": steps,
            "audio_seconds": audio_seconds(steps, onnx_engine.sample_rate, onnx_engine.hop_length),
            "steps_per_audio_second": codes_per_audio_second(onnx_engine.sample_rate, onnx_engine.hop_length),
            "batches": batches,
            "threads": cfg.threads,
            "inter_op_threads": 1,
            "provider": cfg.provider,
            "baseline_device": cfg.baseline_device if ckpt is not None else None,
            "reps": cfg.reps,
            "warmup_steps": min(cfg.warmup_steps, steps),
            "text": cfg.text,
            "context_limit": CONTEXT_LIMIT,
            "stream_lookahead_frames": onnx_engine.stream_lookahead,  # null: exact streaming
            "stream_exact_lookahead_frames": onnx_engine.pipe.decoder_radius + onnx_engine.pipe.vocos_radius,
            "order": "interleaved per repetition and batch: onnx then pytorch",
        },
        "machine": {**machine_info(cfg.threads, cfg.provider), **host_speed_info()},
        "results": results,
        "ratios": ratios,
        "memory": _memory(m, batches),
        "goals": _goals(results["onnx"]),
        "versions": library_versions(),
        "toolchain": toolchain_info(),
    }
    report["cost_model"] = _cost_model(art, report, onnx_engine, cfg.text, steps)
    return report


def _cost_model(art: Path, report: dict[str, Any], onnx_engine: Any, text: str, steps: int) -> dict[str, Any]:
    """The batch-1 GPT step against its bandwidth floor (runtime.costmodel), at the mean context of
    the bench's decode steps (prompt ~ text characters + 8, plus half the steps)."""
    bandwidth = report["machine"]["read_bandwidth"]["gb_per_s"]
    b1 = report["results"]["onnx"].get("1") or {}
    step = (b1.get("gpt_step_ms") or {}).get("median")
    graph = FAST_GPT if onnx_engine.gpt_engine == "fast" else GPT
    return {**cost_report(art, len(text) + 8 + steps // 2, bandwidth, step, graph),
            "definition": "bytes per batch-1 decode step (GPT graph + head_code files, KV cache at the context) / "
                          "measured read bandwidth (machine.read_bandwidth)"}


# ------------------------------------------------------------------------------------------------
# Text table
# ------------------------------------------------------------------------------------------------


def _fmt(stat: dict[str, Any] | None, digits: int = 2) -> str:
    if not stat or stat.get("median") is None:
        return "-"
    return f"{stat['median']:.{digits}f} [{stat['p10']:.{digits}f}-{stat['p90']:.{digits}f}]"


ROWS = (
    ("gpt_step_ms", "GPT step (ms)", 2),
    ("gpt_step_ms_ctx400", "GPT step ctx<=400 (ms)", 2),
    ("full_step_ms", "full step (ms)", 2),
    ("prefill_ms", "prefill (ms)", 1),
    ("code_rtf", "code-stage RTF", 3),
    ("e2e_rtf", "end-to-end RTF", 3),
    ("streams", "real-time streams", 2),
    ("first_audio_s", "first audio (s)", 3),
)


def format_table(report: dict[str, Any]) -> str:
    """A readable table: median [p10-p90] per engine and batch, and the ONNX/PyTorch ratio."""
    res = report["results"]
    lines = [
        f"artifact {report['artifact']['path']} ({report['artifact']['variant']}, GPT engine "
        f"{report['artifact']['gpt_engine']}), {report['settings']['steps']} steps = "
        f"{report['settings']['audio_seconds']:.2f} s audio, {report['settings']['threads']} threads, "
        f"{report['settings']['reps']} reps"
    ]
    for b in report["settings"]["batches"]:
        lines.append(f"\nbatch {b}")
        header = f"  {'figure':24s} {'onnx':>26s}"
        if "pytorch" in res:
            header += f" {'pytorch':>26s} {'onnx/pytorch':>12s}"
        lines.append(header)
        for key, label, d in ROWS:
            o = res["onnx"][str(b)].get(key)
            if o is None:
                continue
            row = f"  {label:24s} {_fmt(o, d):>26s}"
            if "pytorch" in res:
                r = (report["ratios"] or {}).get(str(b), {}).get(key)
                ratio = "-" if r is None else f"{r:.3f}"
                row += f" {_fmt(res['pytorch'][str(b)].get(key), d):>26s} {ratio:>12s}"
            lines.append(row)
    mem = report["memory"]
    line = f"\nmemory: onnx +{mem['onnx']['load_rss_mb']:.0f} MB loaded"
    if "pytorch" in mem:
        line += f", pytorch +{mem['pytorch']['load_rss_mb']:.0f} MB loaded"
    if mem.get("process_peak_rss_mb"):
        line += f"; process peak RSS {mem['process_peak_rss_mb']:.0f} MB"
    lines.append(line)
    parts = []
    for k, g in report["goals"].items():
        value = "-" if g["value"] is None else f"{g['value']:.3g}"
        verdict = "n/a" if g["met"] is None else "met" if g["met"] else "missed"
        parts.append(f"{k} {value} (target {g['target']:g}: {verdict})")
    goal_txt = ", ".join(parts)
    lines.append(f"goals: {goal_txt}")
    return "\n".join(lines)
