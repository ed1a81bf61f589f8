"""Request bodies of the server, checked by type and range before anything is queued.

Every problem is a `BadRequest` (a ForgeError) with one line naming the field; the app answers 400
with `{"error": {"message": ..., "type": "invalid_request_error", "param": field}}`.

OpenAI `POST /v1/audio/speech` fields: `model` (str), `input` (str, 1..max_input_chars), `voice` (str
or {"id": str}), `response_format` (wav|pcm|flac|mp3|opus|aac, default mp3 as OpenAI), `speed`
(0.25..4.0, default 1.0: the duration divided by `speed`, pitch kept: the speed-1 synthesis
time-scaled by runtime.tempo, so the code prompt stays the default (`[speed_5]`) and a phrase
cache serves every speed), `stream_format` (audio|sse), `instructions` (accepted, unused).
Extensions (the openai client's `extra_body`): `seed`, `temperature`, `top_p`, `top_k`,
`repetition_penalty`, `max_new_token`, `min_new_token`, `stream_batch`, `refine` (bool, default
true: ChatTTS's and `synth`'s text refinement, seeded by `seed`), `stream` (bool, default true:
chunked from the first final chunk; false: the whole waveform decoded at once, `synth`'s samples),
`deadline_s`, `normalize` (bool, default true: numbers, money, dates and symbols spoken as words and
a long input cut into segments, runtime.spoken; false: ChatTTS's own front end exactly, both
endpoints), `stream_lookahead` ("exact" or a whole number of mel frames >= 1: the right context a
stream waits for; absent: the artifact's recorded look-ahead, exact for artifacts without one; both
endpoints). Knobs not given take `synth`'s defaults (seed: the server's `--seed`).

Native `POST /v1/chattts/speech`: ChatTTS's `Chat.infer` arguments: `text`, `model`, `voice`,
`params_infer_code` (InferCodeParams: prompt, spk_emb, spk_smp, txt_smp, temperature (one or one per
code stream), top_P, top_K, repetition_penalty, max_new_token, min_new_token, stream_batch,
ensure_non_empty, manual_seed), `params_refine_text` (RefineTextParams: prompt, top_P, top_K,
temperature, repetition_penalty, max_new_token, min_new_token, ensure_non_empty, manual_seed),
`skip_refine_text` (default false, as ChatTTS and `synth`), `use_decoder`, `do_text_normalization`,
`do_homophone_replacement`, `lang`, `response_format` (default wav), `stream`, `stream_format`,
`deadline_s`; its speed is ChatTTS's own `[speed_N]` tag in `params_infer_code.prompt` (the model's
pacing), its tempo never changed afterwards. Knobs not given take `synth`'s defaults: `manual_seed` the server's `--seed` (0; a
seeded default makes a plain request reproducible and servable from a phrase cache warmed with the
defaults), the refinement seed the code seed.

Text fields (`input`; natively `text`, `txt_smp` and the prompts) may hold ChatTTS's prosody tokens
([uv_break], [lbreak], [laugh], [break_N], ...), which work as in ChatTTS; its structural tokens
(chattts_text.STRUCTURAL_TOKENS: [Stts], [Ptts], [Etts], [spk_emb], ...) end or restart the model's
prompt and cut the audio, so a field holding one is refused (400 naming the token), on both endpoints.
Error messages quote at most ~100 characters of a bad value (errors.quote).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from chattts_forge.errors import BadInput, ForgeError, quote
from chattts_forge.runtime.chattts_text import structural_token_in
from chattts_forge.runtime.pipeline import InferCodeParams, RefineTextParams, SynthParams
from chattts_forge.runtime.serve.formats import FORMATS, check_encoder, check_format
from chattts_forge.runtime.stream_decode import EXACT_LOOKAHEAD, parse_stream_lookahead
from chattts_forge.runtime.tempo import MAX_SPEED, MIN_SPEED

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")  # route by length, as the version itself
STREAM_FORMATS = ("audio", "sse")
_SEED_MAX = 2**63 - 1
QUOTE_PARAM = 64  # an unknown field's name as the error's `param`, cut to this many characters


class BadRequest(BadInput):
    """A request body the server cannot take; `param` names the field at fault."""


@dataclass
class SpeechRequest:
    text: str
    params: SynthParams
    model: str | None  # a variant (or the version's id) to serve it; None: route by length
    voice: str
    response_format: str
    stream_format: str
    stream: bool
    deadline_s: float | None
    speed: float = 1.0  # OpenAI's speed: the reply is time-scaled by it (runtime.tempo) after synthesis
    # "exact" or mel frames of right context its stream waits for; None: the artifact's recorded look-ahead
    stream_lookahead: int | str | None = None


def _get(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
    if name not in body or body[name] is None:
        return default
    value = body[name]
    if isinstance(value, bool) and bool not in kinds:
        raise BadRequest(f"{name} must be {what}, got {quote(value)}", name)
    if not isinstance(value, kinds):
        raise BadRequest(f"{name} must be {what}, got {type(value).__name__}", name)
    return value


def _number(body: dict[str, Any], name: str, lo: float, hi: float, default: Any = None,
            open_low: bool = False) -> float | None:
    value = _get(body, name, (int, float), "a number", default)
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value) or value > hi or value < lo or (open_low and value == lo):
        bound = f"({lo}, {hi}]" if open_low else f"[{lo}, {hi}]"
        raise BadRequest(f"{name} must lie in {bound}, got {value}", name)
    return value


def _integer(body: dict[str, Any], name: str, lo: int, hi: int, default: Any = None) -> int | None:
    value = _get(body, name, (int,), "a whole number", default)
    if value is None:
        return None
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must lie in [{lo}, {hi}], got {quote(value)}", name)
    return int(value)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    return bool(_get(body, name, (bool,), "true or false", default))


def _text(body: dict[str, Any], name: str, max_chars: int) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string" + ("" if name in body else " (missing)"), name)
    if not value.strip():
        raise BadRequest(f"{name} is empty", name)
    if len(value) > max_chars:
        raise BadRequest(f"{name} has {len(value)} characters; at most {max_chars} are accepted", name)
    return _plain_text(value, name)


def _plain_text(value: str, name: str) -> str:
    """`value` when it is text the model may read: valid Unicode (JSON can carry a lone surrogate,
    which no UTF-8 tokenizer takes) without ChatTTS's structural tokens (see the module docstring)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{name} holds a lone surrogate (\\ud800-\\udfff): not valid Unicode text", name) from None
    token = structural_token_in(value)
    if token is not None:
        raise BadRequest(f"{name} holds ChatTTS's structural token {token}, which would cut the audio; remove it "
                         "(prosody tokens such as [uv_break], [laugh] and [break_N] are accepted)", name)
    return value


def _optional_text(section: dict[str, Any], name: str, max_chars: int, where: str) -> str | None:
    """An optional text field of a native section (prompt, txt_smp): a string of at most `max_chars`."""
    value = _get(section, name, (str,), "a string")
    if value is None:
        return None
    if len(value) > max_chars:
        raise BadRequest(f"{where}.{name} has {len(value)} characters; at most {max_chars} are accepted", name)
    return _plain_text(value, f"{where}.{name}")


def _unknown(body: dict[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise BadRequest(f"unknown field {quote(extra[0])} in {where} (known: {', '.join(sorted(known))})",
                         extra[0][:QUOTE_PARAM])


def _voice(body: dict[str, Any], default: str) -> str:
    value = body.get("voice", default)
    if isinstance(value, dict):
        value = value.get("id")
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise BadRequest("voice must be a voice name, {\"id\": name} or a speaker string", "voice")
    return value.strip()


def _common(body: dict[str, Any], default_format: str) -> tuple[str, str, bool, float | None]:
    given = body.get("response_format") or default_format
    try:
        fmt = check_format(given)
    except ForgeError:
        raise BadRequest(f"response_format must be one of {', '.join(FORMATS)}, got {quote(given)}",
                         "response_format") from None
    try:
        check_encoder(fmt)  # aac without PyAV: refused here, not a stream cut after its 200
    except ForgeError as e:
        raise BadRequest(str(e), "response_format") from None
    sfmt = body.get("stream_format") or "audio"
    if not isinstance(sfmt, str) or sfmt not in STREAM_FORMATS:
        raise BadRequest(f"stream_format must be audio or sse, got {quote(sfmt)}", "stream_format")
    stream = _flag(body, "stream", True)
    deadline = _number(body, "deadline_s", 0.0, 3600.0, open_low=True)
    return fmt, sfmt, stream, deadline


def _stream_lookahead(body: dict[str, Any]) -> int | str | None:
    """`stream_lookahead`: "exact" or a whole number of mel frames >= 1 (absent or null: the artifact's own)."""
    value = body.get("stream_lookahead")
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, str | int) or (isinstance(value, str) and value.strip().lower() != EXACT_LOOKAHEAD):
        raise BadRequest(f"stream_lookahead must be \"{EXACT_LOOKAHEAD}\" or a whole number of mel frames >= 1, "
                         f"got {quote(value)}", "stream_lookahead")
    try:
        return parse_stream_lookahead(value, "stream_lookahead")
    except ForgeError as e:
        raise BadRequest(str(e), "stream_lookahead") from None


@dataclass(frozen=True)
class _Knob:
    """One sampling knob: its field in InferCodeParams/RefineTextParams, its OpenAI `extra_body` name
    (None: not offered there), its ChatTTS-native name, and its kind and range."""

    field: str
    openai: str | None
    native: str
    kind: str  # "number", "integer" or "flag"
    lo: float = 0.0
    hi: float = 0.0
    open_low: bool = False  # lo itself is refused


_TEMPERATURE = _Knob("temperature", "temperature", "temperature", "number", 0.0, 5.0, open_low=True)
_SHARED_KNOBS = (
    _Knob("top_p", "top_p", "top_P", "number", 0.0, 1.0),
    _Knob("top_k", "top_k", "top_K", "integer", 1, 100000),
    _Knob("repetition_penalty", "repetition_penalty", "repetition_penalty", "number", 0.0, 100.0, open_low=True),
    _Knob("max_new_token", "max_new_token", "max_new_token", "integer", 1, 4096),
    _Knob("min_new_token", "min_new_token", "min_new_token", "integer", 0, 4096),
    _Knob("ensure_non_empty", None, "ensure_non_empty", "flag"),
)
# the code knobs (temperature apart: the native endpoint also takes one per code stream)
CODE_KNOBS = (*_SHARED_KNOBS, _Knob("stream_batch", "stream_batch", "stream_batch", "integer", 1, 4096))
REFINE_KNOBS = (*_SHARED_KNOBS, _TEMPERATURE)


def _read_knob(body: dict[str, Any], name: str, knob: _Knob) -> Any:
    if knob.kind == "flag":
        return _flag(body, name, False)
    if knob.kind == "integer":
        return _integer(body, name, int(knob.lo), int(knob.hi))
    return _number(body, name, knob.lo, knob.hi, open_low=knob.open_low)


def read_knobs(body: dict[str, Any], naming: str, knobs: tuple[_Knob, ...],
               base: InferCodeParams | RefineTextParams) -> dict[str, Any]:
    """{field: value} of the knobs `body` gives (by their `naming`, "openai" or "native" names),
    each checked by kind and range; knobs it does not give are left out (`base`'s values stay)."""
    out = {}
    for knob in knobs:
        name = knob.openai if naming == "openai" else knob.native
        if name is not None and body.get(name) is not None:
            out[knob.field] = _read_knob(body, name, knob)
    low, high = out.get("min_new_token", base.min_new_token), out.get("max_new_token", base.max_new_token)
    if low > high:
        raise BadRequest(f"min_new_token ({low}) must not exceed max_new_token ({high})",
                         "min_new_token" if "min_new_token" in out else "max_new_token")
    return out


def _names(naming: str, knobs: tuple[_Knob, ...]) -> set[str]:
    return {n for k in knobs if (n := k.openai if naming == "openai" else k.native) is not None}


_OPENAI_FIELDS = {"model", "input", "voice", "response_format", "speed", "stream_format", "instructions",
                  "seed", "refine", "stream", "deadline_s", "normalize", "stream_lookahead"} | _names("openai", (*CODE_KNOBS, _TEMPERATURE))


def parse_openai(body: Any, defaults: SynthParams, max_chars: int) -> SpeechRequest:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _unknown(body, _OPENAI_FIELDS, "the request")
    model = _get(body, "model", (str,), "a string")
    text = _text(body, "input", max_chars)
    _get(body, "instructions", (str,), "a string")
    voice = _voice(body, "default")
    fmt, sfmt, stream, deadline = _common(body, "mp3")
    speed = _number(body, "speed", MIN_SPEED, MAX_SPEED, 1.0)
    code = defaults.code
    seed = _integer(body, "seed", 0, _SEED_MAX, code.seed)
    code = replace(code, seed=seed, **read_knobs(body, "openai", (*CODE_KNOBS, _TEMPERATURE), code))
    refine = RefineTextParams(seed=seed) if _flag(body, "refine", True) else None
    params = replace(defaults, code=code, refine=refine, text_normalization=_flag(body, "normalize", True))
    return SpeechRequest(text, params, _model(model), voice, fmt, sfmt, stream, deadline, speed,
                         _stream_lookahead(body))


def _model(model: str | None) -> str | None:
    return None if model is None or model in OPENAI_MODELS or model == "chattts" else model


_NATIVE_FIELDS = {"text", "model", "voice", "params_infer_code", "params_refine_text", "skip_refine_text",
                  "use_decoder", "do_text_normalization", "do_homophone_replacement", "lang", "response_format",
                  "stream", "stream_format", "deadline_s", "normalize", "stream_lookahead"}
_CODE_FIELDS = {"prompt", "spk_emb", "spk_smp", "txt_smp", "temperature", "manual_seed"} | _names("native", CODE_KNOBS)
_REFINE_FIELDS = {"prompt", "manual_seed"} | _names("native", REFINE_KNOBS)


def _section(body: dict[str, Any], name: str, known: set[str]) -> dict[str, Any]:
    section = body.get(name)
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise BadRequest(f"{name} must be a JSON object, got {type(section).__name__}", name)
    _unknown(section, known, name)
    return section


def parse_native(body: Any, max_chars: int, default_seed: int | None = None) -> SpeechRequest:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _unknown(body, _NATIVE_FIELDS, "the request")
    text = _text(body, "text", max_chars)
    model = _get(body, "model", (str,), "a string")
    voice = _voice(body, "default")
    fmt, sfmt, stream, deadline = _common(body, "wav")
    c = _section(body, "params_infer_code", _CODE_FIELDS)
    base = InferCodeParams()
    temps = c.get("temperature", base.temperature)
    if isinstance(temps, list):
        if not temps or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in temps):
            raise BadRequest("params_infer_code.temperature must be a number or a list of numbers", "temperature")
        temps = [float(t) for t in temps]
        if not all(math.isfinite(t) and t > 0 for t in temps):
            raise BadRequest(f"params_infer_code.temperature must be > 0, got {quote(temps)}", "temperature")
    else:
        temps = _number(c, "temperature", 0.0, 5.0, base.temperature, open_low=True)
    seed = _integer(c, "manual_seed", 0, _SEED_MAX, default_seed)
    strings = {k: _get(c, k, (str,), "a string") for k in ("spk_emb", "spk_smp")}
    strings |= {k: _optional_text(c, k, max_chars, "params_infer_code") for k in ("prompt", "txt_smp")}
    code = replace(base, prompt=strings["prompt"] if strings["prompt"] is not None else base.prompt,
                   spk_emb=strings["spk_emb"], spk_smp=strings["spk_smp"], txt_smp=strings["txt_smp"],
                   temperature=temps, seed=seed, **read_knobs(c, "native", CODE_KNOBS, base))
    refine = None
    if not _flag(body, "skip_refine_text", False):
        r = _section(body, "params_refine_text", _REFINE_FIELDS)
        rb = RefineTextParams()
        rseed = _integer(r, "manual_seed", 0, _SEED_MAX, seed)
        prompt = _optional_text(r, "prompt", max_chars, "params_refine_text")
        refine = replace(rb, prompt=rb.prompt if prompt is None else prompt, seed=rseed,
                         **read_knobs(r, "native", REFINE_KNOBS, rb))
    lang = _get(body, "lang", (str,), "zh, en or null")
    if lang not in (None, "zh", "en"):
        raise BadRequest(f"lang must be zh, en or null, got {quote(lang)}", "lang")
    params = SynthParams(code=code, refine=refine, use_decoder=_flag(body, "use_decoder", True),
                         normalize=_flag(body, "do_text_normalization", True),
                         homophones=_flag(body, "do_homophone_replacement", True), lang=lang,
                         text_normalization=_flag(body, "normalize", True))
    return SpeechRequest(text, params, _model(model), voice, fmt, sfmt, stream, deadline,
                         stream_lookahead=_stream_lookahead(body))
