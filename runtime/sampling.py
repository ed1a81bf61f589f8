"""ChatTTS's logits processing and sampling, in numpy.

One generation step of `ChatTTS.model.gpt.GPT.generate` turns the head's logits into a token per
stream. Rows are streams: `B * num_vq` rows for audio codes (row `b * num_vq + q` is stream q of batch
row b), `B` rows for text. In ChatTTS's order:

1. `logits / temperature` (float32, one temperature per stream),
2. `CustomRepetitionPenaltyLogitsProcessorRepeat` (processors.py): counts of each token among the
   last 16 generated tokens of the row, factor `penalty ** count`, multiply where the score is < 0,
   divide elsewhere. The factor is a float32 power of the float32 penalty (computed in float64 and
   rounded: bit-identical to torch for 1.05; torch's vectorised powf is within 1 ulp elsewhere).
   ChatTTS zeroes the counts of *rows* >= `max_input_ids` (its `narrow(0, ...)`, num_code for codes);
   kept as is, it only matters beyond 156 batch rows.
3. transformers' `TopPLogitsWarper(top_p, min_tokens_to_keep=3)`,
4. transformers' `TopKLogitsWarper(top_k, min_tokens_to_keep=3)` (so top_k=1 keeps 3 tokens),
5. `logits[:, eos] = -inf` while `step < min_new_token`,
6. softmax, then one draw per row.

Sampling uses a numpy `Generator` per batch row (`argmax(p / Exp(1) noise)`, an exact categorical
draw), so a row's tokens never depend on the other rows of the batch and a seeded run is
reproducible. torch's RNG stream is not reproduced; at temperature 1e-9 both are argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chattts_forge.chattts_defaults import CODE_REPETITION_PENALTY, MIN_NEW_TOKEN, TOP_K, TOP_P

REPETITION_WINDOW = 16
MIN_TOKENS_TO_KEEP = 3
TOP_P_SLICE = 64  # top-p sorts this many top scores per row (all of them when more are kept)
EMPTY_REDRAWS = 16  # draws again of a row that ends at step 0 (ChatTTS regenerates an empty result)


@dataclass(frozen=True)
class SamplingConfig:
    """What one generation (code or text) applies to its logits."""

    temperature: tuple[float, ...]  # one per stream (num_vq for codes, 1 for text)
    top_p: float | None = TOP_P
    top_k: int | None = TOP_K
    repetition_penalty: float | None = CODE_REPETITION_PENALTY
    min_new_token: int = MIN_NEW_TOKEN
    eos_token: int = 625
    max_input_ids: int = 625  # ChatTTS's `num_code` argument of the penalty processor


def penalty_factors(penalty: float, counts: np.ndarray) -> np.ndarray:
    """`penalty ** counts` as float32, as torch.pow(float, int tensor) gives it."""
    base = np.float64(np.float32(penalty))
    return np.power(base, counts.astype(np.float64)).astype(np.float32)


def apply_repetition_penalty(
    scores: np.ndarray, history: np.ndarray, penalty: float, max_input_ids: int
) -> np.ndarray:
    """ChatTTS's windowed repetition penalty. `history`: int [rows, T] generated tokens so far."""
    if history.shape[1] == 0:
        return scores
    window = history[:, -REPETITION_WINDOW:]
    rows, vocab = scores.shape
    flat = (np.arange(rows)[:, None] * vocab + window).reshape(-1)
    counts = np.bincount(flat, minlength=rows * vocab).reshape(rows, vocab)
    if rows > max_input_ids:
        counts[max_input_ids:] = 0
    alpha = penalty_factors(penalty, np.arange(window.shape[1] + 1))[counts]  # a table: counts <= 16
    return np.where(scores < 0, scores * alpha, scores / alpha)


def softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def _top_p_remove(scores: np.ndarray, probs: np.ndarray, threshold: np.float32, m: int, min_keep: int):
    """For the top-m scores of each row (ascending order): their indices and whether top-p drops them.

    The cumulative probability of a candidate is the float64 mass of everything below it (the
    non-candidates, then the smaller candidates), rounded to float32 like torch's cumsum.
    """
    vocab = scores.shape[-1]
    if m >= vocab:
        order = np.argsort(scores, axis=-1, kind="stable")
        below = np.zeros((scores.shape[0], 1))
    else:
        cand = np.argpartition(scores, vocab - m, axis=-1)[:, vocab - m :]
        order = np.take_along_axis(cand, np.argsort(np.take_along_axis(scores, cand, -1), -1, kind="stable"), -1)
        below = probs.sum(axis=-1, keepdims=True) - np.take_along_axis(probs, order, -1).sum(axis=-1, keepdims=True)
    cumulative = (below + np.cumsum(np.take_along_axis(probs, order, -1), axis=-1)).astype(np.float32)
    remove = cumulative <= threshold
    remove[:, -min_keep:] = False
    return order, remove


def apply_top_p(scores: np.ndarray, top_p: float, min_keep: int = MIN_TOKENS_TO_KEEP) -> np.ndarray:
    """transformers' TopPLogitsWarper: drop the low tail whose cumulative probability <= 1 - top_p.

    transformers sorts all scores ascending and takes a cumulative sum of their softmax (torch's
    CPU cumsum accumulates in float64). Only the high end can be kept, so we sort the top
    `TOP_P_SLICE` scores and add the float64 mass of the rest: the same cumulative values without
    sorting the whole vocabulary. Rows whose lowest candidate is still kept are redone in full.
    """
    threshold = np.float32(1 - top_p)
    probs = softmax(scores).astype(np.float64)
    keep = np.zeros(scores.shape, dtype=bool)
    order, remove = _top_p_remove(scores, probs, threshold, TOP_P_SLICE, min_keep)
    keep[np.arange(len(order))[:, None], order] = ~remove
    redo = ~remove[:, 0]
    if redo.any() and order.shape[1] < scores.shape[1]:
        order, remove = _top_p_remove(scores[redo], probs[redo], threshold, scores.shape[1], min_keep)
        full = np.zeros((len(order), scores.shape[1]), dtype=bool)
        full[np.arange(len(order))[:, None], order] = ~remove
        keep[redo] = full
    return np.where(keep, scores, np.float32(-np.inf))


def apply_top_k(scores: np.ndarray, top_k: int, min_keep: int = MIN_TOKENS_TO_KEEP) -> np.ndarray:
    """transformers' TopKLogitsWarper: keep scores >= the k-th largest (ties all kept)."""
    k = min(max(top_k, min_keep), scores.shape[-1])
    kth = -np.partition(-scores, k - 1, axis=-1)[..., k - 1 : k]
    return np.where(scores < kth, np.float32(-np.inf), scores)


def process_logits(
    logits: np.ndarray, history: np.ndarray, step: int, cfg: SamplingConfig, num_streams: int
) -> np.ndarray:
    """Steps 1-5 above on float32 `logits` [rows, vocab]; rows are (batch, stream) row-major."""
    rows = logits.shape[0]
    temperature = np.tile(np.asarray(cfg.temperature, dtype=np.float32), rows // num_streams)
    scores = (logits.astype(np.float32, copy=False) / temperature[:, None]).astype(np.float32)
    if cfg.repetition_penalty is not None and cfg.repetition_penalty != 1:
        scores = apply_repetition_penalty(scores, history, cfg.repetition_penalty, cfg.max_input_ids)
    if cfg.top_p is not None:
        scores = apply_top_p(scores, cfg.top_p)
    if cfg.top_k is not None:
        scores = apply_top_k(scores, cfg.top_k)
    if step < cfg.min_new_token:
        scores = scores.copy()
        scores[:, cfg.eos_token] = -np.inf
    return scores


def sample_rows(probs: np.ndarray, rngs: list[np.random.Generator], num_streams: int) -> np.ndarray:
    """One categorical draw per row of `probs` [B * num_streams, vocab]; batch row b uses rngs[b]."""
    rows, vocab = probs.shape
    out = np.empty(rows, dtype=np.int64)
    for b, rng in enumerate(rngs):
        block = probs[b * num_streams : (b + 1) * num_streams]
        # float64 noise, kept > 0: a zero draw would make 0/0 = NaN, which argmax would pick
        noise = np.maximum(rng.standard_exponential((num_streams, vocab)), np.finfo(np.float64).tiny)
        out[b * num_streams : (b + 1) * num_streams] = np.argmax(block / noise, axis=-1)
    return out


@dataclass(frozen=True)
class SeedGroups:
    """The seeds of a batch made of several independently seeded groups of rows (calibrate generates
    a few of its batches in one GPT call): group g's `sizes[g]` rows draw with `seeds[g]`, in order.
    A step-0 redraw of one group never advances another group's generators, so every group draws
    the tokens it would draw as a batch of its own."""

    seeds: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.seeds) != len(self.sizes) or not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"seed groups need one seed per group of >= 1 rows, got {self.seeds} / {self.sizes}")


class Sampler:
    """Processes and samples one step for a batch; one seeded Generator per batch row."""

    def __init__(self, cfg: SamplingConfig, num_streams: int, batch: int, seed: int | SeedGroups | None) -> None:
        self.cfg = cfg
        self.num_streams = num_streams
        # Every row gets the same seed: a text's tokens are then the same alone or in a batch.
        if isinstance(seed, SeedGroups):
            if sum(seed.sizes) != batch:
                raise ValueError(f"seed groups cover {sum(seed.sizes)} rows, the batch has {batch}")
            self.rngs = [np.random.default_rng(s) for s, n in zip(seed.seeds, seed.sizes, strict=True) for _ in range(n)]
            self.groups = np.repeat(np.arange(len(seed.sizes)), seed.sizes)
        else:
            self.rngs = [np.random.default_rng(seed) for _ in range(batch)]
            self.groups = np.zeros(batch, dtype=np.int64)

    def draw(self, probs: np.ndarray) -> np.ndarray:
        """One token per row of `probs` [B * num_streams, vocab]."""
        return sample_rows(probs, self.rngs, self.num_streams)

    def next_tokens(self, scores: np.ndarray, redraw_ended: bool = False) -> np.ndarray:
        """The sampling step of a generation: tokens [B, num_streams] from processed `scores`
        [B * num_streams, vocab] (`process_logits`'s output). `redraw_ended` (step 0 of a generation
        that must not be empty): a batch row that drew EOS in any stream draws again, up to
        `EMPTY_REDRAWS` times, as ChatTTS regenerates when a row ends at once (step 0's logits would
        be the same); every row of its seed group draws again with it. `generation.iter_generate` and
        the scheduler both sample through here."""
        probs = softmax(scores)
        shape = (len(self.rngs), self.num_streams)
        idx = self.draw(probs).reshape(shape)
        if redraw_ended:
            for _ in range(EMPTY_REDRAWS):
                ended = (idx == self.cfg.eos_token).any(axis=1)
                if not ended.any():
                    break
                again = np.flatnonzero(np.isin(self.groups, self.groups[ended]))
                block = probs.reshape(len(self.rngs), self.num_streams, -1)[again].reshape(-1, probs.shape[-1])
                redrawn = sample_rows(block, [self.rngs[r] for r in again], self.num_streams).reshape(-1, self.num_streams)
                idx[again] = np.where(ended[again][:, None], redrawn, idx[again])
        return idx

    def __call__(self, logits: np.ndarray, history: np.ndarray, step: int) -> np.ndarray:
        scores = process_logits(logits, history, step, self.cfg, self.num_streams)
        return self.draw(softmax(scores))
