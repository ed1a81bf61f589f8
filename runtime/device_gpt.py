"""The plain GPT step with its key/value cache kept on the execution device (IO binding).

`GptStep` hands the cache to onnxruntime as numpy arrays and takes the `present.*` outputs back as
numpy: on CUDA that is a device -> host -> device round trip of the whole cache every step. Here the
`present.*` outputs are bound to the device and fed back as the next step's `past_key_values.*`
without leaving it; only the step's inputs (a few KB) go up and the last hidden states come down
(the heads and the sampler run on the host).

Used for `provider="cuda"` (the fused `gpt_fast` graph's GroupQueryAttention has no float32 CUDA
kernel, so on CUDA the `auto` engine takes this plain graph). The same code runs with
`device="cpu"`, which is how the tests check it against `GptStep` without a GPU.

Never imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chattts_forge.checkpoint.layout import Dims
from chattts_forge.errors import BadInput

DEVICES = ("cpu", "cuda")


class DeviceGptStep:
    """One forward of `gpt.onnx`; the cache lives on `device` as onnxruntime OrtValues."""

    def __init__(self, session: Any, dims: Dims, device: str = "cuda", device_id: int = 0) -> None:
        # onnxruntime: only once a session is made here; 0.06 s to import
        import onnxruntime as ort

        if device not in DEVICES:
            raise BadInput(f"unknown device '{device}' (choose from: {', '.join(DEVICES)})")
        self._ort = ort
        self.session = session
        self.device = device
        self.device_id = device_id
        self.num_layers = dims.num_hidden_layers
        self.kv_heads = dims.num_key_value_heads
        self.head_dim = dims.head_dim
        self.past_names = [f"past_key_values.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]
        self.present_names = [f"present.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]
        self._past: list[Any] = []
        self._past_length = 0

    def reset(self, batch: int) -> None:
        """Start a new sequence batch: an empty cache on the device."""
        if batch < 1:
            raise BadInput(f"batch must be >= 1, got {batch}")
        empty = np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=np.float32)
        value = self._ort.OrtValue.ortvalue_from_numpy(empty, self.device, self.device_id)
        self._past = [value] * (2 * self.num_layers)
        self._past_length = 0

    @property
    def past_length(self) -> int:
        return self._past_length

    def __call__(self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Hidden states [B, S, hidden] of the S new positions; `attention_mask` covers past + new."""
        if not self._past:
            raise BadInput("reset(batch) must be called before the first step")
        binding = self.session.io_binding()
        binding.bind_cpu_input("inputs_embeds", np.ascontiguousarray(inputs_embeds, dtype=np.float32))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(attention_mask, dtype=np.int64))
        binding.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids, dtype=np.int64))
        for name, value in zip(self.past_names, self._past, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("last_hidden_state", "cpu")
        for name in self.present_names:
            binding.bind_output(name, self.device, self.device_id)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        self._past = list(outputs[1:])
        self._past_length = int(attention_mask.shape[1])
        return outputs[0].numpy()

    step = __call__
