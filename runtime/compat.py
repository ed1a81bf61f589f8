"""A drop-in for ChatTTS 0.2.5's `ChatTTS.Chat` on a converted artifact (torch-free).

Its params classes and their checks are runtime.compat_params; where it loads from (device, folder,
variant, coef) runtime.compat_load.

Existing ChatTTS code runs with one import and the `load` call changed::

    import chattts_forge.compat as ChatTTS          # was: import ChatTTS

    chat = ChatTTS.Chat()
    chat.load(source="custom", custom_path="artifacts/chattts/v1")    # an artifact or version folder
    spk = chat.sample_random_speaker()
    params = ChatTTS.Chat.InferCodeParams(spk_emb=spk, temperature=0.3, top_P=0.7, top_K=20)
    wavs = chat.infer(["你好。", "Hello."], params_infer_code=params)   # list of float32 [samples]

Everything runs on the runtime's public `Pipeline` (normalise -> refine with the text head ->
code generation -> Decoder/DVAE -> Vocos), with ChatTTS's names, defaults, return types and
shapes (see `Chat.infer`). `sample_audio_speaker(wav)` runs the artifact's `dvae_encoder.onnx`
(ChatTTS's DVAE encode path) and gives the same `spk_smp` string ChatTTS makes of the recording.

`load(custom_path=...)` takes an artifact folder (it holds `artifact.json`) or a published version
folder `artifacts/<model>/<version>/` holding variant folders; from a version folder the variant
is `variant=` if given, else the first present of `VARIANT_PREFERENCE[provider]` (CPU: int8-dynamic,
int8-dynamic-kv8, auto, fp32, int8-static, int4, fp16; CUDA: fp16, fp32, int8-dynamic, auto,
int8-static, int4), else the first by name. A version folder with a routing.json (and no `variant=`)
serves the host's choice for its longest bucket (the one variant a Chat holds must serve every
length; quantization error is largest on long texts): the Router's autotune ranks the variants
that pass the gate there on this machine (runtime.autotune; `autotune=False` takes the build's
ranking); `chat.autotune` holds the record of that choice.

What differs from ChatTTS, on purpose (each refusal is a one-line `ForgeError` naming the argument):
- sources other than `custom`, `force_redownload`, `compile`, `use_flash_attn`, `use_vllm`,
  `experimental`, `enable_cache=False`, a `coef` other than the artifact's, devices other than
  cpu/cuda, unknown keyword arguments, and wavs that are not 1-D float samples are refused;
- `load` raises instead of logging and returning False; `device=None` runs on CUDA when this
  onnxruntime can (as ChatTTS picks a GPU), else on the CPU;
- sampling draws from numpy generators seeded by `manual_seed` (torch's RNG stream is not
  reproduced; at temperature ~0 both are argmax); `sample_random_speaker()` ignores
  `torch.manual_seed` (pass `seed=` here);
- `split_text=True` drops empty lines of a text (ChatTTS feeds them to the model as empty prompts);
- streaming emits audio that is final (the runtime's exact streaming: concatenated chunks equal the
  whole waveform) as [batch, samples] arrays, honouring `pass_first_n_batches` (chunks held back) and
  `stream_speed` (most samples per chunk); chunks come every `stream_batch` steps plus an early first
  one, so the count of held-back chunks may cover fewer steps than in ChatTTS;
- `show_tqdm` shows a progress bar over the code steps; the refinement step shows none;
- `params_infer_code` is not modified: ChatTTS writes the `spk_smp`/`txt_smp` of its
  split-text reference sentence into the caller's (or the shared default) object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import DECODER, DVAE, DVAE_ENCODER
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.runtime.autotune import AutotuneSettings, autotune_default
from chattts_forge.runtime.chattts_speaker import speaker_vector
from chattts_forge.runtime.chattts_text import combine_tags, split_sentences, split_tags
from chattts_forge.runtime.compat_load import (
    SOURCE_HINT,
    VARIANT_PREFERENCE,
    LoadConfig,
    artifact_coef,
    provider_of,
    resolve_artifact,
)
from chattts_forge.runtime.compat_params import (
    CompatArgumentError,
    InferCodeParams,
    RefineTextParams,
    check_params,
    check_type,
    refuse_unknown,
    runtime_code,
    runtime_refine,
)
from chattts_forge.runtime.generation import Generation, StepState
from chattts_forge.runtime.params import InferCodeParams as _RuntimeCodeParams
from chattts_forge.runtime.params import SynthParams
from chattts_forge.runtime.pipeline import Pipeline
from chattts_forge.runtime.router import ROUTING_NAME, Router

__all__ = ["VARIANT_PREFERENCE", "Chat", "CompatArgumentError", "InferConfig", "LoadConfig", "Normalizer"]

# ChatTTS's silence threshold: `Chat.infer` drops samples with |x| <= 1e-5 from non-streamed audio.
_SILENCE = np.float32(1e-5)


class Normalizer:
    """`chat.normalizer`: ChatTTS's Normalizer with `register(lang, fn)` / `unregister(lang)`.

    A registered function runs on the tag-free runs of a text detected (or given) as `lang`, before
    the built-in steps, as in ChatTTS. Registering works before `load`; normalising needs it (the
    homophone map is the artifact's)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.normalizers: dict[str, Callable[[str], str]] = {}
        self.base: Any = None  # the runtime's Normalizer, set by Chat.load

    def register(self, name: str, normalizer: Callable[[str], str]) -> bool:
        """As ChatTTS: False (with a warning) if taken or if `normalizer` is not str -> str."""
        if name in self.normalizers:
            self.logger.warning(f"name {name} has been registered")
            return False
        try:
            val = normalizer("test string 测试字符串")
        except Exception as e:  # ChatTTS logs whatever the user's function raised
            self.logger.warning(e)
            return False
        if not isinstance(val, str):
            self.logger.warning("normalizer must have caller type (str) -> str")
            return False
        self.normalizers[name] = normalizer
        return True

    def unregister(self, name: str) -> None:
        self.normalizers.pop(name, None)

    def destroy(self) -> None:
        self.normalizers.clear()

    def __call__(
        self, text: str, do_text_normalization: bool = True, do_homophone_replacement: bool = True,
        lang: str | None = None,
    ) -> str:
        if self.base is None:
            raise BadInput("the normalizer needs a loaded artifact (call chat.load(...) first)")
        if do_text_normalization:
            lang = self.base.detect_language(text) if lang is None else lang
            if lang in self.normalizers:
                texts, tags = split_tags(text)
                texts = [self.normalizers[lang](t) for t in texts]
                text = combine_tags(texts, tags) if tags else texts[0]
        return self.base(text, do_text_normalization, do_homophone_replacement, lang)


@dataclass(frozen=True)
class InferConfig:
    """`Chat.infer`'s arguments (ChatTTS's names and defaults) as one record."""

    stream: bool = False
    lang: str | None = None
    skip_refine_text: bool = False
    refine_text_only: bool = False
    use_decoder: bool = True
    do_text_normalization: bool = True
    do_homophone_replacement: bool = True
    split_text: bool = True
    max_split_batch: int = 4
    params_refine_text: RefineTextParams = field(default_factory=lambda: RefineTextParams())
    params_infer_code: InferCodeParams = field(default_factory=lambda: InferCodeParams())


class Chat:
    """ChatTTS 0.2.5's `Chat` on an ONNX artifact. See the module docstring."""

    RefineTextParams = RefineTextParams
    InferCodeParams = InferCodeParams

    def __init__(self, logger: logging.Logger = logging.getLogger(__name__)) -> None:  # noqa: B008 - as ChatTTS
        self.logger = logger
        self.normalizer = Normalizer(logger)
        self.pipe: Pipeline | None = None
        self.autotune: dict[str, Any] | None = None  # how a version folder's variant was chosen (load)
        self._interrupted = False

    # ---- loading --------------------------------------------------------------------------

    def has_loaded(self, use_decoder: bool = False) -> bool:
        """True once an artifact is loaded (with the Decoder, or the DVAE when use_decoder=False)."""
        if self.pipe is None:
            self.logger.warning("artifact not loaded.")
            return False
        name = DECODER if use_decoder else DVAE
        if not self.pipe.artifact.has_component(name):
            self.logger.warning(f"{name} not initialized.")
            return False
        return True

    def download_models(self, source: str = "local", force_redownload: bool = False,
                        custom_path: str | None = None) -> str | None:
        if source != "custom" or force_redownload:
            raise CompatArgumentError(f"download_models: nothing is downloaded here; {SOURCE_HINT}")
        return None if custom_path is None else str(custom_path)

    def load(
        self,
        source: str = "local",
        force_redownload: bool = False,
        compile: bool = False,  # noqa: A002 - ChatTTS's name
        custom_path: str | Path | None = None,
        device: Any = None,
        coef: str | None = None,
        use_flash_attn: bool = False,
        use_vllm: bool = False,
        experimental: bool = False,
        enable_cache: bool = True,
        *,
        variant: str | None = None,
        threads: int | None = None,
        engine: str = "auto",
        public_key: str | Path | None = None,
        verify: str = "sha256",
        autotune: bool | AutotuneSettings | None = None,
        **unknown: Any,
    ) -> bool:
        """Open an artifact (`source="custom"`, `custom_path=` an artifact or version folder).

        The signature is ChatTTS's `Chat.load` (drop-in compatibility; kept on purpose, however long):
        its PyTorch and download arguments are refused unless left at their defaults, and what is left
        maps onto a `LoadConfig` for `open_config`. Extra keyword-only arguments of ours: `variant`
        (pick from a version folder), `threads` (onnxruntime intra-op threads), `engine` (GPT engine,
        see Pipeline), `public_key` (a PEM public key: the published folder's model.sig must verify
        with it), `verify` (how the files are checked against their sha256, see Pipeline), `autotune`
        (a version folder with routing.json: rank its variants on this host; see the module
        docstring). Returns True."""
        refuse_unknown("load", unknown)
        if source != "custom":
            raise CompatArgumentError(f"load: source={source!r} is not supported; {SOURCE_HINT}")
        if custom_path is None:
            raise CompatArgumentError(f"load: custom_path is required; {SOURCE_HINT}")
        refused = {"force_redownload": force_redownload, "compile": compile, "use_flash_attn": use_flash_attn,
                   "use_vllm": use_vllm, "experimental": experimental}
        for name, value in refused.items():
            if value:
                raise CompatArgumentError(f"load: {name}=True is a PyTorch/download option; the artifact runs "
                                          "on onnxruntime (leave it False)")
        if not enable_cache:
            raise CompatArgumentError("load: enable_cache=False is not supported (the runtime always keeps a KV cache)")
        self.open_config(LoadConfig(path=Path(custom_path), provider=provider_of(device), coef=coef, variant=variant,
                                    threads=threads, engine=engine, public_key=public_key, verify=verify,
                                    autotune=autotune))
        return True

    def open_config(self, cfg: LoadConfig) -> None:
        """Open the artifact `cfg` names (what `load` does once ChatTTS's arguments are mapped)."""
        self.autotune = None
        version = cfg.path.expanduser()
        runtime = {"provider": cfg.provider, "threads": cfg.threads, "engine": cfg.engine, "verify": cfg.verify,
                   "public_key": cfg.public_key}
        if cfg.variant is None and (version / ROUTING_NAME).is_file():
            # A Chat holds one variant for its life, so a cold autotune cache is measured at load, not later.
            # (autotune, with timed_engine and timing: loaded only for a routed version)

            autotune: bool | AutotuneSettings = autotune_default() if cfg.autotune is None else cfg.autotune
            if autotune is not False:
                autotune = replace(autotune if isinstance(autotune, AutotuneSettings) else AutotuneSettings(),
                                   cold_cache="measure")
            router = Router(version, autotune=autotune, keep_measured=True, **runtime)
            variant = router.routes[router.buckets[-1].name]
            self.autotune = router.autotune
            self.logger.info("load: %s serves %s, the host's choice for its longest bucket (%s)", version, variant,
                             router.autotune["buckets"][router.buckets[-1].name]["reason"])
            folder = resolve_artifact(cfg.path, variant, cfg.provider)
            pipe = router.pipeline(variant)  # the sessions autotune opened for it, not a second copy
        else:
            folder = resolve_artifact(cfg.path, cfg.variant, cfg.provider)
            pipe = Pipeline(folder, **runtime)
        if cfg.coef is not None and cfg.coef != artifact_coef(pipe):
            raise CompatArgumentError("load: coef differs from the artifact's DVAE coefficients (baked into its "
                                      "graphs at convert time); leave coef=None")
        self.pipe = pipe
        self.normalizer.base = pipe.normalizer
        self.logger.info("loaded artifact %s (variant %s, %s)", folder, pipe.artifact.variant, cfg.provider)

    def unload(self) -> None:
        """Drop the artifact and the registered normalizers (ChatTTS re-initialises the Chat)."""
        self.__init__(self.logger)  # type: ignore[misc]

    @property
    def sample_rate(self) -> int:
        return self._pipe().sample_rate

    def _pipe(self) -> Pipeline:
        if self.pipe is None:
            raise ForgeError("no artifact loaded: call chat.load(source='custom', custom_path=DIR) first")
        return self.pipe

    # ---- speakers -------------------------------------------------------------------------

    def sample_random_speaker(self, seed: int | None = None) -> str:
        """A random speaker string from the artifact's speaker statistics (`seed`: ours, optional)."""
        return self._pipe().random_speaker(seed)

    def sample_audio_speaker(self, wav: Any) -> str:
        """The `spk_smp` string of a 24 kHz mono recording (1-D float samples), as ChatTTS makes it."""
        return self._pipe().sample_audio_speaker(wav)

    def interrupt(self) -> None:
        """Stop the running `infer` after its current step (what was generated so far is decoded)."""
        self._interrupted = True

    # ---- inference ------------------------------------------------------------------------

    def infer(
        self,
        text: str | Sequence[str],
        stream: bool = False,
        lang: str | None = None,
        skip_refine_text: bool = False,
        refine_text_only: bool = False,
        use_decoder: bool = True,
        do_text_normalization: bool = True,
        do_homophone_replacement: bool = True,
        split_text: bool = True,
        max_split_batch: int = 4,
        params_refine_text: RefineTextParams | None = None,
        params_infer_code: InferCodeParams | None = None,
        **unknown: Any,
    ) -> Any:
        """ChatTTS's `Chat.infer`. Returns, as ChatTTS does:

        - `refine_text_only=True`: the refined text, a str joined by newlines if `split_text`, else a
          list of str (one per text);
        - `stream=False`: a list of float32 waveforms [samples] at 24 kHz with samples |x| <= 1e-5
          removed; one per text, or a single joined one when `split_text` is True;
        - `stream=True`: a generator of float32 arrays [texts in the batch, samples];
        - `[]` for an empty list of texts.

        The signature is ChatTTS's (drop-in compatibility; kept on purpose): the arguments map onto an
        `InferConfig` for `infer_config`.
        """
        refuse_unknown("infer", unknown)
        return self.infer_config(text, InferConfig(
            stream=stream, lang=lang, skip_refine_text=skip_refine_text, refine_text_only=refine_text_only,
            use_decoder=use_decoder, do_text_normalization=do_text_normalization,
            do_homophone_replacement=do_homophone_replacement, split_text=split_text,
            max_split_batch=max_split_batch, params_refine_text=params_refine_text or RefineTextParams(),
            params_infer_code=params_infer_code or InferCodeParams(),
        ))

    def infer_config(self, text: str | Sequence[str], cfg: InferConfig) -> Any:
        """`infer` once its arguments are mapped onto `cfg` (same returns)."""
        pipe = self._pipe()
        check_type("params_refine_text", cfg.params_refine_text, RefineTextParams)
        check_type("params_infer_code", cfg.params_infer_code, InferCodeParams)
        if cfg.max_split_batch < 1:
            raise CompatArgumentError(f"infer: max_split_batch must be >= 1, got {cfg.max_split_batch}")
        if cfg.lang not in (None, "zh", "en"):
            raise CompatArgumentError(f"infer: lang must be None, 'zh' or 'en', got {cfg.lang!r}")
        check_params(pipe, cfg.params_refine_text, cfg.params_infer_code)
        self._check_speakers(cfg.params_infer_code)
        self._interrupted = False

        texts = self._split(text, cfg.split_text)
        if not texts:
            return []
        texts = [self._normalize(t, cfg.do_text_normalization, cfg.do_homophone_replacement, cfg.lang) for t in texts]
        if not cfg.skip_refine_text:
            texts = self._refine(texts, cfg.params_refine_text)
            if cfg.refine_text_only:
                return "\n".join(texts) if cfg.split_text else texts
        compat = cfg.params_infer_code
        code_params = runtime_code(compat)
        if cfg.split_text and len(texts) > 1 and code_params.spk_smp is None:
            code_params = self._reference_speaker(texts[0], code_params, cfg.use_decoder, compat.show_tqdm)
        batch = cfg.max_split_batch if cfg.split_text else len(texts)
        groups = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        if cfg.stream:
            return self._stream(groups, code_params, compat, cfg.use_decoder)
        wavs: list[np.ndarray] = []
        for group in groups:
            gen = self._generate_codes(group, code_params, compat.show_tqdm)
            batch_wavs = pipe.decode_to_wavs(gen.hiddens if cfg.use_decoder else gen.ids, cfg.use_decoder)
            wavs += [w[np.abs(w) > _SILENCE] for w in batch_wavs]
        return [np.concatenate(wavs)] if cfg.split_text else wavs

    # ---- the steps of infer ---------------------------------------------------------------

    @staticmethod
    def _split(text: str | Sequence[str], split_text: bool) -> list[str]:
        if isinstance(text, str):
            return split_sentences(text) if split_text else [text]
        if not isinstance(text, (list, tuple)) or not all(isinstance(t, str) for t in text):
            raise CompatArgumentError("infer: text must be a str or a list of str")
        return list(text)

    def _normalize(self, text: str, do_text_normalization: bool, do_homophone_replacement: bool,
                   lang: str | None) -> str:
        out = self.normalizer(text, do_text_normalization, do_homophone_replacement, lang)
        # The runtime's checks (empty / nothing speakable) on the normalised text.
        # ChatTTS speaks what its own front end leaves unless a normalizer is registered
        # (chat.normalizer.register("en", chattts_forge.runtime.spoken.registered("en")), as in ChatTTS).
        return self._pipe().normalize(out, SynthParams(normalize=False, homophones=False, text_normalization=False))

    def _refine(self, texts: list[str], params: RefineTextParams) -> list[str]:
        return self._pipe().refine_text(texts, runtime_refine(params))

    def _check_speakers(self, params: InferCodeParams) -> None:
        pipe = self._pipe()
        if params.spk_emb is not None:
            try:
                speaker_vector(params.spk_emb, pipe.dims.hidden_size)
            except ForgeError as e:
                raise ForgeError(f"spk_emb: {e} (a speaker string from another model?)") from None
        if params.spk_smp is not None:
            pipe.speaker_sample_codes(params.spk_smp)

    def _generate_codes(self, texts: list[str], params: _RuntimeCodeParams, show_tqdm: bool) -> Generation:
        """One batch of code generation (interruptible); the seam tests compare with ChatTTS."""
        state: StepState | None = None
        with _progress_bar(show_tqdm, params.max_new_token) as bar:
            for state in self._pipe().iter_infer_code(texts, params):  # noqa: B007 - the last state is the result
                bar.update(1)
                if self._interrupted:
                    break
        assert state is not None  # iter_infer_code yields at least one step
        return state.result()

    def _reference_speaker(self, text: str, params: _RuntimeCodeParams, use_decoder: bool,
                           show_tqdm: bool) -> _RuntimeCodeParams:
        """ChatTTS's split-text step: speak the first sentence, encode that audio as spk_smp."""
        pipe = self._pipe()
        if not pipe.artifact.has_component(DVAE_ENCODER):
            raise BadInput(
                f"split_text on a text of several sentences makes a reference speaker from audio, and artifact "
                f"{pipe.artifact.path} has no dvae_encoder.onnx: pass split_text=False or a spk_smp, or convert again"
            )
        gen = self._generate_codes([text], params, show_tqdm)
        wav = pipe.decode_to_wavs(gen.hiddens if use_decoder else gen.ids, use_decoder)[0]
        return replace(params, spk_smp=pipe.sample_audio_speaker(wav), txt_smp=text)

    def _stream(self, groups: list[list[str]], params: _RuntimeCodeParams, compat: InferCodeParams,
                use_decoder: bool) -> Iterator[np.ndarray]:
        synth = SynthParams(code=params, refine=None, use_decoder=use_decoder, normalize=False, homophones=False,
                            text_normalization=False)
        for group in groups:
            yield from self._stream_group(group, synth, compat)

    def _stream_group(self, group: list[str], synth: SynthParams, compat: InferCodeParams) -> Iterator[np.ndarray]:
        """One batch streamed as ChatTTS shapes it: [rows, samples] chunks of final audio; a row
        that has ended is zero-padded while the others go on."""
        rows = len(group)
        pending = [np.zeros(0, np.float32) for _ in range(rows)]
        ended = np.zeros(rows, dtype=bool)
        chunks = 0

        def progress(state: StepState) -> None:
            ended[:] = state.finish | state.done
            if self._interrupted:
                raise _Interrupted

        stream = self._pipe().stream(group, synth, progress=progress)
        while True:
            try:
                chunk = next(stream)
            except (StopIteration, _Interrupted):
                break
            chunks += 1
            pending = [np.concatenate([p, c]) for p, c in zip(pending, chunk, strict=True)]
            if chunks <= compat.pass_first_n_batches:
                continue
            live = [len(p) for p, e in zip(pending, ended, strict=True) if not e]
            n = min(min(live) if live else max(len(p) for p in pending), compat.stream_speed)
            if n > 0:
                out, pending = _take(pending, n)
                yield out
        # ChatTTS's last chunk of a batch: the rest, without the columns silent in every row.
        width = max(len(p) for p in pending)
        if width:
            out, _ = _take(pending, width)
            yield out[:, (np.abs(out) > _SILENCE).any(axis=0)]


class _Interrupted(Exception):
    """Raised inside the stream's progress hook to stop generation after `Chat.interrupt()`."""


def _take(pending: list[np.ndarray], n: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The first n samples of every row as [rows, n] (rows that have less are zero-padded), and the rest."""
    out = np.zeros((len(pending), n), dtype=np.float32)
    for b, p in enumerate(pending):
        out[b, : min(n, len(p))] = p[:n]
    return out, [p[n:] for p in pending]


class _progress_bar:  # noqa: N801 - used as a context manager like tqdm
    """tqdm over generation steps when ChatTTS's `show_tqdm` asks for it, else a no-op."""

    def __init__(self, show: bool, total: int) -> None:
        self.bar = None
        if show:
            # tqdm: only when progress is shown; 33 ms to import
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="code", unit="step", leave=False)

    def __enter__(self) -> _progress_bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)


