"""What the runtime holds in memory, computed from the dimensions: a bound to check RSS against.

The runtime's resident memory is the graphs it loads plus what one request batch allocates:

- weights: the graph files the engine runs (sessions are created on first use, so a fast-engine
  pipeline never loads gpt.onnx, and neither head_text.onnx without refinement nor dvae.onnx with
  the Decoder); onnxruntime keeps each initializer once (MLAS prepacks replace, not add to, them);
- KV cache: `2 * layers * batch * kv_heads * capacity * head_dim * itemsize`, capacity =
  prompt + max_new_token rounded up to 64 (`FastGptStep.reserve`; at most 1024 up front, grown
  geometrically beyond: the copy holds old + new for a moment);
- generation state: tokens int64 [B, max_new_token, num_vq] and hidden states float32
  [B, max_new_token, hidden], and their per-row copies in the result;
- step activations: logits and their processing (float64 top-p) of B * num_vq rows, the MLP's
  intermediate, attention scores; and the Decoder + Vocos of one row (rows are decoded one at a
  time): their widest activations over 2 * steps mel frames;
- results: every row's mel and waveform, held until the batch returns;
- allocator slack: the C heap and onnxruntime's arenas grow in chunks (`ALLOCATOR_SLACK`).

`ACTIVATION_FACTOR` covers the copies and the onnxruntime arena's rounding of those activations.
The runtime returns the free heap pages left by loading the graphs to the kernel
(`runtime.heap.release_free_heap`), so a request's allocations are not hidden in them.

Library use::

    from chattts_forge.runtime.memory import memory_bound, weight_bytes_from_dims
    b = memory_bound(dims, batch=8, prompt=40, max_new_token=422, kv_itemsize=1,
                     weights=weight_bytes_from_dims(dims, gpt_bytes_per_weight=1))
    b.total()   # bytes above the interpreter + libraries
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from chattts_forge.checkpoint.inventory import (
    decoder_inventory,
    embed_inventory,
    gpt_inventory,
    vocos_inventory,
)
from chattts_forge.checkpoint.layout import Dims
from chattts_forge.runtime.fast_gpt import CAPACITY_QUANTUM, MAX_RESERVE

ACTIVATION_FACTOR = 4  # live copies of the widest activation (inputs, outputs, arena rounding)
# Growth in chunks (onnxruntime arena regions of 1 MiB and more, glibc's heap): measured 1.5 MB beyond
# the modeled terms on the tiny checkpoint at batch 8 once the free pages of the load are trimmed.
ALLOCATOR_SLACK = 4 << 20


@dataclass(frozen=True)
class MemoryBound:
    """Bytes the runtime needs beyond the interpreter and its libraries, by what holds them."""

    weights: int
    kv_cache: int
    generation_state: int
    step_activations: int
    decode_activations: int
    results: int = 0
    allocator_slack: int = 0

    def total(self) -> int:
        return (self.weights + self.kv_cache + self.generation_state + self.step_activations
                + self.decode_activations + self.results + self.allocator_slack)

    def per_request(self) -> int:
        """Everything but the weights: what a request batch adds to a loaded pipeline."""
        return self.total() - self.weights

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total()}


def cache_capacity(prompt: int, max_new_token: int, max_positions: int = 4096) -> int:
    """Positions `FastGptStep` allocates for a request (before any growth)."""
    want = max(1, min(prompt + max_new_token, MAX_RESERVE, max_positions))
    return min(-(-want // CAPACITY_QUANTUM) * CAPACITY_QUANTUM, max_positions)


def kv_cache_bytes(dims: Dims, batch: int, capacity: int, itemsize: int) -> int:
    return 2 * dims.num_hidden_layers * batch * dims.num_key_value_heads * capacity * dims.head_dim * itemsize


# The Decoder's MatMul weights in quantized variants (quantize/decoder.py): one byte each plus a
# float32 scale per block of 128.
DECODER_INT8_BYTES_PER_WEIGHT = 1 + 4 / 128


def weight_bytes_from_dims(dims: Dims, gpt_bytes_per_weight: float = 4, head_bytes_per_weight: float | None = None,
                           decoder_bytes_per_weight: float = 4) -> int:
    """Bytes of the graphs a Decoder pipeline runs (embed, GPT, code head, Decoder, Vocos), from the
    checkpoint inventory: FP32 except the GPT's (and the code head's) projection weights at
    `gpt_bytes_per_weight` (1 for INT8, ~0.56 for INT4 with its block scales) and the Decoder's
    pointwise projections at `decoder_bytes_per_weight` (`DECODER_INT8_BYTES_PER_WEIGHT` in the
    quantized variants). The embedding counts whole, although a request maps in only its rows."""
    head_b = gpt_bytes_per_weight if head_bytes_per_weight is None else head_bytes_per_weight
    gpt = 0.0
    for spec in gpt_inventory(dims):
        if "embed_tokens" in spec.name:
            continue  # the LlamaModel's own embedding is never exported
        gpt += spec.numel * (gpt_bytes_per_weight if len(spec.shape) == 2 else 4)
    embed = head = 0.0
    for spec in embed_inventory(dims):
        if spec.name.startswith("emb_"):
            embed += spec.numel * 4
        elif spec.name.startswith("head_code"):
            head += spec.numel * (head_b if len(spec.shape) >= 2 else 4)
    decoder = sum(s.numel * (decoder_bytes_per_weight if len(s.shape) == 2 else 4) for s in decoder_inventory(dims))
    conv = decoder + sum(s.numel * 4 for s in vocos_inventory(dims))
    return int(gpt + embed + head + conv)


def memory_bound(dims: Dims, *, batch: int, prompt: int, max_new_token: int, kv_itemsize: int,
                 weights: int) -> MemoryBound:
    """The bound for one request batch of `batch` rows of `prompt` tokens generating `max_new_token` steps."""
    capacity = cache_capacity(prompt, max_new_token, dims.max_position_embeddings)
    kv = kv_cache_bytes(dims, batch, capacity, kv_itemsize)
    total = prompt + max_new_token
    if total > capacity:  # grown geometrically; the copy holds old and new buffers at once
        grown = capacity
        while grown < total:
            grown *= 2
        kv = kv_cache_bytes(dims, batch, grown, kv_itemsize) + kv_cache_bytes(dims, batch, grown // 2, kv_itemsize)
    state = 2 * batch * max_new_token * (dims.num_vq * 8 + dims.hidden_size * 4)
    rows = batch * dims.num_vq
    step = ACTIVATION_FACTOR * max(
        rows * dims.num_audio_tokens * 8,  # processed logits (float64 top-p)
        batch * prompt * dims.intermediate_size * 4 * 2,  # the prefill's MLP (gate and up)
        batch * dims.num_attention_heads * prompt * total * 4,  # the prefill's attention scores
    )
    frames = 2 * max_new_token
    widest = max(dims.decoder.hidden * 4, dims.vocos_intermediate_dim, dims.n_fft + 2)  # ConvNeXt MLPs, ISTFT
    decode = ACTIVATION_FACTOR * frames * widest * 4
    results = batch * frames * (dims.hop_length + dims.n_mels) * 4  # float32 waveform and mel of every row
    return MemoryBound(weights, kv, state, step, decode, results, ALLOCATOR_SLACK)


# Prompt positions beyond the text's tokens ([Stts], the speaker tag, [Ptts], the tokenizer's own); a
# text has at most as many tokens as characters (every word piece holds one at least).
PROMPT_EXTRA_POSITIONS = 16


@dataclass(frozen=True)
class RequestMemory:
    """What one more request adds to a server already running others, at most.

    `held`: its key/value row (the scheduler's rows are given back when free), its generation state
    and its result, held while it runs. `decode`: the Decoder + Vocos working set of its whole
    decode, which a server's few decoding threads run a few at a time (the memory guard counts the
    largest ones only)."""

    held: int
    decode: int


def request_memory(dims: Dims, *, text_chars: int, max_new_token: int, kv_itemsize: int) -> RequestMemory:
    """`RequestMemory` of a request of `text_chars` characters generating up to `max_new_token` steps."""
    prompt = text_chars + PROMPT_EXTRA_POSITIONS
    b = memory_bound(dims, batch=1, prompt=prompt, max_new_token=max_new_token, kv_itemsize=kv_itemsize, weights=0)
    return RequestMemory(held=b.kv_cache + b.generation_state + b.results, decode=b.decode_activations)
