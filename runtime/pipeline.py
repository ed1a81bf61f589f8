"""The runtime's pipeline: text in, 24 kHz audio out, on one artifact folder.

`Pipeline(artifact_dir, provider="cpu", threads=None)` runs ChatTTS's inference on an artifact:

    normalise -> (refine: text head) -> decorate + tokenise -> embed (+ speaker) ->
    GPT steps with KV cache -> code heads -> ChatTTS logits processing -> sample ->
    Decoder (hidden states) or DVAE (codes) -> mel -> Vocos -> 24 kHz waveform

Its parts live in their own modules: the request parameters and their checks (runtime.params), the
generation loop and its batching of texts (runtime.generation: all texts of one call share every GPT
step), streaming decode (runtime.stream_decode) and voice cloning (runtime.voice_clone). Each row is
decoded on its own, so a row's result does not depend on the other rows (ChatTTS decodes a
zero-padded batch, which changes the tail of shorter rows).

Streaming (`Pipeline.stream`): the audio that can no longer change is emitted as soon as the first
of it exists (checked every step until then, so first audio is not held to the `stream_batch`
cadence), then every `stream_batch` steps; runtime.stream_decode says what is exact and why.

The names below are importable from here as before (params, generation and stream types included).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from chattts_forge.artifact import DECODER, DVAE, EMBED, HEAD_TEXT, VOCODER
from chattts_forge.chattts_defaults import CODE_MAX_NEW_TOKEN
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.chattts_speaker import apply_speaker, encode_prompt, speaker_vector
from chattts_forge.runtime.chattts_text import (
    TextTokenizer,
    decorate_code_prompts,
    decorate_text_prompts,
    is_speakable,
    split_sentences,
)
from chattts_forge.runtime.generation import (  # noqa: F401 - re-exported: callers import them here
    ENGINES,
    Generation,
    PromptBatch,
    StepState,
    check_engine,
    choose_engine,
    iter_generate,
    last_state,
    open_gpt_step,
    position_ids,
)
from chattts_forge.runtime.gpt_step import GptStepLike
from chattts_forge.runtime.loaded_artifact import LoadedArtifact
from chattts_forge.runtime.params import (  # noqa: F401 - re-exported: callers import them here
    MAX_PROMPT_CHARS,
    MAX_SEED,
    InferCodeParams,
    RefineTextParams,
    SynthParams,
    check_sampling_params,
    check_sampling_ranges,
    check_synth_params,
)
from chattts_forge.runtime.phrase_cache import PhraseCache, PipelineCache, open_cache
from chattts_forge.runtime.sampling import SamplingConfig
from chattts_forge.runtime.segments import SEGMENT_PAUSE_SECONDS, halve
from chattts_forge.runtime.stream_decode import (  # noqa: F401 - re-exported: callers import StreamDecoder here
    StreamDecoder,
    StreamLookahead,
    decoder_radius,
    resolve_lookahead,
    stream_rows,
    vocos_radius,
)
from chattts_forge.runtime.textfront import (  # noqa: F401 - re-exported: the scheduler and callers import them here
    SPLIT_TEXT_FACTOR,
    TEXT_CHARS_PER_POSITION,
    InputError,
    TextFront,
    check_text_length,
    short_repr,
)
from chattts_forge.runtime.voice_clone import (
    check_recording,
    encode_audio,
    max_recording_samples,
    speaker_sample_codes,
)

log = get_logger(__name__)
# The most segments of long inputs generated as one batch (a row's key/value cache grows with it).
SEGMENT_BATCH = 8

@dataclass
class Result:
    """One text's output. `codes` int64 [steps, num_vq]; `hiddens` float32 [steps, hidden]."""

    text: str  # the text the code stage saw (normalised, refined if asked)
    codes: np.ndarray
    hiddens: np.ndarray
    wav: np.ndarray  # float32 [samples] at `sample_rate`
    sample_rate: int = 24000
    cached: bool = False  # served from a phrase cache (Vocos only; `hiddens` is then empty)


def join_generations(parts: Sequence[Generation]) -> Generation:
    """The generations of one text's segments as one row (codes and hidden states end to end)."""
    ids = [np.concatenate([g.ids[0] for g in parts])]
    hiddens = [np.concatenate([g.hiddens[0] for g in parts])]
    finished = None if any(g.finished is None for g in parts) else np.array([all(bool(g.finished[0]) for g in parts)])
    return Generation(ids, hiddens, finished=finished)


class Row(NamedTuple):
    """One normalised text's output inside `synthesize` (before texts split into sentences are joined)."""

    codes: np.ndarray  # int64 [T, num_vq]
    hiddens: np.ndarray  # float32 [T, hidden]; [0, hidden] when served from a phrase cache
    wav: np.ndarray
    cached: bool = False
    text: str | None = None  # what the code stage saw (refined), when it is not the row's normalised text


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
        self._open(LoadedArtifact(artifact_dir, provider=provider, threads=threads, verify=verify, public_key=public_key),
                   engine, cache)

    @classmethod
    def from_artifact(
        cls, artifact: LoadedArtifact, engine: str = "auto", cache: PhraseCache | str | os.PathLike[str] | None = None
    ) -> Pipeline:
        """A Pipeline over an artifact already open (its files checked, its sessions reused: the Router
        hands on what its autotune measured, so those sessions are opened once)."""
        check_engine(engine)
        pipe = cls.__new__(cls)
        pipe._open(artifact, engine, cache)
        return pipe

    def _open(self, artifact: LoadedArtifact, engine: str, cache: PhraseCache | str | os.PathLike[str] | None) -> None:
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

    def max_text_chars(self, split_sentences: bool = False, segmented: bool = False) -> int:
        """The longest input text accepted (`TextFront.max_text_chars`)."""
        return self.text.max_text_chars(split_sentences, segmented)

    def random_speaker(self, seed: int | None = None) -> str:
        """A random speaker string from the artifact's speaker statistics (`Chat.sample_random_speaker`)."""
        return self.text.random_speaker(seed)

    # ---- voice cloning (runtime.voice_clone) -----------------------------------------------

    def max_recording_samples(self) -> int:
        """The longest voice-clone recording accepted (`voice_clone.max_recording_samples`)."""
        return max_recording_samples(self.dims)

    def check_recording(self, wav: object, what: str = "wav") -> np.ndarray:
        """A recording as ChatTTS's `sample_audio_speaker` takes it (`voice_clone.check_recording`)."""
        return check_recording(wav, self.dims, what)

    def encode_audio(self, wav: object) -> np.ndarray:
        """ChatTTS's `DVAE.sample_audio`: a recording [samples] -> audio codes int64 [num_vq, T]."""
        return encode_audio(self.artifact, wav)

    def sample_audio_speaker(self, wav: object) -> str:
        """`Chat.sample_audio_speaker`: a 24 kHz recording -> the `spk_smp` string ChatTTS makes of it."""
        return encode_prompt(self.encode_audio(wav))

    def speaker_sample_codes(self, spk_smp: str) -> np.ndarray:
        """A `spk_smp` string -> codes [num_vq, T], checked against this model (voice_clone)."""
        return speaker_sample_codes(spk_smp, self.dims)

    def prepare_code_inputs(self, texts: Sequence[str], params: InferCodeParams) -> PromptBatch:
        """(inputs_embeds [B, L, hidden], input_ids [B, L, num_vq], attention_mask [B, L]) of `_infer_code`."""
        prompt = self.speaker_sample_codes(params.spk_smp) if params.spk_smp is not None else None
        decorated = decorate_code_prompts(list(texts), params.prompt, params.txt_smp, params.spk_emb)
        input_ids, attention_mask, text_mask = self.tokenizer.encode(decorated, self.num_vq, prompt)
        self._check_length(input_ids.shape[1], params.max_new_token)
        emb = self.embed(input_ids, text_mask)
        if params.spk_emb is not None:
            vec = speaker_vector(params.spk_emb, self.dims.hidden_size)
            apply_speaker(emb, input_ids, self.tokenizer.spk_emb_id, vec)
        return PromptBatch(emb, input_ids, attention_mask)

    def _check_length(self, prompt_len: int, max_new_token: int) -> None:
        limit = self.dims.max_position_embeddings
        if prompt_len + max_new_token > limit:
            raise BadInput(
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
        """Run the generation loop (`generation.iter_generate` on this pipeline) to the end: its result."""
        return last_state(iter_generate(self, *args, **kwargs)).result()

    def code_sampling(self, params: InferCodeParams) -> SamplingConfig:
        temps = params.temperature
        temps = tuple(float(t) for t in temps) if isinstance(temps, (list, tuple)) else (float(temps),) * self.num_vq
        if len(temps) != self.num_vq:
            raise BadInput(f"give one temperature or {self.num_vq} (one per code stream), got {len(temps)}")
        check_sampling_ranges(temps, params.top_p, params.top_k, params.max_new_token, params.min_new_token,
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
        return last_state(self.iter_infer_code(texts, params)).result()

    def iter_infer_code(self, texts: Sequence[str], params: InferCodeParams) -> Iterator[StepState]:
        if not texts:
            raise ForgeError("no text to synthesize")
        cfg = self.code_sampling(params)
        return iter_generate(
            self, self.prepare_code_inputs(texts, params), cfg, infer_text=False, max_new_token=params.max_new_token,
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
        gen = self.generate(
            self.prepare_code_inputs(texts, params), cfg, infer_text=False, max_new_token=steps, seed=0, forced=forced
        )
        return gen.processed_logits or []

    def refine_generation(self, texts: Sequence[str], params: RefineTextParams) -> Generation:
        """ChatTTS's `_refine_text` on normalised texts: `.ids[b]` the text-head tokens (EOS excluded)."""
        temps = (float(params.temperature),)
        check_sampling_ranges(temps, params.top_p, params.top_k, params.max_new_token, params.min_new_token,
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
            PromptBatch(emb, input_ids, mask), cfg, infer_text=True, max_new_token=params.max_new_token,
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
        return self.artifact.session(VOCODER).run(["waveform"], {"mel": np.ascontiguousarray(mel[None], dtype=np.float32)})[0][0]

    def decode(self, items: Sequence[np.ndarray], use_decoder: bool = True) -> list[np.ndarray]:
        """Waveform per item (each decoded alone: hop * (2T - 1) samples, empty for T = 0)."""
        wavs = []
        for x in items:
            x = np.asarray(x)
            if x.ndim != 2:
                raise BadInput(f"decode input must be 2-D [T, channels], got shape {x.shape}")
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
        return self.artifact.session(VOCODER).run(["waveform"], {"mel": mel})[0]

    @property
    def decoder_radius(self) -> int:
        """Mel frames on each side that one Decoder/DVAE output frame depends on."""
        return decoder_radius(self.dims)

    @property
    def vocos_radius(self) -> int:
        """Mel frames on each side that one output sample of Vocos depends on (backbone + ISTFT)."""
        return vocos_radius(self.dims, self.hop)

    @property
    def default_lookahead(self) -> int | None:
        """The look-ahead synth, serve and bench stream at unless told otherwise: the artifact's recorded
        one (artifact.json `streaming`, runtime.stream_lookahead), None (exact) when it records none.
        `stream(lookahead_frames=None)` itself stays exact; `resolve_lookahead` maps a request onto this."""
        return self.artifact.meta.stream_lookahead()

    def resolve_lookahead(self, requested: StreamLookahead = None) -> int | None:
        """`lookahead_frames` for a request's stream: None asked -> `default_lookahead`; "exact" -> None
        (the receptive field); a number -> that many mel frames."""
        return resolve_lookahead(requested, self.default_lookahead)

    # ---- whole texts ----------------------------------------------------------------------

    def prepare_texts(self, texts: Sequence[str], params: SynthParams) -> tuple[list[str], list[int]]:
        """Normalised (and split, if asked) texts, refined if asked, plus for each the index of the
        input it came from."""
        out, owner = self.normalize_texts(texts, params)
        n_inputs = 1 if isinstance(texts, str) else len(texts)
        if len(out) <= max(n_inputs, SEGMENT_BATCH):
            return self.refine_texts(out, params, owner), owner
        refined: list[str] = []  # a long text's many segments: refined SEGMENT_BATCH at a time
        for start in range(0, len(out), SEGMENT_BATCH):
            refined += self.refine_texts(out[start: start + SEGMENT_BATCH], params, owner[start: start + SEGMENT_BATCH])
        return refined, owner

    def normalize_texts(self, texts: Sequence[str], params: SynthParams) -> tuple[list[str], list[int]]:
        """`prepare_texts` before refinement (what a phrase cache is keyed by): each input's segments
        (`TextFront.segments`: its spoken form cut at sentence ends when long) and their owners."""
        check_synth_params(params, self.dims.max_position_embeddings, self.max_text_chars())
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, Sequence):
            raise BadInput(f"texts must be a string or a list of strings, got {type(texts).__name__}")
        if not texts:
            raise ForgeError("no text to synthesize")
        out, owner = [], []
        for i, t in enumerate(texts):
            if isinstance(t, str):  # before splitting: a huge text is refused before any work on it
                check_text_length(t, self.max_text_chars(params.split_sentences, params.text_normalization))
            if not isinstance(t, str) or not t.strip():
                raise InputError(f"empty text (item {i})" if len(texts) > 1 else "empty text")
            parts = split_sentences(t) if params.split_sentences else [t]
            for p in parts:
                segments, removed = self.text.segments(p, params)
                if removed:
                    log.info("text %d: removed (cannot be spoken): %s", i, removed)
                out += segments
                owner += [i] * len(segments)
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

    def synthesize(self, texts: str | Sequence[str], params: SynthParams | None = None,
                   whole: bool = False) -> list[Result]:
        """One Result per input text; all texts share the GPT steps (batches of SEGMENT_BATCH rows).
        With a phrase cache (`cache=`), cached texts skip the code stage and the Decoder
        (`Result.cached`). The segments of one input are joined with a short pause (runtime.segments).
        `whole=True` (what `synth` asks): a segment that hits the default code-step cap is split in
        two and generated again; one that cannot be spoken within the cap is an InputError, never a
        cut waveform (on a synthetic checkpoint, whose random weights never end a row, it is kept)."""
        params = params or SynthParams()
        if self.cache is not None:  # keyed by the text before refinement: a hit is not refined again
            norm, owner = self.normalize_texts(texts, params)
            rows = self.cache.synthesize_rows(self, norm, params, owner)
        else:
            norm, owner = self.prepare_texts(texts, params)
            n_inputs = 1 if isinstance(texts, str) else len(texts)
            batch = SEGMENT_BATCH if len(norm) > max(n_inputs, SEGMENT_BATCH) else len(norm)
            rows = []
            for start in range(0, len(norm), batch):
                rows += self.synthesize_rows(norm[start: start + batch], params)
        if whole:
            norm, owner, rows = self._respeak_capped(norm, owner, rows, params)
        n_inputs = 1 if isinstance(texts, str) else len(texts)
        pause = np.zeros(int(SEGMENT_PAUSE_SECONDS * self.sample_rate), dtype=np.float32)
        results = []
        for i in range(n_inputs):
            mine = [r for r, o in enumerate(owner) if o == i]
            wavs = [rows[r].wav for r in mine]
            if params.text_normalization and not params.split_sentences and len(wavs) > 1:  # split_text joins as is
                wavs = [w for r in wavs for w in (pause, r)][1:]
            results.append(
                Result(
                    text=" ".join(rows[r].text or norm[r] for r in mine),
                    codes=np.concatenate([rows[r].codes for r in mine]).reshape(-1, self.num_vq),
                    hiddens=np.concatenate([rows[r].hiddens for r in mine]).reshape(-1, self.dims.hidden_size),
                    wav=np.concatenate(wavs).astype(np.float32),
                    sample_rate=self.sample_rate,
                    cached=all(rows[r].cached for r in mine),
                )
            )
        return results

    def cut_at_cap(self, params: SynthParams, steps: int) -> bool:
        """Whether a row of `steps` code steps stopped at the default cap without ending: a cut the
        request did not ask for. A cap or a length the request set is asked for, normalization off
        keeps ChatTTS's cut, and a synthetic checkpoint's random weights never end a row."""
        cap = params.code.max_new_token
        synthetic = (self.artifact.meta.source or {}).get("kind") == "synthetic"
        return (params.text_normalization and cap >= CODE_MAX_NEW_TOKEN and params.code.min_new_token < cap
                and not synthetic and steps >= cap)

    def _respeak_capped(self, norm: list[str], owner: list[int], rows: list[Row], params: SynthParams,
                        depth: int = 2) -> tuple[list[str], list[int], list[Row]]:
        """Segments whose rows hit the default code-step cap, each cut in two and generated again (up to
        `depth` times); InputError for one that cannot be spoken within it."""
        cap = params.code.max_new_token
        capped = [r for r, row in enumerate(rows) if not row.cached and self.cut_at_cap(params, len(row.codes))]
        if not capped:
            return norm, owner, rows
        new_norm, new_owner, new_rows = [], [], []
        for r, (text, o, row) in enumerate(zip(norm, owner, rows, strict=True)):
            if r not in capped:
                new_norm.append(text), new_owner.append(o), new_rows.append(row)
                continue
            halves = halve(text)
            if depth == 0 or len(halves) < 2:
                raise InputError(f"input: the segment {short_repr(text)} cannot be spoken within {cap} code steps "
                                 f"({cap / self.dims.sample_rate * 2 * self.hop:.1f} s); shorten it or add punctuation")
            log.info("segment %s hit %d code steps: split in two and generated again", short_repr(text), cap)
            again = self.synthesize_rows(halves, params)
            sub_norm, _, sub_rows = self._respeak_capped(halves, [o, o], again, params, depth - 1)
            new_norm += sub_norm
            new_owner += [o] * len(sub_norm)
            new_rows += sub_rows
        return new_norm, new_owner, new_rows

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
            raise BadInput(f"stream batch must be >= 1, got {every}")
        if params.split_sentences:
            raise BadInput("streaming does not support sentence splitting; give one text per line instead")
        one = texts if isinstance(texts, str) else texts[0] if isinstance(texts, Sequence) and len(texts) == 1 else None
        if params.text_normalization and isinstance(one, str):
            # one text: its segments come from the front end as its written chunks are normalised, so
            # its first audio does not wait for the rest of a long text
            check_synth_params(params, self.dims.max_position_embeddings, self.max_text_chars())
            segments = (seg for seg, _ in self.text.iter_segments(one, params) if seg)
            first = next(segments)
            second = next(segments, None)
            if second is not None:
                yield from self._stream_segments(itertools.chain((first, second), segments), params, every, on_done,
                                                 lookahead_frames, progress)
                return
            norm = self.refine_texts([first], params, [0])
            yield from stream_rows(self, norm, params, every, on_done, lookahead_frames, progress)
            return
        norm, owner = self.normalize_texts(texts, params)
        if len(norm) > len(set(owner)):
            raise InputError("a stream of several texts takes one segment each; stream a long text on its own")
        norm = self.refine_texts(norm, params, owner)
        yield from stream_rows(self, norm, params, every, on_done, lookahead_frames, progress)

    def _stream_segments(self, norm: Iterable[str], params: SynthParams, every: int,
                         on_done: Callable[[Generation], None] | None, lookahead_frames: int | None,
                         progress: Callable[[StepState], None] | None) -> Iterator[list[np.ndarray]]:
        """One text's segments streamed in turn (each refined just before it, when asked), a pause between
        them; `on_done` gets their codes joined."""
        done: list[Generation] = []
        pause = np.zeros(int(SEGMENT_PAUSE_SECONDS * self.sample_rate), dtype=np.float32)
        for k, segment in enumerate(norm):
            if k:
                yield [pause]
            segment = self.refine_texts([segment], params)[0]  # each in its turn: first audio waits for one
            yield from stream_rows(self, [segment], params, every, done.append, lookahead_frames, progress)
        if on_done is not None:
            on_done(join_generations(done))
