"""What the server serves: one loaded artifact or published version, its schedulers and caches.

`ServedVersion(path, ...)` opens an artifact folder (one variant) or a published version folder
(`artifacts/<model>/<version>`, whose routing.json sends each text to its length bucket's variant),
verifies every variant it opens (`verify="sha256"` by default: every file against its sha256,
through the verified-hash cache; `public_key`: the signatures too), starts one continuous-batching
`Scheduler` per variant and attaches the phrase caches:

- the version's `phrase_cache.bin` (or `phrase_cache=`): hits are served with Vocos only; a request
  whose knobs differ from the cache's is a miss, synthesized as usual (runtime.phrase_cache). The
  cache never sets a knob: a request's audio is the same with or without it;
- optionally a shared Redis cache (`redis_url=`, serve.redis_cache) filled by the misses.

A request goes `prepare` (normalise, route, cache lookups keyed by the text before refinement,
then on a miss refine if asked; CPU work on the caller's thread) then `submit` (the variant's
scheduler). Requests that refine their text share the variant's
GPT step for that pass, so refinement (and only it) is serialised per variant; code generation always
runs in the scheduler's batch.

Request defaults (`default_params`): `synth`'s and `warm`'s (ChatTTS's knobs, refinement on, seed
`--seed`, 0), whatever the caches hold, so a request that sets nothing is served from a cache warmed
with the defaults and is the same audio without one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import ARTIFACT_JSON
from chattts_forge.errors import BadInput, ForgeError, NotFound, quote
from chattts_forge.log import get_logger
from chattts_forge.runtime.autotune import AutotuneSettings, autotune_default
from chattts_forge.runtime.chattts_speaker import speaker_vector
from chattts_forge.runtime.chattts_text import decorate_code_prompts, is_speakable
from chattts_forge.runtime.memory import RequestMemory, request_memory
from chattts_forge.runtime.phrase_cache import PhraseCache, PipelineCache, payload_sha256, replay_params
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, RefineTextParams, Row, SynthParams
from chattts_forge.runtime.request_handle import Handle
from chattts_forge.runtime.router import ROUTING_NAME, Router, bucket_of, table_buckets, text_length
from chattts_forge.runtime.scheduler import Scheduler, check_request
from chattts_forge.runtime.serve.config import ServeConfig
from chattts_forge.runtime.serve.redis_cache import RedisPhraseCache
from chattts_forge.runtime.serve.sequential import SequentialRunner
from chattts_forge.runtime.serve.voices import DEFAULT_VOICE, VoiceBook, load_voices  # noqa: F401 - load_voices re-exported
from chattts_forge.runtime.textfront import InputError, TextFront

log = get_logger(__name__)

PHRASE_CACHE_NAME = "phrase_cache.bin"


@dataclass
class Prepared:
    """A request ready for the scheduler, or already served from a cache (`wav` set)."""

    variant: str
    text: str  # normalised (and refined, if asked): what the code stage speaks
    params: SynthParams
    wav: np.ndarray | None = None  # a cache hit's whole waveform
    cache_tier: str | None = None  # "file" or "redis" for a hit
    mel: np.ndarray | None = None
    key_text: str | None = None  # the normalised text before refinement (the caches' key); None: `text`
    served_by: str | None = None  # a hit from another variant's phrase-cache entry: that variant
    removed: str = ""  # characters of the input that cannot be spoken (reported in X-Forge-Removed)
    rest: list[str] = field(default_factory=list)  # a long input's later segments, spoken after `text`
    pending: Iterator[tuple[str, str]] | None = None  # a long input's segments not yet normalised
    lookahead: int | str | None = None  # the request's stream_lookahead ("exact", frames; None: the artifact's)


class ServedVersion:
    """One artifact or version folder, loaded, verified, with a running scheduler per variant."""

    def __init__(self, path: str | os.PathLike[str], cfg: ServeConfig, voices: dict[str, str] | None = None,
                 release_free_rows: Callable[[], bool] | None = None) -> None:
        """Open `path` with `cfg`'s batch, queue, threads, provider, checks, caches and default seed;
        `voices`: named voices besides OpenAI's thirteen and 'default'; `release_free_rows`: whether the
        schedulers give free rows' memory back now (a server near its memory limit)."""
        self.path = Path(path)
        if not self.path.is_dir():
            raise NotFound(f"artifact {self.path} does not exist (an artifact folder or a version folder)")
        self.max_batch, self.max_queue = cfg.max_batch, cfg.max_queue
        self.first_chunk_priority = cfg.first_chunk_priority
        self.release_free_rows = release_free_rows
        kwargs: dict[str, Any] = {"provider": cfg.provider, "threads": cfg.threads, "verify": cfg.verify,
                                  "public_key": cfg.public_key, "engine": "auto"}
        self.router: Router | None = None
        self.front: TextFront  # normalises and measures requests, draws the voices (no session)
        self.pipes: dict[str, Pipeline] = {}
        self.schedulers: dict[str, Scheduler] = {}
        # per variant: its pipe's one GPT step (and KV state), taken by refinement and, for a variant
        # the scheduler cannot batch, by the SequentialRunner's generation
        self._gpt_locks: dict[str, threading.Lock] = {}
        self._open_lock = threading.Lock()
        self.caches: dict[str, PipelineCache] = {}
        # (routed variant, build route): the build route's entries served through the routed variant
        self._stand_ins: dict[tuple[str, str], PipelineCache | None] = {}
        self.file_cache: PhraseCache | None = None
        self.redis = None
        self.inflight = 0  # requests admitted and not yet ended (a reload drains the old version by it)
        self._tune_thread: threading.Thread | None = None  # the deferred autotune (started after the first reply)
        self._inflight_lock = threading.Condition()
        try:
            self._load(kwargs, cfg, voices or {})
        except BaseException:
            self.close(0)
            raise

    def memory_figures(self) -> dict[str, Any]:
        """Per routed variant, the memory the build measured for it (routing.json `variants[v].memory`:
        peak RSS per batch size in a process of its own; None where the table records none); {} for a
        single artifact folder."""
        if self.router is None:
            return {}
        recorded = self.router.table.get("variants") or {}
        return {v: (recorded.get(v) or {}).get("memory") for v in sorted(self.router.variants_in_use())}

    def _load(self, kwargs: dict[str, Any], cfg: ServeConfig, voices: dict[str, str]) -> None:
        """The variants (routed ones, or the one artifact), their schedulers, caches, voices, defaults."""
        if (self.path / ROUTING_NAME).is_file():
            # routes among the variants the scheduler batches (runtime.autotune `batching`)
            tune = AutotuneSettings(batching=True) if autotune_default() else False
            self.router = Router(self.path, autotune=tune, **kwargs)
            self.model_id = f"{self.path.resolve().parent.name}/{self.path.resolve().name}"
            self.published = sorted(p.name for p in self.path.iterdir() if (p / ARTIFACT_JSON).is_file())
            # Ready means the routed variants are loaded; any other (the fallback included) opens when a
            # request names it, so a version that routes no bucket to FP32 never holds FP32's weights.
            for v in sorted(self.router.variants_in_use()):
                self._open(v)
            self.front = self.router.front
            cache_path = cfg.phrase_cache or (self.path / PHRASE_CACHE_NAME
                                              if (self.path / PHRASE_CACHE_NAME).is_file() else None)
        else:
            pipe = Pipeline(self.path, **kwargs)
            name = pipe.artifact.variant or self.path.name
            self.model_id = name
            self.published = [name]
            self._add(name, pipe)
            self.front = pipe.text
            cache_path = cfg.phrase_cache
        if cache_path is not None:
            self._attach_file_cache(cache_path)
        if cfg.cache_redis:
            self.redis = RedisPhraseCache(cfg.cache_redis)
        self.voice_book = VoiceBook(self.front, voices)
        self.voices = self.voice_book.voices
        self.default_params = self._defaults(cfg.seed)

    # ---- loading ----------------------------------------------------------------------------

    def _add(self, variant: str, pipe: Pipeline) -> None:
        self.pipes[variant] = pipe
        self._gpt_locks[variant] = gpt_lock = threading.Lock()
        if pipe.engine == "fast":  # the scheduler runs its own GPT steps; refinement alone uses pipe.gpt
            # requests that ask no look-ahead stream at the artifact's recorded one (exact when none)
            self.schedulers[variant] = Scheduler(pipe, max_batch=self.max_batch, max_queue=self.max_queue,
                                                 lookahead_frames=pipe.default_lookahead,
                                                 first_chunk_priority=self.first_chunk_priority,
                                                 release_free_rows=self.release_free_rows).start()
        else:
            log.warning("variant %s has no fused GPT graph (gpt_fast) for continuous batching on %s: it serves one "
                        "request at a time", variant, pipe.artifact.provider)
            self.schedulers[variant] = SequentialRunner(pipe, max_queue=self.max_queue, gpt_lock=gpt_lock).start()
        if self.file_cache is not None:
            self._attach_one(variant, pipe)

    def _open(self, variant: str) -> Pipeline:
        """The variant's pipeline and scheduler, opened (and verified) on first use."""
        with self._open_lock:
            if variant not in self.pipes:
                if variant not in self.published:
                    raise BadInput(f"model {quote(variant)} is not served here (models: {', '.join(self.model_names())})",
                                   "model")
                assert self.router is not None
                log.info("opening variant %s of %s", variant, self.path)
                self._add(variant, self.router.pipeline(variant))
            return self.pipes[variant]

    def _attach_file_cache(self, path: str | os.PathLike[str]) -> None:
        self.file_cache = PhraseCache(path)
        for v, pipe in self.pipes.items():
            self._attach_one(v, pipe)
        if not self.caches:
            # built for no variant of this version: refused, naming what it was built for
            self.file_cache.check_any(self._published_payloads(), self.path)
            # built for variants of this version this host does not route to (its autotune chose
            # others): a routed text is served from its bucket's build route's entry (_file_cache_hit)
            log.warning("phrase cache %s holds entries of %s; this host routes to %s: a routed phrase is served "
                        "from its bucket's build route's entry (a request naming a variant is a miss)",
                        self.file_cache.path, ", ".join(sorted(self.file_cache.artifacts)),
                        ", ".join(sorted(self.pipes)) or "nothing yet")

    def _published_payloads(self) -> set[str]:
        """The payload hashes of the version's published variants (just the one artifact unrouted)."""
        if self.router is None:
            return {payload_sha256(p.artifact.path) for p in self.pipes.values()}
        return {payload_sha256(self.path / v) for v in self.published}

    def _attach_one(self, variant: str, pipe: Pipeline) -> None:
        assert self.file_cache is not None
        try:
            self.caches[variant] = PipelineCache(self.file_cache, pipe)
        except ForgeError:  # a cache built for other variants of the version: this one has none
            pass

    @staticmethod
    def _defaults(seed: int) -> SynthParams:
        """`synth`'s defaults with `seed` (never a cache's knobs: a cache must not change what is said)."""
        return SynthParams(code=InferCodeParams(seed=seed), refine=RefineTextParams(seed=seed))

    def model_names(self) -> list[str]:
        names = [self.model_id]
        return names + [v for v in self.published if v != self.model_id]

    def speaker_for(self, voice: str) -> str | None:
        """The speaker string of a voice (serve.voices: a name, a mix or a raw speaker string)."""
        return self.voice_book.speaker_for(voice)

    # ---- requests -----------------------------------------------------------------------------

    def variant_for(self, model: str | None, normalised: str) -> str:
        if model is not None and model != self.model_id:
            self._open(model)
            return model
        if self.router is None:
            return next(iter(self.pipes))
        variant = self.router.routes[bucket_of(text_length(normalised), table_buckets(self.router.table)).name]
        if variant not in self.pipes:  # a route the deferred autotune moved after the first reply
            self._open(variant)
        return variant

    def prepare(self, text: str, params: SynthParams, model: str | None = None) -> Prepared:
        """Normalise, route, check, look the request up in the caches (by the text before
        refinement: a hit is not refined again) and, on a miss, refine (if asked). Raises a
        ForgeError for a request that cannot be served (the client's error)."""
        pending = self.front.iter_segments(text, params)
        segments: list[str] = []
        gone: set[str] = set()
        for seg, lost in pending:  # up to the second segment: the rest of a long text is normalised later
            gone.update(lost)
            if seg:
                segments.append(seg)
            if len(segments) == 2:
                break
        removed = "".join(sorted(gone))
        norm = segments[0]
        if len(segments) > 1:  # a long input: its segments are spoken in turn (`segment`), not cached
            prep = self._prepare_long(segments, params, model, removed)
            prep.pending = pending
            return prep
        variant = self.variant_for(model, norm)
        pipe = self.pipes[variant]
        check_code_request(pipe, norm, params.code)
        check_request(pipe, norm, replace(params, refine=None))  # all that submit checks: a 400 now, not later
        prep = Prepared(variant, norm, params, key_text=norm, removed=removed)
        hit = self._file_cache_hit(variant, pipe, norm, params, routed=model is None or model == self.model_id)
        if hit is not None:
            row, prep.served_by = hit
            prep.wav, prep.cache_tier, prep.text = row.wav, "file", row.text or norm
            return prep
        if self.redis is not None:
            wav = self.redis.lookup(pipe, norm, params)
            if wav is not None:
                prep.wav, prep.cache_tier = wav, "redis"
                return prep
        if params.refine is not None:
            with self._gpt_locks[variant]:  # refinement runs on the variant's one GPT step
                refined = pipe.refine_text([norm], params.refine)[0]
            if not is_speakable(refined):
                raise InputError("refinement produced nothing speakable (send \"refine\": false to speak the text as written)")
            check_code_request(pipe, refined, params.code)
            prep.text = refined
        return prep

    def _prepare_long(self, segments: list[str], params: SynthParams, model: str | None, removed: str) -> Prepared:
        """A long input's first segment ready for the scheduler, the others in `rest` (`finish_segments`
        adds those not yet normalised; each is checked before any audio). Every segment is generated on
        its own, so the route is the bucket of a segment (the longer of the first two); not looked up
        in the caches; each segment refined on its own when asked (`segment`)."""
        variant = self.variant_for(model, max(segments, key=len))
        pipe = self.pipes[variant]
        plain = replace(params, refine=None)
        for seg in segments:
            check_code_request(pipe, seg, plain.code)
        check_request(pipe, segments[0], plain)
        prep = Prepared(variant, segments[0], params, key_text=segments[0], removed=removed, rest=segments[1:])
        prep.text = self._refined(variant, segments[0], params)
        return prep

    def _refined(self, variant: str, text: str, params: SynthParams) -> str:
        """A segment refined when `params` asks; refinement that leaves nothing speakable or too long a
        text keeps the segment as written (a later segment fails no stream already under way)."""
        if params.refine is None:
            return text
        pipe = self.pipes[variant]
        with self._gpt_locks[variant]:  # refinement runs on the variant's one GPT step
            refined = pipe.refine_text([text], params.refine)[0]
        try:
            if not is_speakable(refined):
                raise InputError("refinement produced nothing speakable (send \"refine\": false to speak the text as written)")
            check_code_request(pipe, refined, params.code)
        except ForgeError as e:
            log.warning("segment %r: %s; spoken as written", text[:40], e)
            return text
        return refined

    def finish_segments(self, prep: Prepared) -> None:
        """Normalise the rest of a long input (`prep.pending`) into `prep.rest`, each segment checked, what
        it lost added to `prep.removed`: run beside its first segment's generation, before the reply's
        headers (InputError: the request is refused before any audio)."""
        if prep.pending is None:
            return
        pipe = self.pipes[prep.variant]
        gone = set(prep.removed)
        for seg, lost in prep.pending:
            gone.update(lost)
            if seg:
                check_code_request(pipe, seg, prep.params.code)
                prep.rest.append(seg)
        prep.pending = None
        prep.removed = "".join(sorted(gone))

    def segment(self, prep: Prepared, k: int) -> Prepared:
        """The `k`-th later segment of a long input as its own Prepared (same variant, speaker and seed),
        refined when the request asks (this blocks on the variant's GPT step: run it off the event loop)."""
        text = prep.rest[k]
        return Prepared(prep.variant, self._refined(prep.variant, text, prep.params), prep.params, key_text=text,
                        lookahead=prep.lookahead)

    def _file_cache_hit(self, variant: str, pipe: Pipeline, norm: str, params: SynthParams,
                        routed: bool) -> tuple[Row, str] | None:
        """(the phrase-cache hit, the variant whose entry it is) or None. A routed request whose bucket
        this host's autotune moved off the build's route is served from the build route's entry: the
        version's cache is warmed for the build's routes, which passed the gate for their buckets, and
        every variant shares the vocoder, so the hit is the audio the build's route serves for it."""
        cache = self.caches.get(variant)
        row = cache.lookup(pipe, norm, params) if cache is not None else None
        if row is not None:
            return row, variant
        if not routed or self.file_cache is None or self.router is None:
            return None
        build = self.router.build_route(norm)
        if build == variant:
            return None
        if (variant, build) not in self._stand_ins:
            try:
                self._stand_ins[(variant, build)] = PipelineCache(self.file_cache, pipe, entries_of=self.path / build)
            except ForgeError:  # no entries of the build's route, or another vocoder
                self._stand_ins[(variant, build)] = None
        stand_in = self._stand_ins[(variant, build)]
        row = stand_in.lookup(pipe, norm, params) if stand_in is not None else None
        return None if row is None else (row, build)

    def submit(self, prep: Prepared) -> Handle:
        """Queue a prepared miss on its variant's scheduler (QueueFullError when its queue is full)."""
        # the text is refined already (prepare): the scheduler generates codes for it as it is
        return self.schedulers[prep.variant].submit(prep.text, replace(prep.params, refine=None), normalized=True,
                                                    lookahead=prep.lookahead)

    def request_memory(self, prep: Prepared) -> RequestMemory:
        """At most what the miss `prep` adds to its variant's running batch (runtime.memory.request_memory)."""
        return request_memory(self.pipes[prep.variant].dims, text_chars=len(prep.text),
                              max_new_token=prep.params.code.max_new_token,
                              kv_itemsize=self.schedulers[prep.variant].kv_itemsize)

    def hit_cap(self, prep: Prepared, result: Any) -> bool:
        """Whether a finished miss's code stage was cut at the default cap unasked (`Pipeline.cut_at_cap`)."""
        return self.pipes[prep.variant].cut_at_cap(prep.params, len(result.codes))

    def text_tokens(self, prep: Prepared) -> int:
        """Tokens of `prep`'s input text as spoken (normalised, before refinement rewrites it; ChatTTS's
        tokenizer, no prompt template)."""
        return len(self.pipes[prep.variant].tokenizer.ids(prep.key_text or prep.text))

    def code_steps_of(self, prep: Prepared, wav: np.ndarray) -> int:
        """The code steps a decoded waveform holds: each step is 2 mel frames of `hop` samples, and Vocos
        gives one hop fewer than its frames."""
        hop = self.pipes[prep.variant].hop
        return (len(wav) + hop) // (2 * hop)

    def whole_wav(self, prep: Prepared, result: Any) -> np.ndarray:
        """A finished miss's waveform decoded whole (Decoder + Vocos on all its steps, as `synth`
        decodes), so a non-streamed response is `synth`'s audio; the mel goes to the Redis cache."""
        pipe = self.pipes[prep.variant]
        src = result.hiddens if prep.params.use_decoder else result.codes
        if len(src) == 0:
            return np.zeros(0, np.float32)
        mel = pipe.decode_mel(src, prep.params.use_decoder)
        wav = pipe.vocos(mel)
        if self.redis is not None:
            self.redis.store(pipe, prep.key_text or prep.text, prep.params, mel, result.codes)
        return wav

    def begin(self) -> None:
        with self._inflight_lock:
            self.inflight += 1

    def end(self) -> None:
        with self._inflight_lock:
            self.inflight -= 1
            self._inflight_lock.notify_all()
            start_tune = self.router is not None and self.router.tune_pending and self._tune_thread is None
            if start_tune:
                self._tune_thread = threading.Thread(target=self.tune_deferred, name="forge-autotune", daemon=True)
        if start_tune:
            self._tune_thread.start()

    def tune_deferred(self) -> None:
        """After the first reply: this host's measurement the load deferred (a cold autotune cache), at
        the lowest CPU priority; a variant it routes to is opened (its scheduler started) before any
        text goes there. The build's routes serve until then, and on any failure (logged)."""
        assert self.router is not None
        with contextlib.suppress(OSError):  # this thread and the session threads it creates yield to serving
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            record = self.router.measure_deferred()
            if record is None:
                return
            for variant in sorted({b["variant"] for b in record["buckets"].values()} - set(self.pipes)):
                self._open(variant)
            self.router.apply_routes(record)
        except Exception as e:  # noqa: BLE001 - the server keeps serving the build's routes
            log.error("autotune after the first reply failed (still serving the build's routes): %s", e)

    def drain(self, timeout: float) -> bool:
        """Wait until no admitted request runs (True) or `timeout` seconds passed (False)."""
        with self._inflight_lock:
            return self._inflight_lock.wait_for(lambda: self.inflight == 0, timeout)

    @property
    def waiting(self) -> int:
        return sum(s.waiting for s in self.schedulers.values())

    @property
    def running(self) -> int:
        return sum(s.running for s in self.schedulers.values())

    def warm(self, texts: list[str] | None = None) -> int:
        """Synthesize a few texts through each variant's scheduler (sessions loaded, arenas sized);
        with a phrase cache, also serve its first phrases (entries read, Vocos warm). Returns the count."""
        done = 0
        short = replace(self.default_params, code=replace(self.default_params.code, max_new_token=8,
                                                          min_new_token=0))
        for variant in list(self.pipes):
            prep = Prepared(variant, self.pipes[variant].normalize("Hello.", short), short)
            self.submit(prep).result(timeout=600)
            done += 1
        if not texts or self.file_cache is None:
            return done
        try:  # the cache's own request (only to read its entries: serving never takes a knob from it)
            params = replay_params(self.file_cache.knobs, self.front.num_vq)
        except ForgeError as e:
            log.info("phrase cache %s: entries not warmed (%s)", self.file_cache.path, e)
            return done
        for text in texts:
            variant = self.variant_for(None, text)
            cache = self.caches.get(variant)
            if cache is not None and cache.lookup(self.pipes[variant], text, params) is not None:
                done += 1
        return done

    def close(self, drain_s: float = 0.0) -> None:
        if drain_s > 0:
            self.drain(drain_s)
        for sched in self.schedulers.values():
            sched.close()
        self.schedulers = {}
        if self.file_cache is not None:
            self.file_cache.close()
            self.file_cache = None


def check_code_request(pipe: Pipeline, text: str, code: InferCodeParams) -> None:
    """Everything the scheduler would refuse about a request, checked before it is queued (a bad
    request answers 400 at once): sampling knobs, speaker, speaker sample and the prompt's length."""
    pipe.code_sampling(code)
    if code.stream_batch < 1:
        raise BadInput(f"stream_batch must be >= 1, got {code.stream_batch}", "stream_batch")
    with _field("spk_smp"):
        prompt = pipe.speaker_sample_codes(code.spk_smp) if code.spk_smp is not None else None
    if code.spk_emb is not None:
        with _field("spk_emb"):
            speaker_vector(code.spk_emb, pipe.dims.hidden_size)
    decorated = decorate_code_prompts([text], code.prompt, code.txt_smp, code.spk_emb)
    input_ids, _, _ = pipe.tokenizer.encode(decorated, pipe.num_vq, prompt)
    with _field("input"):
        pipe._check_length(input_ids.shape[1], code.max_new_token)


@contextlib.contextmanager
def _field(param: str) -> Iterator[None]:
    """A ForgeError raised inside as a BadInput naming the request field `param` (the 400's `param`)."""
    try:
        yield
    except BadInput as e:
        if e.param is None:  # a BadInput raised without a field is about this one
            e.param = param
        raise
    except ForgeError as e:
        raise BadInput(str(e), param) from None
