"""What creating an artifact's onnxruntime sessions costs, and what the levers buy (issue 36).

    python session_levers.py ARTIFACT [--rounds 5] [--threads 2]

For each graph the runtime opens at the first text (embed, gpt_fast, head_code, decoder, vocos), one
fresh session per round under each setting, the settings interleaved round by round (the machine's
drift falls on all of them alike): `default` (the runtime's options: ORT_ENABLE_ALL), `basic`
(ORT_ENABLE_BASIC), `saved` (the ORT_ENABLE_ALL graph saved once with `optimized_model_filepath`, then
loaded with optimizations off), `saved_prepacked` (the same with its prepacked weights saved too:
what runtime.saved_sessions does), `no_prepack` (session.disable_prepacking). Then all five default
sessions created one after another against five threads at once (does session creation run in
parallel?). Medians in seconds, JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort

from chattts_forge.artifact import ArtifactMeta

GRAPHS = ("embed", "gpt_fast", "head_code", "decoder", "vocos")


def options(threads: int, level: ort.GraphOptimizationLevel, **config: str) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    for k, v in config.items():
        opts.add_session_config_entry(k, v)
    return opts


def timed(path: Path, opts: ort.SessionOptions) -> float:
    t = time.perf_counter()
    ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    meta = ArtifactMeta.load(args.artifact)
    paths = {g: meta.component_path(args.artifact, g) for g in GRAPHS}
    work = Path(tempfile.mkdtemp(prefix="saved-opt-"))
    saved, packed = {}, {}
    for g, p in paths.items():
        for prepacked, into in ((False, saved), (True, packed)):
            name = f"{g}{'-packed' if prepacked else ''}.onnx"
            opts = options(args.threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
            opts.optimized_model_filepath = str(work / name)
            opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{name}.data")
            opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
            if prepacked:  # what runtime.saved_sessions saves
                opts.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
            ort.InferenceSession(str(p), sess_options=opts, providers=["CPUExecutionProvider"])
            into[g] = work / name
    settings = {
        "default": lambda g: timed(paths[g], options(args.threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)),
        "basic": lambda g: timed(paths[g], options(args.threads, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)),
        "saved": lambda g: timed(saved[g], options(args.threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)),
        "saved_prepacked": lambda g: timed(packed[g], options(args.threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)),
        "no_prepack": lambda g: timed(paths[g], options(args.threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                                         **{"session.disable_prepacking": "1"})),
    }
    got: dict[str, dict[str, list[float]]] = {s: {g: [] for g in GRAPHS} for s in settings}
    serial, parallel = [], []
    for _ in range(args.rounds):
        for s, fn in settings.items():
            for g in GRAPHS:
                got[s][g].append(fn(g))
        t = time.perf_counter()
        for g in GRAPHS:
            settings["default"](g)
        serial.append(time.perf_counter() - t)
        t = time.perf_counter()
        with ThreadPoolExecutor(len(GRAPHS)) as pool:
            list(pool.map(settings["default"], GRAPHS))
        parallel.append(time.perf_counter() - t)
    out = {s: {g: round(statistics.median(v), 3) for g, v in per.items()} for s, per in got.items()}
    for s in out:
        out[s]["sum"] = round(sum(out[s][g] for g in GRAPHS), 3)
    out["all_five_serial"] = round(statistics.median(serial), 3)
    out["all_five_in_threads"] = round(statistics.median(parallel), 3)
    out["saved_bytes"] = sum(f.stat().st_size for f in work.iterdir())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
