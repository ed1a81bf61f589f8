"""The plain GPT engine: `GptStep`, one forward of `gpt.onnx` with its key/value cache, and
`GptStepLike`, what a `Pipeline` needs of any GPT step.

`GptStep` is the single place where the GPT graph runs: it owns the key/value cache and turns
(inputs_embeds, attention_mask, position_ids) into the last hidden states. Any object with its
interface (`GptStepLike`: `reset(batch)`, `past_length`, `__call__`) can replace it on a `Pipeline`
(`pipe.gpt = step`; `runtime.fast_gpt.FastGptStep` is the other engine).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from chattts_forge.checkpoint.layout import Dims


class GptStepLike(Protocol):
    """What a `Pipeline` needs of its GPT step (`GptStep`, `fast_gpt.FastGptStep`, or a caller's own)."""

    def reset(self, batch: int) -> None: ...

    @property
    def past_length(self) -> int: ...

    def __call__(
        self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray
    ) -> np.ndarray: ...


class GptStep:
    """One forward of `gpt.onnx` with the key/value cache kept between calls."""

    def __init__(self, session: Any, dims: Dims) -> None:
        self.session = session
        self.num_layers = dims.num_hidden_layers
        self.kv_heads = dims.num_key_value_heads
        self.head_dim = dims.head_dim
        self.past: list[np.ndarray] = []
        self.output_names = ["last_hidden_state"] + [
            f"present.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")
        ]
        self.past_names = [
            f"past_key_values.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")
        ]

    def reset(self, batch: int) -> None:
        """Start a new sequence batch: an empty cache."""
        empty = np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=np.float32)
        self.past = [empty] * (2 * self.num_layers)

    @property
    def past_length(self) -> int:
        return int(self.past[0].shape[2]) if self.past else 0

    def __call__(
        self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray
    ) -> np.ndarray:
        """Hidden states [B, S, hidden] of the S new positions; `attention_mask` covers past + new."""
        feeds = {
            "inputs_embeds": np.ascontiguousarray(inputs_embeds, dtype=np.float32),
            "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
            "position_ids": np.ascontiguousarray(position_ids, dtype=np.int64),
        }
        feeds.update(zip(self.past_names, self.past, strict=True))
        outs = self.session.run(self.output_names, feeds)
        self.past = outs[1:]
        return outs[0]
