"""A cost model beside the clock: bytes a decode step reads, and how fast this machine reads them.

A batch-1 GPT decode step reads every weight of the GPT graph and of the code head once, plus the
key/value cache of its context; at batch 1 it does little else, so `bytes_per_step / bandwidth` is
its floor (`floor_ms`). The model says how close a measured step is to that floor (bench JSON,
`cost_model`), and ranks variants when timings on a shared machine are too noisy to separate them.

- `bytes_per_step(artifact, context)`: the files of the GPT graph the runtime runs (gpt_fast.onnx
  when present, else gpt.onnx; with their `.data`) and of head_code.onnx, plus
  2 x layers x kv_heads x head_dim x context x the cache's bytes per value (int8 for kv8 graphs).
  File bytes stand for weight bytes: initializers are almost all of a graph file.
- `read_bandwidth()`: a numpy sum over a `BANDWIDTH_MB` array (far larger than the caches), one
  thread, the best of `BANDWIDTH_REPEATS`; cached per CPU model under the user cache like the
  autotune (runtime.autotune.user_cache_dir; atomic write, an unreadable cache is measured again).
  One thread: onnxruntime's 2 threads may read faster, so the floor is an upper bound of the truth.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, GPT, HEAD_CODE, ArtifactMeta
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.log import get_logger
from chattts_forge.runtime.autotune import user_cache_dir
from chattts_forge.runtime.machine import cpu_flags, cpu_model

log = get_logger(__name__)

BANDWIDTH_SCHEMA = "chattts-forge/bandwidth/1"
BANDWIDTH_MB = 256
BANDWIDTH_REPEATS = 5
_CACHE_DTYPE_BYTES = {1: 4, 3: 1, 2: 1, 10: 2}  # ONNX elem types: float, int8, uint8, float16


def _graph_bytes(folder: Path, meta: ArtifactMeta, component: str) -> int:
    path = meta.component_file(folder, component)
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def _cache_value_bytes(graph: Path) -> int:
    # onnx: only when a graph is read here; 1.2 s to import
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    for inp in model.graph.input:
        if inp.name.startswith("past_key_values."):
            return _CACHE_DTYPE_BYTES.get(inp.type.tensor_type.elem_type, 4)
    return 4


def bytes_per_step(artifact: str | Path, context: int, batch: int = 1, graph: str | None = None) -> dict[str, Any]:
    """Bytes one decode step of `artifact` reads at `context` cached positions (see module doc).
    `graph`: the GPT component the runtime runs (default: gpt_fast when the artifact has it)."""
    folder = Path(artifact)
    meta = ArtifactMeta.load(folder)
    dims = meta.dims or {}
    gpt = graph or (FAST_GPT if meta.has_component(FAST_GPT) else GPT)
    weights = _graph_bytes(folder, meta, gpt) + _graph_bytes(folder, meta, HEAD_CODE)
    value_bytes = _cache_value_bytes(meta.component_file(folder, gpt))
    kv = (2 * int(dims["num_hidden_layers"]) * batch * int(dims["num_key_value_heads"]) * (int(dims["hidden_size"]) // int(dims["num_attention_heads"]))
          * context * value_bytes)
    return {"graph": gpt, "weights_bytes": weights, "kv_cache_bytes": kv, "kv_value_bytes": value_bytes,
            "context": context, "batch": batch, "total_bytes": weights + kv}


def measure_read_bandwidth(mb: int = BANDWIDTH_MB, repeats: int = BANDWIDTH_REPEATS) -> dict[str, Any]:
    """This machine's read bandwidth by a numpy sum (one thread): best and median GB/s."""
    array = np.ones(mb * 2**20 // 8, dtype=np.float64)
    array.sum()  # first touch: page faults are not reading
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        array.sum()
        rates.append(array.nbytes / (time.perf_counter() - t0) / 1e9)
    return {"gb_per_s": round(max(rates), 2), "gb_per_s_median": round(float(np.median(rates)), 2),
            "method": f"numpy sum of a {mb} MiB float64 array, one thread, best of {repeats}"}


def read_bandwidth(use_cache: bool = True, cache_dir: Path | None = None,
                   measure: Callable[[], dict[str, Any]] = measure_read_bandwidth) -> dict[str, Any]:
    """`measure()` (the numpy sum), cached per CPU model (see the module docstring)."""
    key = {"schema": BANDWIDTH_SCHEMA, "cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "mb": BANDWIDTH_MB,
           "repeats": BANDWIDTH_REPEATS}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    path = (cache_dir or user_cache_dir().parent / "bandwidth") / f"{digest}.json"
    if use_cache and path.is_file():
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if cached.get("key") == key and isinstance(cached.get("gb_per_s"), int | float):
                return {**cached, "source": "cache"}
            raise ValueError("another key")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
            log.warning("bandwidth cache %s ignored (%s): measuring again", path, e)
    record = {**measure(), "key": key, "cpu_model": key["cpu_model"]}
    if use_cache:
        try:
            atomic_write_json(path, record)
        except OSError as e:
            log.warning("could not write the bandwidth cache %s (%s)", path, e)
    return {**record, "source": "measured"}


def floor_ms(total_bytes: int, gb_per_s: float) -> float:
    """Milliseconds to read `total_bytes` at `gb_per_s`: a step's floor."""
    return total_bytes / (gb_per_s * 1e9) * 1e3


def host_speed_info(use_cache: bool = True) -> dict[str, Any]:
    """What a speed figure needs to say about the machine beyond `machine.machine_info`: the CPU's
    SIMD flags and its measured read bandwidth."""
    return {"cpu_flags": cpu_flags(), "read_bandwidth": read_bandwidth(use_cache)}


def cost_report(artifact: str | Path, context: int, gb_per_s: float, step_ms: float | None,
                graph: str | None = None) -> dict[str, Any]:
    """A measured batch-1 step against its floor: bytes, floor ms and the measured/floor ratio."""
    read = bytes_per_step(artifact, context, 1, graph)
    floor = floor_ms(read["total_bytes"], gb_per_s)
    return {**read, "gb_per_s": gb_per_s, "floor_ms": round(floor, 4), "step_ms": step_ms,
            "ratio_to_floor": round(step_ms / floor, 3) if step_ms and floor > 0 else None}
