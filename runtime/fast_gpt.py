"""The fast GPT step: the fused `gpt_fast.onnx` graph driven with an in-place key/value cache.

`FastGptStep` is a drop-in replacement for `chattts_forge.runtime.gpt_step.GptStep` (same call
contract: `reset(batch)`, `past_length`, `step(inputs_embeds, attention_mask, position_ids)` ->
hidden states [B, S, hidden]). The graph (built by `chattts_forge.quantize.fast_gpt_graph`) uses
onnxruntime's GroupQueryAttention with past/present buffer sharing: every layer's key and value
cache is one preallocated buffer [B, kv_heads, capacity, head_dim] (float32, or int8 when the
graph was built with `kv_cache="int8"`: the op quantizes on write with the graph's calibrated
scales), bound with IO binding as both the past input and the present output, so each step writes
only its new position instead of copying the whole cache (the plain graph's `Concat` copies
~2 * L * B * H * T * D floats a step).

Memory follows need: the cache is allocated for what the caller `reserve`s (the pipeline reserves
prompt + max_new_token positions, see `reserve`) and grows geometrically beyond it, never to the
model's 4096 positions up front. `cache_bytes(batch, capacity)` is the formula.

ChatTTS's left padding is kept exactly: cache slot t holds mask column t; padded keys are masked by
an additive bias (the finite float32 minimum, as transformers does) and rotary positions come from
`position_ids`, so the hidden states of the valid positions equal the plain graph's (~1e-6).

Library use::

    from chattts_forge.runtime.fast_gpt import FastGptStep
    step = FastGptStep.from_artifact(artifact)          # a runtime.loaded_artifact.LoadedArtifact with gpt_fast
    step.reset(batch)
    h = step(inputs_embeds, attention_mask, position_ids)   # [B, S, hidden]

Never imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chattts_forge.artifact import FAST_GPT
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.runtime.heap import discard_pages

# transformers' additive mask value; finite so an all-masked (padding) query row stays finite.
MASK_BIAS = np.float32(np.finfo(np.float32).min)
# Capacities are rounded up to this many positions (fewer reallocations, aligned rows).
CAPACITY_QUANTUM = 64
# Capacity before anything was reserved (a caller that never reserves still starts small).
DEFAULT_CAPACITY = 256
# Positions reserved at most up front: longer requests grow into the rest only if they get there
# (ChatTTS's max_new_token is 2048, while most sentences end within a few hundred steps).
MAX_RESERVE = 1024
_CACHE_DTYPES = {"tensor(float)": np.float32, "tensor(int8)": np.int8}


class FastGptStep:
    """One forward of `gpt_fast.onnx`; owns the preallocated key/value buffers."""

    def __init__(
        self,
        session: Any,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        hidden_size: int,
        max_positions: int = 4096,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        # onnxruntime: only once a session is made here; 0.06 s to import
        import onnxruntime as ort

        self._ort = ort
        self.session = session
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.hidden_size = hidden_size
        self.max_positions = max_positions
        self.initial_capacity = max(1, min(capacity, max_positions))
        names = {i.name for i in session.get_inputs()}
        need = {"inputs_embeds", "position_ids", "attention_bias", "seqlens_k", "total_sequence_length"}
        if not need <= names:
            raise BadInput(f"not a fast GPT graph: inputs {sorted(need - names)} are missing")
        self.past_names = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
        cache_type = {i.name: i.type for i in session.get_inputs()}.get(self.past_names[0])
        if cache_type not in _CACHE_DTYPES:
            raise BadInput(f"fast GPT graph: unsupported KV cache type {cache_type} (float32 or int8)")
        self.cache_dtype = np.dtype(_CACHE_DTYPES[cache_type])
        self._reserved = 0  # positions the next reset allocates for (0: initial_capacity)
        self.present_names = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
        self.batch = 0
        self.capacity = 0
        self._past = 0
        self._buffers: list[np.ndarray] = []  # numpy views of the bound cache memory
        self._binding: Any = None

    @classmethod
    def from_artifact(cls, artifact: Any, capacity: int = DEFAULT_CAPACITY) -> FastGptStep:
        """Open the artifact's `gpt_fast` component (a `runtime.loaded_artifact.LoadedArtifact`)."""
        dims = artifact.dims
        return cls(
            artifact.session(FAST_GPT),
            dims.num_hidden_layers,
            dims.num_key_value_heads,
            dims.head_dim,
            dims.hidden_size,
            dims.max_position_embeddings,
            capacity,
        )

    # ---- cache management --------------------------------------------------------------------

    def cache_bytes(self, batch: int, capacity: int) -> int:
        """Bytes of the key/value buffers for `batch` rows of `capacity` positions."""
        return len(self.past_names) * batch * self.kv_heads * capacity * self.head_dim * self.cache_dtype.itemsize

    def reserve(self, positions: int) -> None:
        """Size the cache of the next `reset` for `positions` (prompt + max_new_token), capped at
        `MAX_RESERVE`: a request that runs longer grows the cache when it gets there."""
        self._reserved = max(1, min(positions, MAX_RESERVE, self.max_positions))

    def reset(self, batch: int) -> None:
        """Start a new sequence batch: an empty cache sized by the last `reserve` (buffers reused
        when the batch size is the same and they are no more than twice that size)."""
        if batch < 1:
            raise BadInput(f"batch must be >= 1, got {batch}")
        want = _round_up(self._reserved or self.initial_capacity, self.max_positions)
        if batch != self.batch or not self._buffers or not (want <= self.capacity <= 2 * want):
            self._buffers = []  # free the old cache before allocating the new one (peak memory)
            self._allocate(batch, want, keep=0)
        self._past = 0

    @property
    def past_length(self) -> int:
        return self._past

    def cache_buffer(self, past_name: str) -> np.ndarray:
        """The cache buffer bound as input `past_name` ([B, kv_heads, capacity, head_dim]; slots below
        `past_length` are valid): a read-only look, e.g. to observe a step as the plain graph's feed."""
        try:
            return self._buffers[self.past_names.index(past_name)]
        except ValueError:
            raise KeyError(past_name) from None

    def rewind(self, past: int) -> None:
        """Keep only the first `past` cached positions (a benchmark repeats one step at a fixed context)."""
        if not 0 <= past <= self._past:
            raise ForgeError(f"cannot rewind to {past} positions: {self._past} are cached")
        self._past = past

    def _allocate(self, batch: int, capacity: int, keep: int, rows: int | None = None) -> None:
        """(Re)allocate the cache buffers with `capacity` slots, keeping the first `keep` positions of
        the first `rows` rows (all rows by default: copying a free row would map its pages again)."""
        old = self._buffers
        self._buffers = [
            np.zeros((batch, self.kv_heads, capacity, self.head_dim), dtype=self.cache_dtype) for _ in self.past_names
        ]
        if keep:
            live = batch if rows is None else rows
            for new, prev in zip(self._buffers, old, strict=True):
                new[:live, :, :keep] = prev[:live, :, :keep]
        self.batch, self.capacity = batch, capacity
        binding = self.session.io_binding()
        binding.bind_output("last_hidden_state")  # output 0 (rebound by name every call)
        for buf, past_name, present_name in zip(self._buffers, self.past_names, self.present_names, strict=True):
            value = self._ort.OrtValue.ortvalue_from_numpy(buf)  # shares the numpy memory
            binding.bind_ortvalue_input(past_name, value)
            binding.bind_ortvalue_output(present_name, value)
        self._binding = binding

    def _ensure_capacity(self, total: int) -> None:
        if total <= self.capacity:
            return
        if total > self.max_positions:
            raise ForgeError(f"sequence of {total} positions exceeds the model's {self.max_positions}")
        grown = max(2 * self.capacity, _round_up(total, self.max_positions))
        self._allocate(self.batch, min(grown, self.max_positions), keep=self._past)

    # ---- the step -----------------------------------------------------------------------------

    def __call__(self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Hidden states [B, S, hidden] of the S new positions; `attention_mask` [B, past + S]."""
        batch, new, _ = inputs_embeds.shape
        total = attention_mask.shape[1]
        if batch != self.batch:
            raise ForgeError(f"batch {batch} given, the cache was reset for {self.batch}")
        if total != self._past + new:
            raise ForgeError(f"attention_mask covers {total} positions, expected past {self._past} + new {new}")
        self._ensure_capacity(total)
        keep = attention_mask.astype(bool, copy=False)
        if new == 1:
            bias = np.where(keep, np.float32(0), MASK_BIAS)[:, None, None, :]
        else:  # causal within the new positions, plus the padding mask
            causal = np.tri(new, total, k=total - new, dtype=bool)
            bias = np.where(causal[None] & keep[:, None, :], np.float32(0), MASK_BIAS)[:, None]
        b = self._binding
        b.bind_cpu_input("inputs_embeds", np.ascontiguousarray(inputs_embeds, dtype=np.float32))
        b.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids, dtype=np.int64))
        b.bind_cpu_input("attention_bias", np.ascontiguousarray(bias, dtype=np.float32))
        b.bind_cpu_input("seqlens_k", np.full((batch,), total - 1, dtype=np.int32))
        b.bind_cpu_input("total_sequence_length", np.array(total, dtype=np.int32))
        b.bind_output("last_hidden_state")
        self.session.run_with_iobinding(b)
        self._past = total
        return b.get_outputs()[0].numpy()

    # The plain GptStep is called as a function; keep a named alias for readability in loops.
    step = __call__

    # ---- ragged rows (continuous batching, runtime.scheduler) ---------------------------------
    # Each row holds its own sequence from slot 0 (no left padding), so rows of different lengths
    # share one decode step: GroupQueryAttention reads row b's first seqlens_k[b] + 1 slots. The
    # first `rows` batch slots are live; the caller keeps them compact (`move_row`).

    def open_rows(self, slots: int, capacity: int) -> None:
        """Allocate `slots` empty rows of `capacity` positions for ragged stepping."""
        self._buffers = []
        self._allocate(slots, _round_up(max(1, capacity), self.max_positions), keep=0)
        self._ragged_bindings: dict[int, Any] = {}
        self._past = 0

    def load_row(self, slot: int, source: FastGptStep, length: int) -> None:
        """Copy the first `length` positions of batch-1 `source`'s cache into row `slot` (rows below
        `slot` are live, the others free)."""
        self.ensure_rows_capacity(length, live=slot)
        for dst, src in zip(self._buffers, source._buffers, strict=True):
            dst[slot, :, :length] = src[0, :, :length]

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy row `src`'s first `length` positions into row `dst` (compaction after a row retires)."""
        for buf in self._buffers:
            buf[dst, :, :length] = buf[src, :, :length]

    def ensure_rows_capacity(self, total: int, live: int | None = None) -> None:
        """Grow every row to hold `total` positions, keeping all positions of the first `live` rows
        (of every row by default)."""
        if total > self.capacity:
            if total > self.max_positions:
                raise ForgeError(f"sequence of {total} positions exceeds the model's {self.max_positions}")
            grown = min(max(2 * self.capacity, _round_up(total, self.max_positions)), self.max_positions)
            self._allocate(self.batch, grown, keep=self.capacity, rows=live)
            self._ragged_bindings = {}

    def release_rows(self, start: int, stop: int | None = None) -> int:
        """Empty the free rows `start` to `stop` (to the last by default) and give their memory back to
        the kernel; the bytes given back. A row that joins later maps fresh pages as it fills."""
        freed = 0
        for buf in self._buffers:
            for row in range(start, self.batch if stop is None else min(stop, self.batch)):
                freed += discard_pages(buf[row])
        return freed

    def _rows_binding(self, start: int, stop: int) -> Any:
        binding = self._ragged_bindings.get((start, stop))
        if binding is None:  # views of slots [start, stop): C-contiguous, so bindable in place
            binding = self.session.io_binding()
            binding.bind_output("last_hidden_state")  # output 0 (rebound by name every call)
            for buf, past_name, present_name in zip(self._buffers, self.past_names, self.present_names, strict=True):
                value = self._ort.OrtValue.ortvalue_from_numpy(buf[start:stop])
                binding.bind_ortvalue_input(past_name, value)
                binding.bind_ortvalue_output(present_name, value)
            self._ragged_bindings[(start, stop)] = binding
        return binding

    def step_rows(self, inputs_embeds: np.ndarray, lengths: np.ndarray, start: int = 0) -> np.ndarray:
        """One new position for each of the `len(lengths)` rows from slot `start` (the first rows by
        default); `lengths[b]`: that row's positions after this step (its new token sits at position
        lengths[b] - 1). Returns the hidden states [rows, hidden]."""
        rows = len(lengths)
        lengths = np.asarray(lengths, dtype=np.int64)
        total = int(lengths.max())
        self.ensure_rows_capacity(total, live=start + rows)
        keep = np.arange(total)[None, :] < lengths[:, None]
        bias = np.where(keep, np.float32(0), MASK_BIAS)[:, None, None, :]
        b = self._rows_binding(start, start + rows)
        b.bind_cpu_input("inputs_embeds", np.ascontiguousarray(inputs_embeds, dtype=np.float32).reshape(rows, 1, -1))
        b.bind_cpu_input("position_ids", (lengths - 1)[:, None])
        b.bind_cpu_input("attention_bias", np.ascontiguousarray(bias, dtype=np.float32))
        b.bind_cpu_input("seqlens_k", (lengths - 1).astype(np.int32))
        b.bind_cpu_input("total_sequence_length", np.array(total, dtype=np.int32))
        b.bind_output("last_hidden_state")
        self.session.run_with_iobinding(b)
        return b.get_outputs()[0].numpy()[:, -1]


def _round_up(positions: int, limit: int) -> int:
    return min(-(-positions // CAPACITY_QUANTUM) * CAPACITY_QUANTUM, limit)
