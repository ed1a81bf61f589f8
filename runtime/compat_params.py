"""ChatTTS 0.2.5's `Chat.RefineTextParams` and `Chat.InferCodeParams` for the drop-in API
(runtime.compat): same names and defaults, unknown keyword arguments refused, mapped onto the
runtime's params and checked by type and range before anything runs on them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from chattts_forge import chattts_defaults
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.runtime.params import InferCodeParams as _RuntimeCodeParams
from chattts_forge.runtime.params import RefineTextParams as _RuntimeRefineParams
from chattts_forge.runtime.params import SynthParams, check_synth_params
from chattts_forge.runtime.pipeline import Pipeline


class CompatArgumentError(BadInput, TypeError):
    """An argument ChatTTS's API has but this runtime cannot honour, or one neither has.

    Also a TypeError, as Python raises for an unknown keyword argument."""


def _strict(cls: type) -> type:
    """Make a params dataclass refuse unknown keyword arguments with a one-line ForgeError."""
    init = cls.__init__
    names = [f.name for f in fields(cls)]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise CompatArgumentError(
                f"Chat.{cls.__name__} has no parameter '{unknown[0]}' (ChatTTS 0.2.5's: {', '.join(names)})"
            )
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


@_strict
@dataclass(repr=False, eq=False)
class RefineTextParams:
    """ChatTTS 0.2.5 `Chat.RefineTextParams` (same names and defaults)."""

    prompt: str = chattts_defaults.REFINE_PROMPT
    top_P: float = chattts_defaults.TOP_P
    top_K: int = chattts_defaults.TOP_K
    temperature: float = chattts_defaults.REFINE_TEMPERATURE
    repetition_penalty: float = chattts_defaults.REFINE_REPETITION_PENALTY
    max_new_token: int = chattts_defaults.REFINE_MAX_NEW_TOKEN
    min_new_token: int = chattts_defaults.MIN_NEW_TOKEN
    show_tqdm: bool = True
    ensure_non_empty: bool = True
    manual_seed: int | None = None


@_strict
@dataclass(repr=False, eq=False)
class InferCodeParams(RefineTextParams):
    """ChatTTS 0.2.5 `Chat.InferCodeParams` (same names and defaults)."""

    prompt: str = chattts_defaults.CODE_PROMPT
    spk_emb: str | None = None
    spk_smp: str | None = None
    txt_smp: str | None = None
    temperature: float = chattts_defaults.CODE_TEMPERATURE
    repetition_penalty: float = chattts_defaults.CODE_REPETITION_PENALTY
    max_new_token: int = chattts_defaults.CODE_MAX_NEW_TOKEN
    stream_batch: int = chattts_defaults.STREAM_BATCH
    stream_speed: int = 12000
    pass_first_n_batches: int = 2


def runtime_refine(p: RefineTextParams) -> _RuntimeRefineParams:
    return _RuntimeRefineParams(
        prompt=p.prompt, top_p=p.top_P, top_k=p.top_K, temperature=p.temperature,
        repetition_penalty=p.repetition_penalty, max_new_token=p.max_new_token,
        min_new_token=p.min_new_token, ensure_non_empty=p.ensure_non_empty, seed=p.manual_seed,
    )  # fmt: skip


def runtime_code(p: InferCodeParams) -> _RuntimeCodeParams:
    return _RuntimeCodeParams(
        prompt=p.prompt, spk_emb=p.spk_emb, spk_smp=p.spk_smp, txt_smp=p.txt_smp,
        temperature=p.temperature, top_p=p.top_P, top_k=p.top_K,
        repetition_penalty=p.repetition_penalty, max_new_token=p.max_new_token,
        min_new_token=p.min_new_token, stream_batch=p.stream_batch,
        ensure_non_empty=p.ensure_non_empty, seed=p.manual_seed,
    )  # fmt: skip


def check_params(pipe: Pipeline, refine: RefineTextParams, code: InferCodeParams) -> None:
    """Every field of ChatTTS's two params objects by type and range, before anything runs on them
    (e.g. top_K="20" is a one-line error, not a TypeError deep in sampling)."""
    try:
        check_synth_params(SynthParams(code=runtime_code(code), refine=runtime_refine(refine)),
                           pipe.dims.max_position_embeddings, pipe.max_text_chars())
    except ForgeError as e:  # name ChatTTS's fields, not the runtime's
        msg = str(e).replace("params.code.", "params_infer_code.").replace("params.refine.", "params_refine_text.")
        for ours, theirs in (("top_p", "top_P"), ("top_k", "top_K"), ("seed", "manual_seed")):
            msg = msg.replace(f".{ours} ", f".{theirs} ")
        raise CompatArgumentError(f"infer: {msg}") from None
    for name in ("stream_speed", "pass_first_n_batches"):
        value = getattr(code, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "stream_speed" else 0):
            raise CompatArgumentError(f"infer: params_infer_code.{name} must be a whole number "
                                      f"{'>= 1' if name == 'stream_speed' else '>= 0'}, got {str(value)[:40]!r}")


def refuse_unknown(where: str, unknown: dict[str, Any]) -> None:
    if unknown:
        raise CompatArgumentError(f"Chat.{where}() has no parameter '{next(iter(unknown))}' (ChatTTS 0.2.5 API)")


def check_type(name: str, value: object, cls: type) -> None:
    if not isinstance(value, cls):
        raise CompatArgumentError(
            f"infer: {name} must be a chattts_forge.compat.Chat.{cls.__name__}, got {type(value).__name__}"
        )
