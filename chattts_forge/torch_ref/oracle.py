"""ChatTTS itself, instrumented: the oracle every parity test compares against.

Library use (all take a `ChatTTS.Chat` from `chattts_forge.torch_ref.chat.load_chat`)::

    from chattts_forge.torch_ref import oracle
    run = oracle.chattts_codes(chat, ["你好。"], max_new_token=200, min_new_token=200)
    run["codes"][0]               # int64 [steps, num_vq]: ChatTTS's own `_infer_code` result
    run["processed_logits"][0]    # float32 [steps, num_vq, num_audio_tokens]: what its softmax saw
    run["top2_gap"][0]            # float32 [steps, num_vq]: near-tie detector (raw logit units)
    tf = oracle.chattts_teacher_forced_logits(chat, ["你好。"], run["codes"])
    wavs = oracle.chattts_decode_to_wavs(chat, run["hiddens"], use_decoder=True)

Nothing here re-implements ChatTTS: generation runs through `Chat._infer_code` and
`GPT.generate` (KV cache, temperature, repetition penalty, top-p/top-k warpers with their minimum
of 3 kept tokens, per-step re-seeding). Two minimal hooks observe it:
- the head_code callables of `chat.gpt` are wrapped to record the raw logits of the last position;
- one extra logits processor is appended after ChatTTS's own chain (via `ChatTTS.core.gen_logits`):
  it records the processed logits, applying the `min_new_token` EOS mask that `generate` applies
  right after the chain, and, for teacher forcing, turns the distribution into a one-hot of the
  given code so that ChatTTS's own multinomial draw picks it (the KV-cache path stays ChatTTS's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge import chattts_defaults
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.torch_ref.chat import quiet_chattts

if TYPE_CHECKING:
    import ChatTTS
    import torch

# Parity tests call a divergence admissible only where ChatTTS's own top-2 gap is below this.
NEAR_TIE = 1e-5


def normalize_texts(chat: ChatTTS.Chat, texts: Sequence[str], normalize: bool = True) -> list[str]:
    """ChatTTS's Normalizer as `Chat.infer` calls it (language auto-detected, homophones replaced).

    Offline-safe: ChatTTS registers no external normalizer by default (nemo/WeTextProcessing are
    only used when a caller registers them), so this needs no network and no extra package.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings")
    out = []
    with quiet_chattts():
        for t in texts:
            if not t or not t.strip():
                raise BadInput("empty text")
            n = chat.normalizer(t, True, True, None) if normalize else t
            if not n.strip():
                raise ForgeError(f"text {t!r} normalises to nothing")
            out.append(n)
    return out


def top2_gap(logits: np.ndarray) -> np.ndarray:
    """Largest minus second-largest value along the last axis (inf where only one is finite)."""
    part = np.partition(logits, -2, axis=-1)
    first, second = part[..., -1], part[..., -2]
    with np.errstate(invalid="ignore"):
        gap = first - second
    return np.where(np.isfinite(second), gap, np.inf).astype(np.float32)


class _Recorder:
    """The logits processor appended after ChatTTS's chain; see the module docstring."""

    def __init__(
        self,
        chat: ChatTTS.Chat,
        batch: int,
        min_new_token: int,
        forced: list[np.ndarray] | None,
    ) -> None:
        self.num_vq = int(chat.config.gpt.num_vq)
        self.vocab = int(chat.config.gpt.num_audio_tokens)
        self.eos = self.vocab - 1
        self.batch = batch
        self.min_new_token = min_new_token
        self.forced = forced
        self.step = 0
        self.heads: list[Any] = [None] * self.num_vq  # raw head outputs of the current step
        self.penalty_processors: list[Any] = []
        self.raw: list[np.ndarray] = []  # per step [B, num_vq, V]
        self.penalized: list[np.ndarray] = []  # raw logits after repetition penalty (logit units)
        self.processed: list[np.ndarray] = []  # per step [B, num_vq, V]

    def wrap_head(self, j: int, head: Any) -> Any:
        def call(hidden_states: torch.Tensor) -> torch.Tensor:
            out = head(hidden_states)
            self.heads[j] = out[:, -1].detach().float().clone()
            return out

        return call

    def __call__(self, logits_token: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        # torch: the PyTorch side only; 1.9 s to import
        import torch

        i = self.step
        self.step += 1
        masked = i < self.min_new_token
        shape = (self.batch, self.num_vq, self.vocab)

        processed = logits.detach().clone()
        if masked:
            processed[:, self.eos] = -torch.inf
        self.processed.append(processed.view(shape).cpu().numpy())

        raw = torch.stack(self.heads, 1)  # [B, num_vq, V]
        self.raw.append(raw.cpu().numpy())
        # The decision-relevant logits in raw units: ChatTTS's own repetition penalty, no temperature.
        pen = raw.reshape(-1, self.vocab)
        for proc in self.penalty_processors:
            pen = proc(logits_token, pen)
        pen = pen.clone()
        if masked:
            pen[:, self.eos] = -torch.inf
        self.penalized.append(pen.view(shape).cpu().numpy())

        if self.forced is None:
            return logits
        # Teacher forcing: a one-hot distribution, so ChatTTS's multinomial draws the given code.
        out = torch.full_like(logits, -torch.inf).view(shape)
        for b, codes in enumerate(self.forced):
            if i < len(codes):
                out[b, torch.arange(self.num_vq), torch.as_tensor(codes[i], dtype=torch.long)] = 0.0
            else:
                out[b, :, self.eos] = 0.0
        return out.view(-1, self.vocab)


@contextlib.contextmanager
def _instrumented(chat: ChatTTS.Chat, recorder: _Recorder) -> Iterator[None]:
    # ChatTTS: the PyTorch reference only; 7.9 s to import
    import ChatTTS.core as core

    orig_gen_logits = core.gen_logits
    orig_heads = chat.gpt.head_code

    def gen_logits(**kw: Any) -> tuple[list[Any], list[Any]]:
        warpers, processors = orig_gen_logits(**kw)
        recorder.penalty_processors = list(processors)
        # generate() applies (*processors, *warpers): the recorder sees the complete chain.
        return [*warpers, recorder], processors

    core.gen_logits = gen_logits
    chat.gpt.head_code = [recorder.wrap_head(j, h) for j, h in enumerate(orig_heads)]
    try:
        yield
    finally:
        core.gen_logits = orig_gen_logits
        chat.gpt.head_code = orig_heads


def _check_chat(chat: Any) -> None:
    if not hasattr(chat, "gpt") or not hasattr(chat, "tokenizer"):
        raise BadInput("the oracle needs a loaded ChatTTS Chat (chattts_forge.torch_ref.chat.load_chat)")
    if getattr(chat.gpt, "is_vllm", False):
        raise ForgeError("the oracle instruments ChatTTS's PyTorch generate loop; vLLM is not supported")


def _prompt_ids(
    chat: ChatTTS.Chat, texts: list[str], prompt: str, spk_emb: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """The token ids and attention mask `_infer_code` builds for `texts` (left padded)."""
    decorated = chat.speaker.decorate_code_prompts(list(texts), prompt, None, spk_emb)
    input_ids, attention_mask, _ = chat.tokenizer.encode(
        decorated, chat.config.gpt.num_vq, device=chat.device_gpt
    )
    return input_ids[..., 0].cpu().numpy().astype(np.int64), attention_mask.cpu().numpy().astype(np.int64)


@dataclass(frozen=True)
class OracleParams:
    """The knobs of ChatTTS's code generation the oracle runs with (temperature ~0: argmax codes)."""

    spk_emb: str | None = None
    max_new_token: int = chattts_defaults.CODE_MAX_NEW_TOKEN
    min_new_token: int = chattts_defaults.MIN_NEW_TOKEN
    temperature: float = 1e-9
    top_p: float | None = chattts_defaults.TOP_P
    top_k: int | None = chattts_defaults.TOP_K
    repetition_penalty: float | None = chattts_defaults.CODE_REPETITION_PENALTY
    prompt: str = chattts_defaults.CODE_PROMPT
    normalize: bool = True
    seed: int = 0

    def check(self) -> None:
        if self.max_new_token < 1:
            raise BadInput("max_new_token must be at least 1")
        if self.min_new_token < 0 or self.min_new_token > self.max_new_token:
            raise BadInput("min_new_token must lie between 0 and max_new_token")
        if not self.temperature > 0:
            raise BadInput("temperature must be > 0")


def _run(chat: ChatTTS.Chat, texts: Sequence[str], p: OracleParams, forced: list[np.ndarray] | None) -> dict[str, Any]:
    # torch, ChatTTS: the PyTorch reference only; 7.9 s to import
    import torch
    from ChatTTS.core import Chat

    _check_chat(chat)
    p.check()
    norm = normalize_texts(chat, texts, p.normalize)
    recorder = _Recorder(chat, len(norm), p.min_new_token, forced)
    params = Chat.InferCodeParams(
        prompt=p.prompt,
        spk_emb=p.spk_emb,
        top_P=p.top_p,
        top_K=p.top_k,
        temperature=float(p.temperature),
        repetition_penalty=p.repetition_penalty,
        max_new_token=p.max_new_token,
        # Teacher forcing masks EOS itself (recorded logits); a masked forced EOS would be all -inf.
        min_new_token=0 if forced is not None else p.min_new_token,
        show_tqdm=False,
        ensure_non_empty=False,
        manual_seed=p.seed,
    )
    with torch.no_grad(), quiet_chattts(), _instrumented(chat, recorder):
        result = next(chat._infer_code(list(norm), False, chat.device, True, params))
    codes = [ids.cpu().numpy().astype(np.int64) for ids in result.ids]
    hiddens = [h.detach().float().cpu().numpy() for h in result.hiddens]
    result.destroy()
    input_ids, attention_mask = _prompt_ids(chat, norm, p.prompt, p.spk_emb)
    return {
        "texts": norm,
        "codes": codes,
        "hiddens": hiddens,
        **_decisions(recorder, codes, p.min_new_token),
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "params": {
            "prompt": p.prompt,
            "spk_emb": p.spk_emb,
            "temperature": float(p.temperature),
            "top_p": p.top_p,
            "top_k": p.top_k,
            "repetition_penalty": p.repetition_penalty,
            "max_new_token": p.max_new_token,
            "min_new_token": p.min_new_token,
            "seed": p.seed,
            "eos": recorder.eos,
        },
    }


def _decisions(recorder: _Recorder, codes: list[np.ndarray], min_new_token: int) -> dict[str, list[np.ndarray]]:
    """Per row, what was recorded at each of its decisions: processed and raw logits, top-2 gaps."""
    processed = np.stack(recorder.processed, 1)  # [B, steps, num_vq, V]
    raw = np.stack(recorder.raw, 1)
    penalized = np.stack(recorder.penalized, 1)
    per_row: dict[str, list[np.ndarray]] = {
        "processed_logits": [],
        "raw_logits": [],
        "top2_gap": [],
        "top2_gap_penalized": [],
    }
    for b, c in enumerate(codes):
        # The decisions of this row: one per kept code, plus the EOS decision if it stopped early.
        n = min(processed.shape[1], len(c) + 1)
        per_row["processed_logits"].append(processed[b, :n])
        per_row["raw_logits"].append(raw[b, :n])
        raw_b = raw[b, :n].copy()
        if min_new_token > 0:
            raw_b[: min(n, min_new_token), :, recorder.eos] = -np.inf
        per_row["top2_gap"].append(top2_gap(raw_b))
        per_row["top2_gap_penalized"].append(top2_gap(penalized[b, :n]))
    return per_row


def chattts_codes(
    chat: ChatTTS.Chat, texts: Sequence[str], params: OracleParams | None = None, **knobs: Any
) -> dict[str, Any]:
    """ChatTTS's own `_infer_code` on `texts` (one batch), with what it decided at every step.
    `knobs`: fields of `OracleParams` replacing `params`' (`chattts_codes(chat, texts, max_new_token=24)`).

    Returns a dict; per-text lists (index = position in `texts`):
    - `codes`: int64 [steps, num_vq] (ChatTTS's result ids; EOS excluded);
    - `hiddens`: float32 [steps, hidden] (the hidden states ChatTTS's Decoder gets);
    - `processed_logits`: float32 [decisions, num_vq, V], the logits its softmax saw (after
      temperature, repetition penalty, top-p, top-k and the `min_new_token` EOS mask);
      decisions = steps, +1 when the row stopped on EOS;
    - `raw_logits`: float32 [decisions, num_vq, V], head_code outputs;
    - `top2_gap`: float32 [decisions, num_vq], top-2 gap of the raw logits (EOS excluded while
      masked); `top2_gap_penalized`: the same after the repetition penalty, i.e. the gap that
      actually decides the argmax (compare either with `NEAR_TIE`);
    plus `texts` (normalised), `input_ids`/`attention_mask` (the prompt, [B, T]) and `params`.
    """
    return _run(chat, texts, replace(params or OracleParams(), **knobs), forced=None)


def chattts_teacher_forced_logits(
    chat: ChatTTS.Chat, texts: Sequence[str], codes: Sequence[np.ndarray], params: OracleParams | None = None,
    **knobs: Any,
) -> dict[str, Any]:
    """ChatTTS's per-step code logits when it is fed `codes[b]` ([steps, num_vq]) for text b
    (`params`/`knobs` as in `chattts_codes`; `max_new_token` is the longest row's steps).

    Runs ChatTTS's own `GPT.generate` (same prompt, embeddings, KV cache and processors) while
    forcing each step's token to the given code. Logits at step i predict code i from codes < i;
    for a row shorter than the longest one, EOS is forced after its end. Same return layout as
    `chattts_codes` with `decisions = steps` per row (`codes` echoes what was fed, `hiddens` the
    hidden state that produced each step's logits).
    """
    if len(codes) != len(texts):
        raise BadInput(f"teacher forcing needs one code array per text ({len(codes)} != {len(texts)})")
    forced = [np.asarray(c, dtype=np.int64) for c in codes]
    for c in forced:
        if c.ndim != 2 or c.shape[0] < 1:
            raise BadInput(f"codes must be int arrays [steps, num_vq] with steps >= 1, got shape {c.shape}")
    steps = max(len(c) for c in forced)
    run = _run(chat, texts, replace(params or OracleParams(), **{**knobs, "max_new_token": steps}), forced=forced)
    for b, (got, want) in enumerate(zip(run["codes"], forced, strict=True)):
        if not np.array_equal(got, want):
            raise RuntimeError(f"teacher forcing failed on row {b}: ChatTTS did not take the given codes")
        for key in ("processed_logits", "raw_logits", "top2_gap", "top2_gap_penalized"):
            run[key][b] = run[key][b][: len(want)]
    return run


def chattts_decode_to_wavs(
    chat: ChatTTS.Chat, hiddens_or_codes: Sequence[Any], use_decoder: bool = True
) -> np.ndarray:
    """ChatTTS's `Chat._decode_to_wavs`, unchanged: hidden states [T, hidden] (Decoder) or codes
    [T, num_vq] (DVAE) per item, zero-padded to the longest T in one batch.

    Returns float32 [items, hop_length * (2 * T_max - 1)] exactly as ChatTTS returns it (Vocos with
    centred ISTFT gives hop * (frames - 1) samples; Decoder/DVAE make 2 mel frames per step).
    """
    # torch: the PyTorch side only; 1.9 s to import
    import torch

    _check_chat(chat)
    if len(hiddens_or_codes) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    items = []
    for x in hiddens_or_codes:
        t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        t = t.to(chat.device, dtype=torch.float32 if use_decoder else torch.long).clone()
        if t.ndim != 2 or t.shape[0] < 1:
            raise BadInput(f"decode input must be 2-D [T >= 1, channels], got shape {tuple(t.shape)}")
        items.append(t)
    with quiet_chattts():
        wavs = chat._decode_to_wavs(items, use_decoder)
    return np.asarray(wavs, dtype=np.float32)
