"""The Decoder's precision options against streaming exactness, time and size (full-size checkpoint).

    python docs/measurements/2026-12-02-epyc/decoder_options.py FP32_ARTIFACT OUT.json [--steps 422] [--reps 7]

For each option (FP32 graph; weight-only INT8 MatMulNBits at accuracy levels 4 (int8 activations),
1 (fp32 compute) and 0 (unset: the kernel's default)) it decodes the same GPT hidden states
whole and in the stream's windows (`StreamDecoder`'s window arithmetic: new frames plus the exact
radius of context) and reports the SNR of the windowed mel against the whole mel over the frames the
stream keeps, the same for the vocoded waveform, the Decoder's time for one whole call (interleaved
medians over `--reps` rounds), the graph's bytes, and its mel SNR against the FP32 graph.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from chattts_forge.quantize import decoder as qdec
from chattts_forge.runtime.pipeline import Pipeline, StreamDecoder, SynthParams
from chattts_forge.runtime.session import Artifact


def snr(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - test) ** 2))
    return 150.0 if noise == 0 else float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / noise))


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("fp32", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=422)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--text", default="The order you placed yesterday has shipped and should arrive on Friday.")
    args = ap.parse_args()
    art = Artifact(args.fp32, verify="size")
    pipe = Pipeline.from_artifact(art)
    params = SynthParams()
    params.code.max_new_token = args.steps
    params.code.seed = 0
    res = pipe.synthesize(args.text, params)[0]
    hid = res.hiddens  # [T, hidden]
    if len(hid) < args.steps:  # random weights may stop early: the timing is for --steps steps of audio
        hid = np.concatenate([hid] * -(-args.steps // len(hid)))[: args.steps]
    print(f"hidden states {hid.shape}", file=sys.stderr)
    src = args.fp32 / "decoder.onnx"
    options: dict[str, Path] = {"fp32": src}
    tmp = Path(tempfile.mkdtemp())
    print(f"decoder fp32 {src}, quantized copies in {tmp}", file=sys.stderr)
    for level in (4, 1, 0):
        qdec.ACCURACY_LEVEL = level
        dst = tmp / f"decoder-int8-acc{level}.onnx"
        qdec.quantize_decoder(src, dst)
        options[f"int8-acc{level}"] = dst
    sessions = {k: session(p) for k, p in options.items()}
    feed = {"hidden_states": np.ascontiguousarray(hid.T[None], np.float32)}
    whole = {k: s.run(["mel"], feed)[0][0] for k, s in sessions.items()}
    # the stream's windows: the decoder part of StreamDecoder.push, for pushes every 16 steps
    sd = StreamDecoder(pipe)
    rd = sd.rd
    n = len(hid)
    results = {}
    for k, s in sessions.items():
        mel_w = np.zeros_like(whole[k])
        covered = np.zeros(whole[k].shape[1], bool)
        for step_end in list(range(16, n, 16)) + [n]:
            frames = 2 * step_end
            fa = max(0, 2 * (step_end - 16) - sd.rv)
            fb = frames
            ta = max(0, (fa - rd) // 2)
            tb = min(step_end, -(-(fb + rd) // 2))
            mel = s.run(["mel"], {"hidden_states": np.ascontiguousarray(hid[ta:tb].T[None], np.float32)})[0][0]
            keep_hi = fb if step_end == n else max(fa, fb - rd)  # frames whose right context is complete
            keep_lo = fa
            mel_w[:, keep_lo:keep_hi] = mel[:, keep_lo - 2 * ta: keep_hi - 2 * ta]
            covered[keep_lo:keep_hi] = True
        ref = whole[k][:, covered]
        results[k] = {"stream_mel_snr_db": snr(ref, mel_w[:, covered]),
                      "stream_mel_max_abs": float(np.abs(ref - mel_w[:, covered]).max()),
                      "mel_snr_vs_fp32_db": snr(whole["fp32"], whole[k]),
                      "bytes": sum(p.stat().st_size for p in options[k].parent.glob(options[k].name + "*"))}
    # whole-call time, interleaved rounds
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(args.reps):
        for k, s in sessions.items():
            t = time.perf_counter()
            s.run(["mel"], feed)
            times[k].append(time.perf_counter() - t)
    for k in sessions:
        results[k]["decoder_ms_median"] = 1000 * float(np.median(times[k]))
        results[k]["ratio_to_fp32"] = float(np.median(times[k]) / np.median(times["fp32"]))
    out = {"steps": n, "reps": args.reps, "onnxruntime": ort.__version__, "options": results}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
