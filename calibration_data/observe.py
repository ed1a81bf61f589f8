"""Observer sessions: a graph run with the activation inputs of its constant-weight MatMuls as outputs.

`calibrate` folds these outputs into `statistics.Statistics` as they come (the graphs are the FP32
artifact's own files, the ones `quantize` reads, so the tensor names match). The fused
`gpt_fast.onnx` takes other inputs than the plain gpt.onnx the runtime records: `fused_feed` turns a
recorded plain-graph feed into the fused graph's (as `runtime.fast_gpt.FastGptStep` binds it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from chattts_forge.errors import ForgeError
from chattts_forge.runtime.fast_gpt import MASK_BIAS


def const_weight_matmuls(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMul nodes whose second input is a 2-D float initializer (the projections)."""
    inits = {i.name: i for i in model.graph.initializer}
    return [
        n for n in model.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2
        and inits[n.input[1]].data_type == TensorProto.FLOAT
    ]


def fused_feed(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The fused graph's feed for one recorded plain-graph sample (what FastGptStep binds, with the
    past in the first cache slots instead of bound buffers)."""
    emb, mask, pos = sample["inputs_embeds"], sample["attention_mask"], sample["position_ids"]
    batch, new, _ = emb.shape
    total = mask.shape[1]
    causal = np.tri(new, total, k=total - new, dtype=bool)
    bias = np.where(causal[None] & mask.astype(bool)[:, None, :], np.float32(0), MASK_BIAS)[:, None]
    feed = {
        "inputs_embeds": np.ascontiguousarray(emb, dtype=np.float32),
        "position_ids": np.ascontiguousarray(pos, dtype=np.int64),
        "attention_bias": np.ascontiguousarray(bias, dtype=np.float32),
        "seqlens_k": np.full((batch,), total - 1, dtype=np.int32),
        "total_sequence_length": np.array(total, dtype=np.int32),
    }
    for name, past in sample.items():
        if name.startswith("past_key_values."):
            buf = np.zeros(past.shape[:2] + (total, past.shape[3]), dtype=np.float32)
            buf[:, :, : past.shape[2]] = past  # cache slot t holds mask column t, as in the runtime
            feed[name] = buf
    return feed


class Observer:
    """An onnxruntime session of `path` whose outputs are its projection MatMuls' activation inputs."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        # onnxruntime: only once a session is made here; 0.06 s to import
        import onnxruntime as ort

        self.path = path
        # Weights in external data stay on disk until the session maps them: the graph alone is loaded
        # (a full-size GPT's 750 MB would otherwise be held twice while the session is built).
        model = onnx.load(str(path), load_external_data=False)
        dims = {i.name: list(i.dims) for i in model.graph.initializer}
        self.widths = {n.input[0]: int(dims[n.input[1]][0]) for n in const_weight_matmuls(model)}  # input channels
        self.tensors = sorted(self.widths)
        self.inputs = [i.name for i in model.graph.input]
        del model.graph.output[:]
        model.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in self.tensors)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        opts.enable_cpu_mem_arena = False  # the arena would keep the largest prefill's activations
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
        blob = model.SerializeToString()
        del model
        self.session = ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])
        del blob
        release_freed_memory()

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.inputs if n not in feed]
        if missing:
            raise ForgeError(f"a recorded feed lacks {self.path.name} input(s) {missing}")
        outs = self.session.run(self.tensors, {n: feed[n] for n in self.inputs})
        return dict(zip(self.tensors, outs, strict=True))


def release_freed_memory() -> None:
    """Hand the protobuf copies freed above back to the OS (glibc keeps them in the heap otherwise)."""
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)
