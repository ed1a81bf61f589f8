"""The generation loop, audio decoding, streaming and batching of the runtime.

`Pipeline(artifact_dir, provider="cpu", threads=None)` runs ChatTTS's inference on an artifact:

    normalise -> (refine: text head) -> decorate + tokenise -> embed (+ speaker) ->
    GPT steps with KV cache -> code heads -> ChatTTS logits processing -> sample ->
    Decoder (hidden states) or DVAE (codes) -> mel -> Vocos -> 24 kHz waveform

Batching: all texts of one call share every GPT step (left padding, as ChatTTS). A row stops when
any of its num_vq streams emits EOS; the loop ends when every row has stopped or after
`max_new_token` steps. Each row is decoded on its own, so a row's result does not depend on the
other rows (ChatTTS decodes a zero-padded batch, which changes the tail of shorter rows).

Streaming (`Pipeline.stream`): the audio that can no longer change is emitted as soon as the first
of it exists (checked every step until then, so first audio is not held to the `stream_batch`
cadence), then every `stream_batch` steps. The Decoder and Vocos are convolutional (non-causal), so
a mel frame depends on `decoder_radius` frames on each side and a sample on `vocos_radius` frames;
the stream decodes only a window (the new part plus that much context) and holds back the last
frames until their right context exists, so the concatenated stream equals the non-streamed waveform
(up to float rounding of convolutions over different lengths, ~1e-6). That right context is what
bounds first audio: `decoder_radius + vocos_radius` mel frames (55 code steps at full size).
`lookahead_frames` trades exactness for latency: samples are emitted once that many mel frames of
right context exist, so the few frames before each chunk boundary are decoded with a truncated
right edge (a low-latency mode, like ChatTTS's own streaming, which is not exact either).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from chattts_forge import chattts_defaults
from chattts_forge.artifact import DECODER, DVAE, DVAE_ENCODER, EMBED, FAST_GPT, GPT, HEAD_CODE, HEAD_TEXT
from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.frontend import (
    DEFAULT_MAX_PROMPT_CODES,
    DEFAULT_MAX_SPEAKER_VALUES,
    TextTokenizer,
    apply_speaker,
    decode_prompt,
    decorate_code_prompts,
    decorate_text_prompts,
    encode_prompt,
    is_speakable,
    max_encoded_chars,
    speaker_vector,
    split_sentences,
)
from chattts_forge.runtime.phrase_cache import PhraseCache, PipelineCache, open_cache
from chattts_forge.runtime.sampling import Sampler, SamplingConfig, SeedGroups, process_logits
from chattts_forge.runtime.session import Artifact, GptStep, GptStepLike
from chattts_forge.runtime.textfront import (  # noqa: F401 - re-exported: the scheduler and callers import them here
    SPLIT_TEXT_FACTOR,
    TEXT_CHARS_PER_POSITION,
    TextFront,
    check_text_length,
)

log = get_logger(__name__)

# GPT engines: `plain` runs gpt.onnx (GptStep); `fast` the fused gpt_fast.onnx with an in-place KV
# cache (runtime.fast_gpt, graph built by quantize.fast_gpt_graph); `auto` takes fast when the artifact
# has it. The default is `auto`, as for `synth`: a service (and the evaluate gate) runs the fast graph
# when it exists.
# On CUDA `auto` takes the plain graph with the cache kept on the device (runtime.device_gpt): the
# fused graph's GroupQueryAttention has no float32 CUDA kernel.
ENGINES = ("auto", "fast", "plain")
# Conv stacks of ChatTTS's DVAEDecoder (fixed in its code, not in the config).
_DVAE_KERNEL = 7
_DVAE_DILATION = 2
_VOCOS_KERNEL = 7
# Extra frames of context beyond the computed receptive fields (costs a little compute only).
_SAFETY_FRAMES = 2


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
    normalize: bool = True
    homophones: bool = True
    lang: str | None = None
    split_sentences: bool = False  # split each text like Chat.infer(split_text=True), then join


@dataclass
class Result:
    """One text's output. `codes` int64 [steps, num_vq]; `hiddens` float32 [steps, hidden]."""

    text: str  # the text the code stage saw (normalised, refined if asked)
    codes: np.ndarray
    hiddens: np.ndarray
    wav: np.ndarray  # float32 [samples] at `sample_rate`
    sample_rate: int = 24000
    cached: bool = False  # served from a phrase cache (Vocos only; `hiddens` is then empty)


class Row(NamedTuple):
    """One normalised text's output inside `synthesize` (before texts split into sentences are joined)."""

    codes: np.ndarray  # int64 [T, num_vq]
    hiddens: np.ndarray  # float32 [T, hidden]; [0, hidden] when served from a phrase cache
    wav: np.ndarray
    cached: bool = False
    text: str | None = None  # what the code stage saw (refined), when it is not the row's normalised text


@dataclass
class StepState:
    """The state of a generation loop after a step (arrays are shared; copy what you keep)."""

    tokens: np.ndarray  # int64 [B, max_new_token, streams]
    hiddens: np.ndarray  # float32 [B, max_new_token, hidden]
    end_idx: np.ndarray  # int64 [B]: kept steps per row (EOS step excluded)
    finish: np.ndarray  # bool [B]
    infer_text: bool
    record_logits: bool
    forced_lengths: list[int] | None = None
    logits: list[np.ndarray] = field(default_factory=list)  # per step [B, streams, V]
    steps: int = 0
    done: bool = False  # True on the last step (all rows stopped or max_new_token reached)

    def result(self) -> Generation:
        batch = self.tokens.shape[0]
        ends = self.end_idx
        ids = [
            self.tokens[b, : ends[b], 0].copy() if self.infer_text else self.tokens[b, : ends[b]].copy()
            for b in range(batch)
        ]
        rec = None
        if self.record_logits and self.logits:
            stacked = np.stack(self.logits, 1)  # [B, steps, streams, V]
            if self.forced_lengths is not None:
                rec = [stacked[b, : self.forced_lengths[b]] for b in range(batch)]
            else:  # every decision of the row, the EOS decision included
                rec = [stacked[b, : ends[b] + (1 if self.finish[b] else 0)] for b in range(batch)]
        return Generation(
            ids=ids,
            hiddens=[self.hiddens[b, : ends[b]].copy() for b in range(batch)],
            processed_logits=rec,
            finished=self.finish.copy(),
        )


@dataclass
class Generation:
    """Raw output of one generation loop over a batch."""

    ids: list[np.ndarray]  # per row: codes [T, num_vq] or text ids [T]
    hiddens: list[np.ndarray]  # per row: [T, hidden]
    processed_logits: list[np.ndarray] | None = None  # per row: [T, streams, V] when recorded
    finished: np.ndarray | None = None  # per row: stopped on EOS (False: hit max_new_token)


def check_engine(engine: str) -> None:
    """ForgeError unless `engine` is one of ENGINES."""
    if engine not in ENGINES:
        raise ForgeError(f"unknown GPT engine '{engine}' (choose from: {', '.join(ENGINES)})")


def choose_engine(artifact: Artifact, engine: str = "auto") -> str:
    """The GPT engine ("fast" or "plain") the runtime runs for `engine` (one of ENGINES) on `artifact`."""
    check_engine(engine)
    if engine == "fast" and not artifact.has_component(FAST_GPT):
        raise ForgeError(f"artifact {artifact.path} has no {FAST_GPT} component (engine 'fast')")
    if engine == "fast":
        return "fast"
    on_cpu = artifact.provider == "cpu"
    return "fast" if engine == "auto" and on_cpu and artifact.has_component(FAST_GPT) else "plain"


def open_gpt_step(artifact: Artifact, engine: str = "auto") -> GptStepLike:
    """A new GPT step (its own KV cache) of `artifact` for `engine` (see `choose_engine`)."""
    if choose_engine(artifact, engine) == "fast":
        from chattts_forge.runtime.fast_gpt import FastGptStep

        return FastGptStep.from_artifact(artifact)
    if artifact.provider == "cuda":
        from chattts_forge.runtime.device_gpt import DeviceGptStep

        return DeviceGptStep(artifact.session(GPT), artifact.dims, device="cuda")
    return GptStep(artifact.session(GPT), artifact.dims)


def position_ids(attention_mask: np.ndarray) -> np.ndarray:
    """ChatTTS: cumsum(attention_mask) - 1, masked positions set to 1."""
    pos = np.cumsum(attention_mask, axis=1) - 1
    pos[attention_mask == 0] = 1
    return pos.astype(np.int64)


# ---- request parameters: types and ranges, checked once where a request enters -------------------

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
        raise ForgeError(f"{where} must be a whole number, got {type(value).__name__} {str(value)[:40]!r}")
    if value < low or (high is not None and value > high):  # type: ignore[operator]
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ForgeError(f"{where} must be {span}, got {value}")


def _check_real(where: str, value: object, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_real(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise ForgeError(f"{where} must be a finite number, got {type(value).__name__} {str(value)[:40]!r}")


def _check_bool(where: str, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ForgeError(f"{where} must be true or false, got {type(value).__name__} {str(value)[:40]!r}")


def _check_optional_str(where: str, value: object, limit: int) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise ForgeError(f"{where} must be a string or None, got {type(value).__name__}")
    if len(value) > limit:
        raise ForgeError(f"{where} is {len(value)} characters long, more than {limit}")


def check_sampling_params(params: InferCodeParams | RefineTextParams, where: str, max_positions: int | None) -> None:
    """The knobs code generation and refinement share: types first, then ranges (one-line ForgeError
    naming the field)."""
    if not isinstance(params.prompt, str) or len(params.prompt) > MAX_PROMPT_CHARS:
        raise ForgeError(f"{where}.prompt must be a string of at most {MAX_PROMPT_CHARS} characters")
    temps = params.temperature
    if isinstance(temps, (list, tuple)):
        if not temps:
            raise ForgeError(f"{where}.temperature must be a number or a non-empty list of numbers")
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
    _check_sampling(tuple(float(t) for t in listed), params.top_p, params.top_k, params.max_new_token,
                    params.min_new_token, params.repetition_penalty)


def check_synth_params(params: object, max_positions: int | None = None, max_text_chars: int | None = None) -> SynthParams:
    """Validate a request's parameters by type and range before anything runs on them (the scheduler's
    `submit`, `Pipeline.synthesize`/`stream`, compat, a server): a one-line ForgeError naming the
    first bad field, else `params` unchanged. `max_positions` (the model's) bounds max_new_token;
    `max_text_chars` bounds txt_smp."""
    if not isinstance(params, SynthParams):
        raise ForgeError(f"params must be SynthParams, got {type(params).__name__}")
    code = params.code
    if not isinstance(code, InferCodeParams):
        raise ForgeError(f"params.code must be InferCodeParams, got {type(code).__name__}")
    if params.refine is not None and not isinstance(params.refine, RefineTextParams):
        raise ForgeError(f"params.refine must be RefineTextParams or None, got {type(params.refine).__name__}")
    for name in ("use_decoder", "normalize", "homophones", "split_sentences"):
        _check_bool(f"params.{name}", getattr(params, name))
    if params.lang not in (None, "zh", "en"):
        raise ForgeError(f"params.lang must be None, 'zh' or 'en', got {str(params.lang)[:40]!r}")
    check_sampling_params(code, "params.code", max_positions)
    # Speaker strings are bounded again (tighter, by the model) when decoded; this bounds the work before.
    _check_optional_str("params.code.spk_emb", code.spk_emb, max_encoded_chars(2 * DEFAULT_MAX_SPEAKER_VALUES))
    _check_optional_str("params.code.spk_smp", code.spk_smp, max_encoded_chars(2 * DEFAULT_MAX_PROMPT_CODES) + 8)
    _check_optional_str("params.code.txt_smp", code.txt_smp, max_text_chars or 1 << 20)
    _check_whole("params.code.stream_batch", code.stream_batch, 1)
    if params.refine is not None:
        check_sampling_params(params.refine, "params.refine", max_positions)
    return params


def _check_sampling(temperature: Sequence[float], top_p: float | None, top_k: int | None,
                    max_new_token: int, min_new_token: int, penalty: float | None) -> None:
    if any(not (t > 0) or not math.isfinite(t) for t in temperature):
        raise ForgeError(f"temperature must be > 0, got {list(temperature)}")
    if top_p is not None and not (0 <= top_p <= 1):
        raise ForgeError(f"top-p must lie in [0, 1], got {top_p}")
    if top_k is not None and top_k < 1:
        raise ForgeError(f"top-k must be >= 1, got {top_k}")
    if max_new_token < 1:
        raise ForgeError(f"max-new-token must be >= 1, got {max_new_token}")
    if not (0 <= min_new_token <= max_new_token):
        raise ForgeError(f"min-new-token must lie in [0, max-new-token={max_new_token}], got {min_new_token}")
    if penalty is not None and not (penalty > 0):
        raise ForgeError(f"repetition penalty must be > 0, got {penalty}")


class Pipeline:
    """ChatTTS inference on an artifact folder, torch-free. See the package docstring for the API."""

    def __init__(
        self,
        artifact_dir: str | os.PathLike[str],
        provider: str = "cpu",
        threads: int | None = None,
        verify: str = "sha256",
        engine: str = "auto",
        cache: PhraseCache | str | os.PathLike[str] | None = None,
        public_key: str | os.PathLike[str] | None = None,
    ) -> None:
        """`verify`: how the artifact's files are checked before use (sha256 (default, cached), full,
        size, none: chattts_forge.integrity); `public_key`: the folder's model.sig must verify with it."""
        check_engine(engine)  # before opening the artifact: a typo is reported first
        self._open(Artifact(artifact_dir, provider=provider, threads=threads, verify=verify, public_key=public_key),
                   engine, cache)

    @classmethod
    def from_artifact(
        cls, artifact: Artifact, engine: str = "auto", cache: PhraseCache | str | os.PathLike[str] | None = None
    ) -> Pipeline:
        """A Pipeline over an artifact already open (its files checked, its sessions reused: the Router
        hands on what its autotune measured, so those sessions are opened once)."""
        check_engine(engine)
        pipe = cls.__new__(cls)
        pipe._open(artifact, engine, cache)
        return pipe

    def _open(self, artifact: Artifact, engine: str, cache: PhraseCache | str | os.PathLike[str] | None) -> None:
        self.artifact = artifact
        self.engine = choose_engine(self.artifact, engine)
        self.dims = self.artifact.dims
        self.num_vq = self.dims.num_vq
        self.eos_code = self.dims.num_audio_tokens - 1
        self.sample_rate = self.dims.sample_rate
        self.hop = self.dims.hop_length
        self.tokenizer = TextTokenizer(self.artifact.file("tokenizer"))
        # normalisation and the speakers: the same object a Router measures lengths with (no session)
        self.text = TextFront(self.artifact.path, self.artifact.meta, self.artifact.verification)
        self.normalizer = self.text.normalizer
        self._gpt: GptStepLike | None = None
        # A warm phrase cache (runtime.phrase_cache): refused here unless built for this artifact.
        self.cache: PipelineCache | None = open_cache(cache, self) if cache is not None else None

    @property
    def gpt(self) -> GptStepLike:
        """The GPT step with its KV cache (created on first use for `self.engine`)."""
        if self._gpt is None:
            self._gpt = open_gpt_step(self.artifact, self.engine)
        return self._gpt

    @gpt.setter
    def gpt(self, step: GptStepLike) -> None:
        """Replace the GPT step (public hook: any `GptStepLike`, e.g. a timing or teacher-forcing wrapper)."""
        self._gpt = step

    # ---- front end ------------------------------------------------------------------------

    def normalize(self, text: str, params: SynthParams | None = None) -> str:
        """ChatTTS's normalisation of one text; ForgeError for empty or unspeakable text."""
        return self.text.normalize(text, params or SynthParams())

    def max_text_chars(self, split_sentences: bool = False) -> int:
        """The longest input text accepted (`TextFront.max_text_chars`)."""
        return self.text.max_text_chars(split_sentences)

    def max_recording_samples(self) -> int:
        """The longest voice-clone recording accepted: its codes (one per 2 hops) must fit the positions."""
        return 2 * self.dims.hop_length * self.dims.max_position_embeddings

    def random_speaker(self, seed: int | None = None) -> str:
        """A random speaker string from the artifact's speaker statistics (`Chat.sample_random_speaker`)."""
        return self.text.random_speaker(seed)

    # ---- voice cloning ---------------------------------------------------------------------

    def check_recording(self, wav: object, what: str = "wav") -> np.ndarray:
        """A recording as ChatTTS's `sample_audio_speaker` takes it: 1-D float samples at the model's
        rate (24 kHz), at least n_fft/2 + 1 long. float64/float16 are cast to float32 (ChatTTS needs
        float32); anything else is a one-line ForgeError naming `what`."""
        try:
            arr = np.asarray(wav)
        except Exception as e:  # e.g. a CUDA tensor: numpy cannot read it
            raise ForgeError(f"{what} must be a numpy array (or CPU tensor) of samples: {e}") from None
        if arr.ndim != 1:
            raise ForgeError(
                f"{what} must be 1-D [samples] (one mono {self.sample_rate} Hz recording), got shape {arr.shape}"
            )
        if not np.issubdtype(arr.dtype, np.floating):
            hint = " (divide int16 PCM by 32768)" if np.issubdtype(arr.dtype, np.integer) else ""
            raise ForgeError(f"{what} must hold float samples in [-1, 1], got dtype {arr.dtype}{hint}")
        if arr.size == 0:
            raise ForgeError(f"{what} is empty")
        longest = self.max_recording_samples()
        if arr.size > longest:
            raise ForgeError(f"{what} has {arr.size} samples ({arr.size / self.sample_rate:.1f} s); its codes would "
                             f"not fit the model's {self.dims.max_position_embeddings} positions (at most {longest})")
        shortest = self.dims.n_fft // 2 + 1
        if arr.size < shortest:
            raise ForgeError(f"{what} has {arr.size} samples; the encoder needs at least {shortest}")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.all(np.isfinite(arr)):
            raise ForgeError(f"{what} holds NaN or infinite samples")
        return arr

    def encode_audio(self, wav: object) -> np.ndarray:
        """ChatTTS's `DVAE.sample_audio`: a recording [samples] -> audio codes int64 [num_vq, T]."""
        arr = self.check_recording(wav)
        if not self.artifact.has_component(DVAE_ENCODER):
            raise ForgeError(
                f"artifact {self.artifact.path} has no {DVAE_ENCODER}.onnx (converted before voice "
                "cloning existed): convert the checkpoint again to make speakers from recordings"
            )
        return self.artifact.session(DVAE_ENCODER).run(["codes"], {"wav": arr[None]})[0][0]

    def sample_audio_speaker(self, wav: object) -> str:
        """`Chat.sample_audio_speaker`: a 24 kHz recording -> the `spk_smp` string ChatTTS makes of it."""
        return encode_prompt(self.encode_audio(wav))

    def speaker_sample_codes(self, spk_smp: str) -> np.ndarray:
        """A `spk_smp` string -> codes [num_vq, T], checked against this model (ForgeError naming spk_smp)."""
        try:  # a prompt longer than the model's positions could never be fed: the decode stops there
            codes = decode_prompt(spk_smp, max_codes=self.num_vq * self.dims.max_position_embeddings)
        except ForgeError as e:
            raise ForgeError(f"spk_smp: {e}") from None
        if codes.shape[0] != self.num_vq or codes.shape[1] == 0:
            raise ForgeError(
                f"spk_smp holds codes of shape {codes.shape}, this model takes [{self.num_vq}, T > 0] "
                "(a sample string from another model?)"
            )
        if codes.max() >= self.eos_code:
            raise ForgeError(
                f"spk_smp holds code {int(codes.max())}, this model's codes are < {self.eos_code} "
                "(a sample string from another model?)"
            )
        return codes

    def prepare_code_inputs(
        self, texts: Sequence[str], params: InferCodeParams
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(inputs_embeds [B, L, hidden], input_ids [B, L, num_vq], attention_mask [B, L]) of `_infer_code`."""
        prompt = self.speaker_sample_codes(params.spk_smp) if params.spk_smp is not None else None
        decorated = decorate_code_prompts(list(texts), params.prompt, params.txt_smp, params.spk_emb)
        input_ids, attention_mask, text_mask = self.tokenizer.encode(decorated, self.num_vq, prompt)
        self._check_length(input_ids.shape[1], params.max_new_token)
        emb = self.embed(input_ids, text_mask)
        if params.spk_emb is not None:
            vec = speaker_vector(params.spk_emb, self.dims.hidden_size)
            apply_speaker(emb, input_ids, self.tokenizer.spk_emb_id, vec)
        return emb, input_ids, attention_mask

    def _check_length(self, prompt_len: int, max_new_token: int) -> None:
        limit = self.dims.max_position_embeddings
        if prompt_len + max_new_token > limit:
            raise ForgeError(
                f"input too long: {prompt_len} prompt tokens + max-new-token {max_new_token} exceed the "
                f"model's {limit} positions; shorten the text, lower --max-new-token or split sentences"
            )

    def embed(self, input_ids: np.ndarray, text_mask: np.ndarray) -> np.ndarray:
        out = self.artifact.session(EMBED).run(
            ["inputs_embeds"], {"input_ids": input_ids.astype(np.int64), "text_mask": text_mask.astype(bool)}
        )[0]
        return np.array(out, dtype=np.float32)  # writable copy (speaker injection)

    # ---- the generation loop -------------------------------------------------------------

    def generate(self, *args, **kwargs) -> Generation:
        """Run `iter_generate` to the end and return its result."""
        return _last(self.iter_generate(*args, **kwargs)).result()

    def iter_generate(
        self,
        emb: np.ndarray,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        cfg: SamplingConfig,
        *,
        infer_text: bool,
        max_new_token: int,
        seed: int | SeedGroups | None,
        ensure_non_empty: bool = True,
        forced: Sequence[np.ndarray] | None = None,
    ) -> Iterator[StepState]:
        """ChatTTS's `GPT.generate` with a KV cache, one yielded `StepState` per step.

        Steps until every row emitted EOS (any of its streams) or `max_new_token`. `forced`
        (teacher forcing, codes only): per row int [T, num_vq]; each step takes the given tokens
        (EOS after a row's end) instead of samples, and the processed logits are recorded. `seed`:
        one seed for every row, or `SeedGroups` (groups of rows sampled as separate batches would be).
        """
        batch = input_ids.shape[0]
        streams = 1 if infer_text else self.num_vq
        head = self.artifact.session(HEAD_TEXT if infer_text else HEAD_CODE)
        head_out = head.get_outputs()[0].name
        sampler = Sampler(cfg, streams, batch, seed)
        state = StepState(
            tokens=np.zeros((batch, max_new_token, streams), dtype=np.int64),
            hiddens=np.zeros((batch, max_new_token, self.dims.hidden_size), dtype=np.float32),
            end_idx=np.zeros(batch, dtype=np.int64),
            finish=np.zeros(batch, dtype=bool),
            infer_text=infer_text,
            record_logits=forced is not None,
            forced_lengths=None if forced is None else [len(f) for f in forced],
        )
        mask = attention_mask.astype(np.int64)
        reserve = getattr(self.gpt, "reserve", None)  # engines with a preallocated cache (FastGptStep)
        if reserve is not None:  # size the cache by the request, not by the model's positions
            reserve(mask.shape[1] + max_new_token)
        self.gpt.reset(batch)
        hidden = self.gpt(emb, mask, position_ids(mask))[:, -1]
        for step in range(max_new_token):
            if step > 0:
                new_ids = state.tokens[:, step - 1 : step, :]
                if infer_text:
                    new_ids = np.repeat(new_ids, self.num_vq, axis=2)
                step_emb = self.embed(new_ids, np.full((batch, 1), infer_text, dtype=bool))
                mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
                hidden = self.gpt(step_emb, mask, mask.sum(axis=1, keepdims=True) - 1)[:, -1]
            state.hiddens[:, step] = hidden
            logits = head.run([head_out], {"hidden_states": hidden})[0].reshape(batch * streams, -1)
            # rows (b, stream), columns: the tokens generated so far
            history = state.tokens[:, :step, :].transpose(0, 2, 1).reshape(batch * streams, step)
            scores = process_logits(logits, history, step, cfg, streams)
            if state.record_logits:
                state.logits.append(scores.reshape(batch, streams, -1))
            if forced is not None:
                eos_row = np.full(streams, cfg.eos_token, dtype=np.int64)
                idx = np.stack([f[step] if step < len(f) else eos_row for f in forced])
            else:
                idx = sampler.next_tokens(scores, redraw_ended=step == 0 and ensure_non_empty)
            state.tokens[:, step] = idx
            state.finish |= (idx == cfg.eos_token).any(axis=1)
            state.end_idx += ~state.finish
            state.steps = step + 1
            state.done = bool(state.finish.all()) or step + 1 == max_new_token
            yield state
            if state.finish.all():
                break
        if not state.finish.all():
            log.warning(
                "incomplete result: %d of %d rows hit max_new_token %d",
                int((~state.finish).sum()), batch, max_new_token,
            )

    def code_sampling(self, params: InferCodeParams) -> SamplingConfig:
        temps = params.temperature
        temps = tuple(float(t) for t in temps) if isinstance(temps, (list, tuple)) else (float(temps),) * self.num_vq
        if len(temps) != self.num_vq:
            raise ForgeError(f"give one temperature or {self.num_vq} (one per code stream), got {len(temps)}")
        _check_sampling(temps, params.top_p, params.top_k, params.max_new_token, params.min_new_token,
                        params.repetition_penalty)
        return SamplingConfig(
            temperature=temps,
            top_p=params.top_p,
            top_k=params.top_k,
            repetition_penalty=params.repetition_penalty,
            min_new_token=params.min_new_token,
            eos_token=self.eos_code,
            max_input_ids=self.eos_code,  # ChatTTS passes num_code = num_audio_tokens - 1
        )

    def infer_code(self, texts: Sequence[str], params: InferCodeParams) -> Generation:
        """ChatTTS's `_infer_code` on already normalised texts (one batch)."""
        return _last(self.iter_infer_code(texts, params)).result()

    def iter_infer_code(self, texts: Sequence[str], params: InferCodeParams) -> Iterator[StepState]:
        if not texts:
            raise ForgeError("no text to synthesize")
        cfg = self.code_sampling(params)
        emb, input_ids, mask = self.prepare_code_inputs(texts, params)
        return self.iter_generate(
            emb, input_ids, mask, cfg, infer_text=False, max_new_token=params.max_new_token,
            seed=params.seed, ensure_non_empty=params.ensure_non_empty,
        )

    def teacher_forced_logits(
        self, texts: Sequence[str], codes: Sequence[np.ndarray], params: InferCodeParams
    ) -> list[np.ndarray]:
        """Processed logits [T_b, num_vq, num_audio_tokens] per text when fed `codes[b]` [T_b, num_vq].

        Step i's logits predict code i from the prompt and codes < i, after temperature, repetition
        penalty, top-p, top-k and the min_new_token EOS mask (what ChatTTS's softmax sees).
        """
        if len(codes) != len(texts):
            raise ForgeError(f"need one code array per text ({len(codes)} != {len(texts)})")
        forced = [np.asarray(c, dtype=np.int64).reshape(-1, self.num_vq) for c in codes]
        steps = max(len(c) for c in forced)
        params = replace(params, max_new_token=max(steps, 1))
        cfg = self.code_sampling(params)
        emb, input_ids, mask = self.prepare_code_inputs(texts, params)
        gen = self.generate(
            emb, input_ids, mask, cfg, infer_text=False, max_new_token=steps, seed=0, forced=forced
        )
        return gen.processed_logits or []

    def refine_generation(self, texts: Sequence[str], params: RefineTextParams) -> Generation:
        """ChatTTS's `_refine_text` on normalised texts: `.ids[b]` the text-head tokens (EOS excluded)."""
        temps = (float(params.temperature),)
        _check_sampling(temps, params.top_p, params.top_k, params.max_new_token, params.min_new_token,
                        params.repetition_penalty)
        cfg = SamplingConfig(
            temperature=temps,
            top_p=params.top_p,
            top_k=params.top_k,
            repetition_penalty=params.repetition_penalty,
            min_new_token=params.min_new_token,
            eos_token=self.tokenizer.eos_id,
            max_input_ids=self.tokenizer.vocab_size,
        )
        if not self.artifact.has_component(HEAD_TEXT):
            raise ForgeError(f"artifact {self.artifact.path} has no head_text.onnx: refinement is unavailable")
        decorated = decorate_text_prompts(list(texts), params.prompt)
        input_ids, mask, text_mask = self.tokenizer.encode(decorated, self.num_vq)
        self._check_length(input_ids.shape[1], params.max_new_token)
        emb = self.embed(input_ids, text_mask)
        return self.generate(
            emb, input_ids, mask, cfg, infer_text=True, max_new_token=params.max_new_token,
            seed=params.seed, ensure_non_empty=params.ensure_non_empty,
        )

    def refine_text(self, texts: Sequence[str], params: RefineTextParams) -> list[str]:
        """Refined texts: `refine_generation`, tokens >= [break_0] dropped, decoded (as `Chat._infer`)."""
        gen = self.refine_generation(texts, params)
        return [self.tokenizer.decode(ids[ids < self.tokenizer.break_0_id].tolist()) for ids in gen.ids]

    # ---- audio ----------------------------------------------------------------------------

    def decode_mel(self, x: np.ndarray, use_decoder: bool = True) -> np.ndarray:
        """Hidden states [T, hidden] (Decoder) or codes [T, num_vq] (DVAE) -> mel [n_mels, 2T]."""
        if use_decoder:
            feed = {"hidden_states": np.ascontiguousarray(x.T[None], dtype=np.float32)}
            return self.artifact.session(DECODER).run(["mel"], feed)[0][0]
        feed = {"codes": np.ascontiguousarray(x.T[None], dtype=np.int64)}
        return self.artifact.session(DVAE).run(["mel"], feed)[0][0]

    def vocos(self, mel: np.ndarray) -> np.ndarray:
        """mel [n_mels, F] -> waveform [hop * (F - 1)] (FP32 Vocos)."""
        return self.artifact.session("vocos").run(["waveform"], {"mel": np.ascontiguousarray(mel[None], dtype=np.float32)})[0][0]

    def decode(self, items: Sequence[np.ndarray], use_decoder: bool = True) -> list[np.ndarray]:
        """Waveform per item (each decoded alone: hop * (2T - 1) samples, empty for T = 0)."""
        wavs = []
        for x in items:
            x = np.asarray(x)
            if x.ndim != 2:
                raise ForgeError(f"decode input must be 2-D [T, channels], got shape {x.shape}")
            wavs.append(self.vocos(self.decode_mel(x, use_decoder)) if len(x) else np.zeros(0, np.float32))
        return wavs

    def decode_to_wavs(self, items: Sequence[np.ndarray], use_decoder: bool = True) -> np.ndarray:
        """ChatTTS's `_decode_to_wavs`: one zero-padded batch, float32 [items, hop * (2 T_max - 1)]."""
        if not items:
            return np.zeros((0, 0), dtype=np.float32)
        t_max = max(len(x) for x in items)
        chans = items[0].shape[1]
        batch = np.zeros((len(items), chans, t_max), dtype=np.float32 if use_decoder else np.int64)
        for i, x in enumerate(items):
            batch[i, :, : len(x)] = np.asarray(x).T
        name, comp = ("hidden_states", DECODER) if use_decoder else ("codes", DVAE)
        mel = self.artifact.session(comp).run(["mel"], {name: batch})[0]
        return self.artifact.session("vocos").run(["waveform"], {"mel": mel})[0]

    @property
    def decoder_radius(self) -> int:
        """Mel frames on each side that one Decoder/DVAE output frame depends on."""
        layers = max(self.dims.decoder.n_layer, self.dims.dvae_decoder.n_layer)
        return 3 + layers * _DVAE_DILATION * (_DVAE_KERNEL // 2) + _SAFETY_FRAMES

    @property
    def vocos_radius(self) -> int:
        """Mel frames on each side that one output sample of Vocos depends on (backbone + ISTFT)."""
        backbone = (_VOCOS_KERNEL // 2) * (1 + self.dims.vocos_num_layers)
        istft = math.ceil(self.dims.n_fft / (2 * self.hop))
        return backbone + istft + _SAFETY_FRAMES

    # ---- whole texts ----------------------------------------------------------------------

    def prepare_texts(self, texts: Sequence[str], params: SynthParams) -> tuple[list[str], list[int]]:
        """Normalised (and split, if asked) texts, refined if asked, plus for each the index of the
        input it came from."""
        out, owner = self.normalize_texts(texts, params)
        return self.refine_texts(out, params, owner), owner

    def normalize_texts(self, texts: Sequence[str], params: SynthParams) -> tuple[list[str], list[int]]:
        """`prepare_texts` before refinement (what a phrase cache is keyed by)."""
        check_synth_params(params, self.dims.max_position_embeddings, self.max_text_chars())
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, Sequence):
            raise ForgeError(f"texts must be a string or a list of strings, got {type(texts).__name__}")
        if not texts:
            raise ForgeError("no text to synthesize")
        out, owner = [], []
        for i, t in enumerate(texts):
            if isinstance(t, str):  # before splitting: a huge text is refused before any work on it
                check_text_length(t, self.max_text_chars(params.split_sentences))
            if not isinstance(t, str) or not t.strip():
                raise ForgeError(f"empty text (item {i})" if len(texts) > 1 else "empty text")
            parts = split_sentences(t) if params.split_sentences else [t]
            for p in parts:
                out.append(self.normalize(p, params))
                owner.append(i)
        return out, owner

    def refine_texts(self, norm: Sequence[str], params: SynthParams, owner: Sequence[int] | None = None) -> list[str]:
        """Normalised texts refined as one batch when `params.refine` asks (else as they are); `owner`:
        the input index of each, for the error naming a text refined into nothing speakable."""
        if params.refine is None or not norm:
            return list(norm)
        out = self.refine_text(norm, params.refine)
        for r, t in enumerate(out):
            if not is_speakable(t):
                raise ForgeError(f"refinement of text {owner[r] if owner is not None else r} produced nothing speakable")
        return out

    def synthesize(self, texts: str | Sequence[str], params: SynthParams | None = None) -> list[Result]:
        """One Result per input text; all texts share the GPT steps (one batch). With a phrase cache
        (`cache=`), cached texts skip the code stage and the Decoder (`Result.cached`)."""
        params = params or SynthParams()
        if self.cache is not None:  # keyed by the text before refinement: a hit is not refined again
            norm, owner = self.normalize_texts(texts, params)
            rows = self.cache.synthesize_rows(self, norm, params, owner)
        else:
            norm, owner = self.prepare_texts(texts, params)
            rows = self.synthesize_rows(norm, params)
        n_inputs = 1 if isinstance(texts, str) else len(texts)
        results = []
        for i in range(n_inputs):
            mine = [r for r, o in enumerate(owner) if o == i]
            results.append(
                Result(
                    text=" ".join(rows[r].text or norm[r] for r in mine),
                    codes=np.concatenate([rows[r].codes for r in mine]).reshape(-1, self.num_vq),
                    hiddens=np.concatenate([rows[r].hiddens for r in mine]).reshape(-1, self.dims.hidden_size),
                    wav=np.concatenate([rows[r].wav for r in mine]).astype(np.float32),
                    sample_rate=self.sample_rate,
                    cached=all(rows[r].cached for r in mine),
                )
            )
        return results

    def synthesize_rows(self, norm: Sequence[str], params: SynthParams) -> list[Row]:
        """(codes [T, num_vq], hiddens [T, hidden], wav) per normalised text, generated as one batch."""
        gen = self.infer_code(norm, params.code)
        items = gen.hiddens if params.use_decoder else gen.ids
        wavs = self.decode(items, params.use_decoder)
        for r, g in enumerate(gen.ids):
            if len(g) == 0:
                log.warning("row %d ended at its first step: no audio", r)
        return [Row(c, h, w) for c, h, w in zip(gen.ids, gen.hiddens, wavs, strict=True)]

    def stream(
        self,
        texts: str | Sequence[str],
        params: SynthParams | None = None,
        stream_batch: int | None = None,
        on_done: Callable[[Generation], None] | None = None,
        lookahead_frames: int | None = None,
        progress: Callable[[StepState], None] | None = None,
    ) -> Iterator[list[np.ndarray]]:
        """Yield one float32 chunk per input text (possibly empty): a first chunk as soon as any
        row has final audio, then every `stream_batch` steps (default params.code.stream_batch = 24).
        Concatenating a text's chunks gives its waveform. `lookahead_frames` (default: the exact
        right context, `decoder_radius + vocos_radius`) lowers first-audio latency at the cost of
        exactness near chunk boundaries. `on_done(generation)` receives the codes and hidden states
        after the last chunk; `progress(state)` is called after every step, before that step's chunk
        (if any) is yielded, so it sees which rows have ended (`state.finish`)."""
        params = params or SynthParams()
        every = stream_batch or params.code.stream_batch
        if every < 1:
            raise ForgeError(f"stream batch must be >= 1, got {every}")
        if params.split_sentences:
            raise ForgeError("streaming does not support sentence splitting; give one text per line instead")
        norm, _ = self.prepare_texts(texts, params)
        decoders = [StreamDecoder(self, params.use_decoder, lookahead_frames) for _ in norm]
        live_steps = 0
        first_sent = False  # no chunk with audio yet: check every step (arithmetic only)
        for state in self.iter_infer_code(norm, params.code):
            live_steps += 1
            if progress is not None:
                progress(state)
            due = live_steps % every == 0 or state.done
            if not due and not first_sent:
                due = any(
                    d.ready_samples(int(state.end_idx[b]), bool(state.finish[b])) > d.emitted
                    for b, d in enumerate(decoders)
                )
            if not due:
                continue
            chunk = []
            for b, dec in enumerate(decoders):
                n = int(state.end_idx[b])
                src = state.hiddens[b, :n] if params.use_decoder else state.tokens[b, :n]
                chunk.append(dec.push(src, final=bool(state.finish[b]) or state.done))
            first_sent = first_sent or any(len(c) for c in chunk)
            yield chunk
        if on_done is not None:
            on_done(state.result())


class StreamDecoder:
    """Incremental audio of one row: `push(all steps so far)` returns the new, final samples.

    Only samples whose whole receptive field is known are emitted; each push decodes a window of
    the new frames plus `decoder_radius` / `vocos_radius` frames of context, never the whole prefix.
    """

    def __init__(self, pipe: Pipeline, use_decoder: bool = True, lookahead_frames: int | None = None) -> None:
        self.pipe = pipe
        self.use_decoder = use_decoder
        self.hop = pipe.hop
        self.rd = pipe.decoder_radius
        self.rv = pipe.vocos_radius
        exact = self.rd + self.rv  # mel frames of right context a sample's whole receptive field spans
        if lookahead_frames is not None and lookahead_frames < 0:
            raise ForgeError(f"stream lookahead must be >= 0 mel frames, got {lookahead_frames}")
        self.lookahead = exact if lookahead_frames is None else min(lookahead_frames, exact)
        self.emitted = 0  # samples already returned
        self.closed = False

    def ready_samples(self, n: int, final: bool = False) -> int:
        """Samples that can be emitted once `n` code steps exist (all of them when `final`)."""
        frames = 2 * n
        if final:
            return self.hop * (frames - 1) if n else 0
        return max(0, (frames - self.lookahead) * self.hop)

    def push(self, steps: np.ndarray, final: bool = False) -> np.ndarray:
        """`steps`: every step so far ([T, hidden] or [T, num_vq]); `final`: the row has ended."""
        if self.closed:
            return np.zeros(0, dtype=np.float32)
        n = len(steps)
        frames = 2 * n
        ready = self.ready_samples(n, final)
        self.closed = final
        if ready <= self.emitted:
            return np.zeros(0, dtype=np.float32)
        s0, s1 = self.emitted, ready
        # mel frames Vocos needs for samples [s0, s1)
        fa = max(0, s0 // self.hop - self.rv)
        fb = min(frames, -(-s1 // self.hop) + self.rv)
        # hidden steps the Decoder needs for mel frames [fa, fb)
        ta = max(0, (fa - self.rd) // 2)
        tb = min(n, -(-(fb + self.rd) // 2))
        mel = self.pipe.decode_mel(steps[ta:tb], self.use_decoder)[:, fa - 2 * ta : fb - 2 * ta]
        wav = self.pipe.vocos(mel)
        out = wav[s0 - fa * self.hop : s1 - fa * self.hop]
        if len(out) != s1 - s0:
            raise RuntimeError(f"stream window too short: {len(out)} != {s1 - s0} samples")
        self.emitted = s1
        return out.astype(np.float32, copy=False)


def _last(it: Iterator[StepState]) -> StepState:
    state = None
    for state in it:  # noqa: B007 - the last state holds the result
        pass
    if state is None:
        raise RuntimeError("generation produced no step")
    return state

