"""Where static INT8 loses agreement against dynamic INT8, on the fused GPT graph the runtime runs.

    python static_decomp.py FP32 CALIB OUT VARIANT[,VARIANT...]

Each variant is the FP32 gpt_fast.onnx with some of static INT8's roundings applied (fake-quant QDQ),
replayed teacher-forced on the same FP32 trajectories (8 held-out sentences x 48 steps, seed 0: the
quantize stage's default fidelity settings) with the FP32 code head, so only the GPT's roundings count.
"""

import fnmatch
import json
import pickle
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.calibration_data.observe import const_weight_matmuls
from chattts_forge.calibration_data.statistics import Statistics
from chattts_forge.quantize.dynamic_fused import projection_sizes, replace_nodes
from chattts_forge.quantize.fidelity import (
    code_metrics,
    cosine_rows,
    fast_step,
    make_session,
    record_trajectories,
    replay,
)
from chattts_forge.quantize.static_fused import activation_qparams, weight_int8_per_channel

fp32, calib, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
variants = sys.argv[4].split(",")
out.mkdir(parents=True, exist_ok=True)
traj_file = out / "trajectories.pkl"
if traj_file.exists():
    trajs = pickle.loads(traj_file.read_bytes())
else:
    t0 = time.perf_counter()
    trajs = record_trajectories(fp32, load_corpus("builtin:evaluation"), 8, 48, 0, 2)
    traj_file.write_bytes(pickle.dumps(trajs))
    print(f"trajectories: {len(trajs)} in {time.perf_counter() - t0:.0f} s", flush=True)

stats = Statistics.load(calib / "statistics.npz")
tensors = stats.tensors("gpt_fast")
meta = ArtifactMeta.load(fp32)
head = make_session(fp32 / "head_code.onnx", 2)


def build(spec: str) -> onnx.ModelProto:
    """spec: "+"-joined w7 | w8 (per-channel weights) | w8t (per-tensor) and a (static) | d (dynamic activations), optional ':pXX' percentile
    ranges, ':sALPHA' SmoothQuant migration, ':only=GLOB' quantize just the matching MatMuls."""
    parts = spec.split(":")
    kind, opts = parts[0], dict((p[0], p[1:]) for p in parts[1:])
    toks = set(kind.split("+"))
    wbits = 7 if "w7" in toks else 8 if ("w8" in toks or "w8t" in toks or "w8p" in toks) else None
    per_tensor = "w8t" in toks
    per_projection = "w8p" in toks
    act = "a" in toks
    dyn = "d" in toks
    model = onnx.load(str(fp32 / "gpt_fast.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    targets = [n for n in const_weight_matmuls(model)]
    if "o" in opts:
        targets = [
            n
            for n in targets
            if fnmatch.fnmatchcase(n.name, opts["o"][4:] if opts["o"].startswith("nly=") else opts["o"])
        ]
    chosen = {n.name: n for n in targets}
    alpha = float(opts["s"]) if "s" in opts else None
    pct = float(opts["p"]) if "p" in opts else None
    new_nodes, done, dropped = [], {}, {}
    for node in model.graph.node:
        if node.name not in chosen:
            new_nodes.append(node)
            continue
        x, wname = node.input[0], node.input[1]
        w = numpy_helper.to_array(inits[wname]).astype(np.float32)
        st = tensors[x]
        s = None
        if alpha is not None and (
            "m" not in opts or any(fnmatch.fnmatchcase(node.name, g) for g in opts["m"].split("|"))
        ):
            wmax = np.maximum(np.abs(w).max(axis=1), 1e-8)
            amax = np.maximum(st.absmax.astype(np.float64), 1e-8)
            s = (amax**alpha / wmax ** (1 - alpha)).astype(np.float32)
            s = np.clip(s, 1e-4, 1e4)
            w = w * s[:, None]
        xin = x
        key = (x, None if s is None else node.name)
        if s is not None:
            inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{node.name}_smooth")
            model.graph.initializer.append(inv)
            xin = f"{node.name}_smoothed"
            new_nodes.append(helper.make_node("Mul", [x, inv.name], [xin], name=f"{node.name}_smooth_mul"))
        if act:
            if key not in done:
                if s is not None:
                    m = float((st.absmax / s).max())
                    if (
                        pct is not None
                    ):  # the unsmoothed tensor's clip share (no histogram of x/s is streamed)
                        m *= st.percentile_absmax(pct) / max(abs(st.min), abs(st.max))
                    lo, hi = -m, m
                elif pct is not None:
                    clip = st.percentile_absmax(pct)
                    lo, hi = max(st.min, -clip), min(st.max, clip)
                else:
                    lo, hi = st.min, st.max
                scale, zp = activation_qparams(lo, hi, "uint8")
                base = f"{node.name}_x"
                model.graph.initializer.extend(
                    [
                        numpy_helper.from_array(np.array(scale, np.float32), base + "_s"),
                        numpy_helper.from_array(zp, base + "_z"),
                    ]
                )
                new_nodes.append(
                    helper.make_node("QuantizeLinear", [xin, base + "_s", base + "_z"], [base + "_q"])
                )
                new_nodes.append(
                    helper.make_node(
                        "DequantizeLinear", [base + "_q", base + "_s", base + "_z"], [base + "_dq"]
                    )
                )
                done[key] = base + "_dq"
            xin = done[key]
        if dyn:
            if key not in done:
                base = f"{node.name}_x"
                new_nodes.append(
                    helper.make_node("DynamicQuantizeLinear", [xin], [base + "_q", base + "_s", base + "_z"])
                )
                new_nodes.append(
                    helper.make_node(
                        "DequantizeLinear", [base + "_q", base + "_s", base + "_z"], [base + "_dq"]
                    )
                )
                done[key] = base + "_dq"
            xin = done[key]
        if (
            per_projection
        ):  # one scale per projection packed in the weight (q, k, v; gate, up): --method dynamic
            sizes = projection_sizes(model, node, w.shape[1])
            ws = np.concatenate(
                [np.full(p.shape[1], np.abs(p).max() / 127) for p in np.split(w, np.cumsum(sizes)[:-1], 1)]
            ).astype(np.float32)
            w = (np.clip(np.rint(w / ws), -127, 127) * ws).astype(np.float32)
        elif per_tensor:
            ws = np.float32(np.abs(w).max() / 127)
            w = (np.clip(np.rint(w / ws), -127, 127) * ws).astype(np.float32)
        elif wbits is not None:
            qw, ws = weight_int8_per_channel(w, reduce_range=wbits == 7)
            w = (qw.astype(np.float32) * ws[None, :]).astype(np.float32)
        winit = numpy_helper.from_array(w, f"{wname}_{node.name}_fq")
        model.graph.initializer.append(winit)
        dropped[wname] = None
        new_nodes.append(helper.make_node("MatMul", [xin, winit.name], list(node.output), name=node.name))
    replace_nodes(model, new_nodes, dropped)
    return model


def folder_with(model: onnx.ModelProto, name: str) -> Path:
    d = out / name
    d.mkdir(exist_ok=True)
    for f in fp32.iterdir():  # copies: onnx refuses hard-linked external data, the runtime symbolic links
        if f.name.startswith("gpt_fast.onnx") or (d / f.name).exists():
            continue
        shutil.copy(f, d / f.name)
    onnx.save(model, str(d / "gpt_fast.onnx"), save_as_external_data=True, location="gpt_fast.onnx.data")
    return d


results = []
for spec in variants:
    t0 = time.perf_counter()
    if spec == "fp32":
        d = fp32
    else:
        model = build(spec)
        d = folder_with(model, spec.replace(":", "_").replace("*", "x").replace("=", ""))
        del model
    ref, q, cos = [], [], []
    for t in trajs:
        h, lg = replay(fast_step(d, 2, meta), head, t)
        ref += list(t.logits)
        q += lg
        cos.append(cosine_rows(np.stack(t.hidden, 1), np.stack(h, 1)))
    m = code_metrics(ref, q)
    row = {
        "variant": spec,
        "agreement": round(m["top1_agreement"]["mean"], 4),
        "kl": round(m["kl"]["mean"], 5),
        "cosine": round(float(np.concatenate(cos).mean()), 5),
        "steps": m["steps"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(row), flush=True)
    results.append(row)
    if d != fp32:
        shutil.rmtree(d)
with open(out / "results.jsonl", "a") as fh:
    for r in results:
        fh.write(json.dumps(r) + "\n")
