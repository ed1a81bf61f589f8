"""A quantized Decoder's MatMulNBits graph against the same graph with the weights unpacked to float
(runtime.float_weights): largest difference and time per call at stream-like windows (median of 5,
interleaved). Usage: python unpack_check.py DECODER_ONNX"""

import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

from chattts_forge.runtime.float_weights import float_matmuls

path = sys.argv[1]
model = onnx.load(path)
replaced = float_matmuls(model)
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
packed = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
unpacked = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
print(f"{replaced} MatMulNBits unpacked")
rng = np.random.default_rng(0)
for steps in (8, 17, 24, 100, 132, 300):
    x = rng.standard_normal((1, 768, steps)).astype(np.float32)
    a, b = packed.run(None, {"hidden_states": x})[0], unpacked.run(None, {"hidden_states": x})[0]
    ta, tb = [], []
    for _ in range(5):
        t = time.perf_counter()
        packed.run(None, {"hidden_states": x})
        ta.append(time.perf_counter() - t)
        t = time.perf_counter()
        unpacked.run(None, {"hidden_states": x})
        tb.append(time.perf_counter() - t)
    rel = float(np.abs(a - b).max() / np.abs(a).max())
    print(f"{steps:4d} steps: max |diff| / max |mel| {rel:.1e}; MatMulNBits {1000 * np.median(ta):6.1f} ms, "
          f"float {1000 * np.median(tb):6.1f} ms ({np.median(ta) / np.median(tb):.2f}x)")
