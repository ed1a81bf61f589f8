"""Where INT8 loses fidelity on the fused GPT graph: weights vs activations, simulated vs real kernels.

    python docs/measurements/2026-12-01-epyc/int8_decomposition.py FP32_ARTIFACT CALIBRATION WORK [--json OUT]

Builds variants of the FP32 artifact's `gpt_fast.onnx` (every projection MatMul treated alike) and
measures each with the runtime's fused step, teacher-forced on the FP32 trajectories of 8 held-out
sentences x 48 steps, through the FP32 code head (so only the GPT differs):

- `fake_*`: FP32 graphs with the rounding simulated (weights replaced by their dequantized values;
  activations through QuantizeLinear/DequantizeLinear or DynamicQuantizeLinear/DequantizeLinear),
  which isolates the number format from the kernel;
- `real_*`: the integer kernels onnxruntime runs (QDQ -> MatMulIntegerToFloat for static scales,
  DynamicQuantizeMatMul for run-time ones).

Weight formats: `pc8`/`pc7` symmetric per output channel, 8 or 7 bits; `pt8` one scale per packed
MatMul; `pp8` one scale per projection (q, k, v; gate, up), which is what `quantize_dynamic` does
on the unpacked plain graph and what `auto`'s INT8 uses. A benchmark script, not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.calibration_data.corpus import load_corpus
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.quantize.dynamic_fused import insert_dynamic_int8, projection_sizes
from chattts_forge.quantize.fidelity import (
    code_metrics,
    cosine_rows,
    fast_step,
    make_session,
    record_trajectories,
    replay,
)
from chattts_forge.quantize.static_fused import (
    activation_qparams,
    const_weight_matmuls,
    fused_feeds,
    insert_qdq,
    record_ranges,
)


def fake_weight(w: np.ndarray, fmt: str, sizes: list[int]) -> np.ndarray:
    if fmt in ("pc8", "pc7"):
        qmax = 127 if fmt == "pc8" else 63
        s = np.abs(w).max(0) / qmax
    elif fmt == "pt8":
        qmax, s = 127, np.abs(w).max() / 127
    else:  # pp8
        qmax = 127
        s = np.concatenate([np.full(p.shape[1], np.abs(p).max() / 127) for p in np.split(w, np.cumsum(sizes)[:-1], 1)])
    return (np.clip(np.rint(w / s), -qmax, qmax) * s).astype(np.float32)


def fake_graph(src: Path, weights: str | None, activations: str | None,
               ranges: dict[str, tuple[float, float]]) -> onnx.ModelProto:
    model = onnx.load(str(src))
    targets = {n.name: n for n in const_weight_matmuls(model)}
    inits = {i.name: i for i in model.graph.initializer}
    if weights:
        for node in targets.values():
            w = numpy_helper.to_array(inits[node.input[1]])
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(
                fake_weight(w, weights, projection_sizes(model, node, w.shape[1])), node.input[1]))
    if activations:
        new, done = [], {}
        for node in model.graph.node:
            if node.name in targets:
                x = node.input[0]
                if x not in done:
                    if activations == "dynamic":
                        new.append(helper.make_node("DynamicQuantizeLinear", [x], [x + "_q", x + "_s", x + "_z"]))
                    else:
                        scale, zp = activation_qparams(*ranges[x], "uint8")
                        model.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), x + "_s"),
                                                        numpy_helper.from_array(zp, x + "_z")])
                        new.append(helper.make_node("QuantizeLinear", [x, x + "_s", x + "_z"], [x + "_q"]))
                    new.append(helper.make_node("DequantizeLinear", [x + "_q", x + "_s", x + "_z"], [x + "_dq"]))
                    done[x] = x + "_dq"
                node.input[0] = done[x]
            new.append(node)
        model.graph.ClearField("node")
        model.graph.node.extend(new)
    return model


def real_dynamic(src: Path, weights: str) -> onnx.ModelProto:
    model = onnx.load(str(src))
    names = [n.name for n in const_weight_matmuls(model)]
    if weights == "pp8":
        insert_dynamic_int8(model, names)
        return model
    # pc8 / pc7 / pt8: the same kernel with other weight scales
    inits = {i.name: i for i in model.graph.initializer}
    for node in list(model.graph.node):
        if node.name not in names:
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        qmax = 63 if weights == "pc7" else 127
        s = (np.abs(w).max(0) if weights != "pt8" else np.full(w.shape[1], np.abs(w).max())) / qmax
        base = node.input[1] + "_exp"
        model.graph.initializer.extend([
            numpy_helper.from_array(np.clip(np.rint(w / s), -qmax, qmax).astype(np.int8), base + "_q"),
            numpy_helper.from_array(s.astype(np.float32), base + "_s"),
            numpy_helper.from_array(np.zeros(w.shape[1], np.int8), base + "_z")])
        node.CopyFrom(helper.make_node("DynamicQuantizeMatMul", [node.input[0], base + "_q", base + "_s", base + "_z"],
                                       list(node.output), name=node.name, domain="com.microsoft"))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fp32", type=Path)
    ap.add_argument("calibration", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    src = args.fp32 / "gpt_fast.onnx"
    args.work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src), load_external_data=False)
    tensors = sorted({n.input[0] for n in const_weight_matmuls(model)})
    del model
    feeds = fused_feeds(CalibrationStore(args.calibration).iter_samples("gpt"))
    ranges, _ = record_ranges(src, tensors, feeds, threads=2)
    trajs = record_trajectories(args.fp32, load_corpus("builtin:evaluation"), 8, 48, 0, 2)
    head = make_session(ArtifactMeta.load(args.fp32).component_file(args.fp32, "head_code"), 2)

    def static_real(bits: int) -> onnx.ModelProto:
        m = onnx.load(str(src))
        insert_qdq(m, ranges, [n.name for n in const_weight_matmuls(m)], "uint8", reduce_range=bits == 7)
        return m

    variants: dict[str, Callable[[], onnx.ModelProto]] = {
        "fake weights pc8": lambda: fake_graph(src, "pc8", None, ranges),
        "fake weights pt8": lambda: fake_graph(src, "pt8", None, ranges),
        "fake weights pc7": lambda: fake_graph(src, "pc7", None, ranges),
        "fake weights pc8 + dynamic activations": lambda: fake_graph(src, "pc8", "dynamic", ranges),
        "fake weights pt8 + dynamic activations": lambda: fake_graph(src, "pt8", "dynamic", ranges),
        "fake weights pc8 + static activations (minmax)": lambda: fake_graph(src, "pc8", "static", ranges),
        "fake weights pc7 + static activations (minmax)": lambda: fake_graph(src, "pc7", "static", ranges),
        "real static QDQ, weights pc7 (--method static)": lambda: static_real(7),
        "real static QDQ, weights pc8": lambda: static_real(8),
        "real DynamicQuantizeMatMul, weights pc8": lambda: real_dynamic(src, "pc8"),
        "real DynamicQuantizeMatMul, weights pc7": lambda: real_dynamic(src, "pc7"),
        "real DynamicQuantizeMatMul, weights pt8": lambda: real_dynamic(src, "pt8"),
        "real DynamicQuantizeMatMul, weights pp8 (auto's INT8 = --method dynamic)": lambda: real_dynamic(src, "pp8"),
    }
    rows = []
    for label, build in variants.items():
        folder = args.work / "variant"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        for f in args.fp32.iterdir():  # the FP32 artifact with only gpt_fast.onnx replaced
            if f.name != "gpt_fast.onnx":
                (folder / f.name).symlink_to(f.resolve())
        onnx.save(build(), str(folder / "gpt_fast.onnx"))
        ref, got, cos = [], [], []
        for t in trajs:
            hidden, logits = replay(fast_step(folder, 2), head, t)
            ref += list(t.logits)
            got += logits
            cos.append(cosine_rows(np.stack(t.hidden, 1), np.stack(hidden, 1)).ravel())
        agreement = code_metrics(ref, got)["top1_agreement"]
        row = {"variant": label, "agreement": round(agreement["mean"], 4),
               "agreement_min_stream": round(agreement["min_stream"], 4),
               "hidden_cosine": round(float(np.concatenate(cos).mean()), 5)}
        rows.append(row)
        print(f"| {label} | {row['agreement']:.4f} | {row['agreement_min_stream']:.4f} | {row['hidden_cosine']:.5f} |",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return None


if __name__ == "__main__":
    sys.exit(main())
