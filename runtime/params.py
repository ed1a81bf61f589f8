"""What one synthesis request asks for: ChatTTS's parameter types with its defaults, and their checks.

`InferCodeParams` and `RefineTextParams` mirror `Chat.InferCodeParams` / `Chat.RefineTextParams`
(the defaults from `chattts_defaults`); `SynthParams` is everything one `Pipeline.synthesize` or
`Pipeline.stream` call takes besides the texts. `check_synth_params` validates a request by type and
range before anything runs on it (the scheduler's `submit`, the pipeline, compat, the server).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from chattts_forge import chattts_defaults
from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput
from chattts_forge.runtime.chattts_speaker import (
    DEFAULT_MAX_PROMPT_CODES,
    DEFAULT_MAX_SPEAKER_VALUES,
    max_encoded_chars,
)


class Language(Choice):
    """A text's language, when the caller names it (`SynthParams.lang`; None: detected)."""

    ZH = "zh"
    EN = "en"


@dataclass
class RefineTextParams:
    """ChatTTS's `Chat.RefineTextParams` defaults."""

    prompt: str = chattts_defaults.REFINE_PROMPT
    top_p: float | None = chattts_defaults.TOP_P
    top_k: int | None = chattts_defaults.TOP_K
    temperature: float = chattts_defaults.REFINE_TEMPERATURE
    repetition_penalty: float | None = chattts_defaults.REFINE_REPETITION_PENALTY
    max_new_token: int = chattts_defaults.REFINE_MAX_NEW_TOKEN
    min_new_token: int = chattts_defaults.MIN_NEW_TOKEN
    ensure_non_empty: bool = True
    seed: int | None = None


@dataclass
class InferCodeParams:
    """ChatTTS's `Chat.InferCodeParams` defaults (`seed` plays the role of `manual_seed`)."""

    prompt: str = chattts_defaults.CODE_PROMPT
    spk_emb: str | None = None
    spk_smp: str | None = None
    txt_smp: str | None = None
    temperature: float | Sequence[float] = chattts_defaults.CODE_TEMPERATURE
    top_p: float | None = chattts_defaults.TOP_P
    top_k: int | None = chattts_defaults.TOP_K
    repetition_penalty: float | None = chattts_defaults.CODE_REPETITION_PENALTY
    max_new_token: int = chattts_defaults.CODE_MAX_NEW_TOKEN
    min_new_token: int = chattts_defaults.MIN_NEW_TOKEN
    stream_batch: int = chattts_defaults.STREAM_BATCH
    ensure_non_empty: bool = True
    seed: int | None = None


@dataclass
class SynthParams:
    """Everything one `synthesize`/`stream` call needs besides the texts."""

    code: InferCodeParams = field(default_factory=InferCodeParams)
    refine: RefineTextParams | None = None  # None: no text refinement (ChatTTS skip_refine_text)
    use_decoder: bool = True  # False: DVAE on codes
    # The spoken form (runtime.spoken: numbers, money, dates, symbols as words; long text cut into
    # segments). False: ChatTTS's own front end exactly, as ChatTTS without a registered normalizer.
    text_normalization: bool = True
    normalize: bool = True  # ChatTTS's do_text_normalization (zh half -> full width)
    homophones: bool = True
    lang: str | None = None
    split_sentences: bool = False  # split each text like Chat.infer(split_text=True), then join


# ---- types and ranges, checked once where a request enters ----------------------------------------

# A prompt string such as "[speed_5]" or "[oral_2][laugh_0][break_6]": far below this.
MAX_PROMPT_CHARS = 1024
MAX_SEED = 2**64  # numpy's default_rng takes any int >= 0; this keeps seeds to what a caller can mean


def _is_whole(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_whole(where: str, value: object, low: int, high: int | None = None, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_whole(value):
        raise BadInput(f"{where} must be a whole number, got {type(value).__name__} {str(value)[:40]!r}", where)
    if value < low or (high is not None and value > high):  # type: ignore[operator]
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise BadInput(f"{where} must be {span}, got {value}", where)


def _check_real(where: str, value: object, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_real(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise BadInput(f"{where} must be a finite number, got {type(value).__name__} {str(value)[:40]!r}", where)


def _check_bool(where: str, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise BadInput(f"{where} must be true or false, got {type(value).__name__} {str(value)[:40]!r}", where)


def _check_optional_str(where: str, value: object, limit: int) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise BadInput(f"{where} must be a string or None, got {type(value).__name__}", where)
    if len(value) > limit:
        raise BadInput(f"{where} is {len(value)} characters long, more than {limit}", where)


def check_sampling_params(params: InferCodeParams | RefineTextParams, where: str, max_positions: int | None) -> None:
    """The knobs code generation and refinement share: types first, then ranges (a one-line BadInput
    naming the field)."""
    if not isinstance(params.prompt, str) or len(params.prompt) > MAX_PROMPT_CHARS:
        raise BadInput(f"{where}.prompt must be a string of at most {MAX_PROMPT_CHARS} characters", f"{where}.prompt")
    temps = params.temperature
    if isinstance(temps, (list, tuple)):
        if not temps:
            raise BadInput(f"{where}.temperature must be a number or a non-empty list of numbers", f"{where}.temperature")
        for i, t in enumerate(temps):
            _check_real(f"{where}.temperature[{i}]", t)
    else:
        _check_real(f"{where}.temperature", temps)
    _check_real(f"{where}.top_p", params.top_p, optional=True)
    _check_whole(f"{where}.top_k", params.top_k, 1, optional=True)
    _check_real(f"{where}.repetition_penalty", params.repetition_penalty, optional=True)
    _check_whole(f"{where}.max_new_token", params.max_new_token, 1, max_positions)
    _check_whole(f"{where}.min_new_token", params.min_new_token, 0)
    _check_bool(f"{where}.ensure_non_empty", params.ensure_non_empty)
    _check_whole(f"{where}.seed", params.seed, 0, MAX_SEED - 1, optional=True)
    listed = tuple(temps) if isinstance(temps, (list, tuple)) else (temps,)
    check_sampling_ranges(tuple(float(t) for t in listed), params.top_p, params.top_k, params.max_new_token,
                    params.min_new_token, params.repetition_penalty)


def check_synth_params(params: object, max_positions: int | None = None, max_text_chars: int | None = None) -> SynthParams:
    """Validate a request's parameters by type and range before anything runs on them (the scheduler's
    `submit`, `Pipeline.synthesize`/`stream`, compat, a server): a one-line BadInput naming the
    first bad field, else `params` unchanged. `max_positions` (the model's) bounds max_new_token;
    `max_text_chars` bounds txt_smp."""
    if not isinstance(params, SynthParams):
        raise BadInput(f"params must be SynthParams, got {type(params).__name__}", "params")
    code = params.code
    if not isinstance(code, InferCodeParams):
        raise BadInput(f"params.code must be InferCodeParams, got {type(code).__name__}", "params.code")
    if params.refine is not None and not isinstance(params.refine, RefineTextParams):
        raise BadInput(f"params.refine must be RefineTextParams or None, got {type(params.refine).__name__}", "params.refine")
    for name in ("use_decoder", "text_normalization", "normalize", "homophones", "split_sentences"):
        _check_bool(f"params.{name}", getattr(params, name))
    if params.lang not in (None, "zh", "en"):
        raise BadInput(f"params.lang must be None, 'zh' or 'en', got {str(params.lang)[:40]!r}", "params.lang")
    check_sampling_params(code, "params.code", max_positions)
    # Speaker strings are bounded again (tighter, by the model) when decoded; this bounds the work before.
    _check_optional_str("params.code.spk_emb", code.spk_emb, max_encoded_chars(2 * DEFAULT_MAX_SPEAKER_VALUES))
    _check_optional_str("params.code.spk_smp", code.spk_smp, max_encoded_chars(2 * DEFAULT_MAX_PROMPT_CODES) + 8)
    _check_optional_str("params.code.txt_smp", code.txt_smp, max_text_chars or 1 << 20)
    _check_whole("params.code.stream_batch", code.stream_batch, 1)
    if params.refine is not None:
        check_sampling_params(params.refine, "params.refine", max_positions)
    return params


def check_sampling_ranges(temperature: Sequence[float], top_p: float | None, top_k: int | None,
                    max_new_token: int, min_new_token: int, penalty: float | None) -> None:
    if any(not (t > 0) or not math.isfinite(t) for t in temperature):
        raise BadInput(f"temperature must be > 0, got {list(temperature)}", "temperature")
    if top_p is not None and not (0 <= top_p <= 1):
        raise BadInput(f"top-p must lie in [0, 1], got {top_p}", "top_p")
    if top_k is not None and top_k < 1:
        raise BadInput(f"top-k must be >= 1, got {top_k}", "top_k")
    if max_new_token < 1:
        raise BadInput(f"max-new-token must be >= 1, got {max_new_token}", "max_new_token")
    if not (0 <= min_new_token <= max_new_token):
        raise BadInput(f"min-new-token must lie in [0, max-new-token={max_new_token}], got {min_new_token}", "min_new_token")
    if penalty is not None and not (penalty > 0):
        raise BadInput(f"repetition penalty must be > 0, got {penalty}", "repetition_penalty")
