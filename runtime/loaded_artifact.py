"""An artifact folder opened for inference: checked files and the components' onnxruntime sessions.

`LoadedArtifact(path, provider="cpu", threads=None, verify="sha256", public_key=None)` validates
`artifact.json` (schema, dims), checks every file of the folder against its recorded sha256 before
any session exists (chattts_forge.integrity: artifact.json's records, and in a published folder its
manifest.json and SHA256SUMS; hashed in parallel once, then vouched for by the verified-hash cache;
`verify="size"` is the opt-out, `"full"` re-hashes every time, `"none"` checks presence), checks
the folder's signature (`model.sig`) when a public key is given, and opens one
`onnxruntime.InferenceSession` per component on first use. `artifact.verification` says what was
hashed and what the cache vouched for.

(`chattts_forge.artifact.ArtifactMeta` is that folder's artifact.json; the GPT step that runs its
GPT graph is `runtime.gpt_step`; the heap tuning around sessions is `runtime.heap`.)

Observing graph inputs (public hook, used by calibration and fidelity): every session `LoadedArtifact.session`
returns reports each `run` to the observers added with `LoadedArtifact.add_observer(observer, components)`:
`observer(component, feeds, output_names, outputs)` after the run. IO-binding runs (the fast GPT
engine) are not observed: they feed the fused graph, whose inputs are not `gpt.onnx`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.artifact import (
    DECODER,
    DVAE,
    DVAE_ENCODER,
    EMBED,
    FAST_GPT,
    GPT,
    HEAD_CODE,
    HEAD_TEXT,
    VOCODER,
    ArtifactMeta,
)
from chattts_forge.errors import ArtifactChanged, ForgeError
from chattts_forge.integrity import (
    PUBLISHED_MANIFEST,
    CheckReport,
    check_files,
    check_verify_mode,
    expected_files,
    sha256_file,
    stat_key,
)
from chattts_forge.log import get_logger
from chattts_forge.runtime.float_weights import float_decoder_bytes, has_float_compute_nbits
from chattts_forge.runtime.heap import release_free_heap
from chattts_forge.runtime.machine import u8s8_saturates
from chattts_forge.runtime.providers import resolve_provider, session_providers
from chattts_forge.runtime.saved_sessions import SavedSessions, saved_key, saved_sessions_default
from chattts_forge.runtime.textfront import load_speaker_stats

log = get_logger(__name__)


# The support files synthesis needs (artifact.json `files` keys).
RUNTIME_FILES = ("tokenizer", "speaker_stats", "homophones")
# Thread policy per component (CPU). Every session has its own intra-op pool whose workers spin for
# a while after each run; on a 2-core machine a pool still spinning steals the core the next
# session needs (figures: docs/measurements/2026-12-01/code-comment-figures.md).
# - the per-step sessions around the GPT are tiny (an embedding gather, 768x626 heads): one thread;
# - the Decoder/DVAE/Vocos run now and then (end of a text, stream chunks): all threads, no spinning,
#   so their workers go to sleep instead of competing with the next GPT steps;
# - the GPT graphs run back to back: all threads, spinning (the default).
SINGLE_THREAD_COMPONENTS = frozenset({EMBED, HEAD_CODE, HEAD_TEXT})
NO_SPIN_COMPONENTS = frozenset({DECODER, DVAE, DVAE_ENCODER, VOCODER})
# Components whose onnxruntime CPU arena gives back, after a large run, what that run added: an
# arena keeps its largest run's buffers for the session's life, and the Decoder/DVAE/Vocos run once
# per text on its whole length, so those buffers would sit under every later peak. A run over more
# than `SHRINK_MIN_POSITIONS` time positions (batch x the last axis of its first input: steps for
# the Decoder and DVAE, mel frames for Vocos) ends with the arena shrunk (run option
# memory.enable_memory_arena_shrinkage); stream chunks stay below it and keep their arena (a
# chunk's window is at most 132 Decoder steps and 110 Vocos frames at full size). Figures:
# docs/measurements/2026-12-01/code-comment-figures.md.
SHRINK_ARENA_COMPONENTS = NO_SPIN_COMPONENTS
# Components run without onnxruntime's memory pattern: it plans and caches one allocation layout per
# input shape, and these see a new shape with almost every text (their length), so the cache only
# grows; run concurrently (a server's whole decodes) their RSS grew without bound with it and stayed
# flat without it (docs/measurements/2026-12-04-epyc/soak/README.md).
NO_MEM_PATTERN_COMPONENTS = NO_SPIN_COMPONENTS
# Components whose session creation is mostly weight prepacking, so a saved optimized graph
# (runtime.saved_sessions) pays; the embedding gathers and the small code head pack nothing worth
# a second copy on disk. Figures: docs/measurements/2026-12-03-xeon/coldstart.md.
SAVED_COMPONENTS = frozenset({GPT, FAST_GPT, HEAD_TEXT, DECODER, DVAE, VOCODER})
SHRINK_MIN_POSITIONS = 160

RunObserver = Callable[[str, Mapping[str, Any], list[str], list[np.ndarray]], None]
"""Called after a session's `run`: (component, feeds, output names, outputs)."""


def _time_positions(feed: Mapping[str, Any]) -> int:
    """Batch x last axis of a run's first input (0 when it is not an array of rank >= 2)."""
    first = next(iter(feed.values()), None)
    shape = getattr(first, "shape", ())
    return int(shape[0]) * int(shape[-1]) if len(shape) >= 2 else 0


@cache
def _shrink_arena_options() -> Any:
    """onnxruntime RunOptions that shrink the CPU arena at the end of the run."""
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def warn_if_kernels_saturate(folder: Path, meta: ArtifactMeta) -> None:
    """Static INT8 with 8-bit weights (`quantize --weight-bits 8`) computes what its gate measured only
    where onnxruntime's u8s8 kernels do not saturate (`machine.u8s8_saturates`): say so elsewhere."""
    if ((meta.quantization or {}).get("options") or {}).get("weight_bits") == 8 and u8s8_saturates():
        log.warning(
            "%s has 8-bit static INT8 weights, which this CPU's u8s8 kernels (no VNNI/AMX) saturate: "
            "its outputs are less faithful than its gate measured; use a 7-bit build here",
            folder,
        )


def _stat_of(path: Path) -> str | None:
    try:
        return stat_key(os.stat(path))
    except OSError:
        return None


class ObservedSession:
    """A component's onnxruntime session whose `run` reports to the artifact's observers.

    Every other attribute (inputs, outputs, IO binding, options) is the wrapped session's own.
    """

    def __init__(
        self, session: Any, component: str, observers: list[tuple[frozenset[str] | None, RunObserver]]
    ) -> None:
        self.session = session
        self.component = component
        self._observers = observers  # the artifact's list, shared: observers added later apply too
        self._shrink = component in SHRINK_ARENA_COMPONENTS

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list:
        if self._shrink and run_options is None and _time_positions(input_feed) > SHRINK_MIN_POSITIONS:
            run_options = _shrink_arena_options()
        outs = self.session.run(output_names, input_feed, run_options)
        watching = [obs for comps, obs in self._observers if comps is None or self.component in comps]
        if watching:
            names = list(output_names) if output_names else [o.name for o in self.session.get_outputs()]
            for observer in watching:
                observer(self.component, input_feed, names, outs)
        return outs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


class LoadedArtifact:
    """An artifact folder (docs/artifact-format.md) with lazily created sessions."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        provider: str = "cpu",
        threads: int | None = None,
        verify: str = "sha256",
        meta: ArtifactMeta | None = None,
        public_key: str | os.PathLike[str] | None = None,
        saved_sessions: bool | SavedSessions | None = None,
    ) -> None:
        """`meta`: the folder's artifact.json when it is not written yet (read from the folder otherwise).
        `public_key`: a PEM public key; the folder's `model.sig` must then verify with it.
        `saved_sessions`: reuse this host's saved optimized graphs (runtime.saved_sessions; True, False,
        a `SavedSessions`, or None: on for a published variant folder unless CHATTTS_FORGE_SAVED_SESSIONS=0)."""
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise ForgeError(f"artifact folder {self.path} does not exist")
        verify = check_verify_mode(verify)
        if public_key is not None and verify in ("size", "none"):
            raise ForgeError(
                f"a signature check (public key {public_key}) needs the files hashed; "
                f"it cannot be combined with verify={str(verify)!r}"
            )
        if threads is not None and threads < 1:
            raise ForgeError(f"threads must be >= 1, got {threads}")
        # `provider` may be cpu, cuda or auto; `self.provider` is what it resolved to (cpu or cuda).
        self.provider = resolve_provider(provider)
        self.providers = session_providers(self.provider)
        self.threads = threads
        self.meta = meta if meta is not None else ArtifactMeta.load(self.path)
        self.dims = self.meta.require_dims()
        self.components: dict[str, dict[str, Any]] = self.meta.components
        self._sessions: dict[str, Any] = {}
        self._observers: list[tuple[frozenset[str] | None, RunObserver]] = []
        self.verify_mode = verify
        # where each session came from (`_create_session`): "saved", "built and saved", "built"
        self.session_sources: dict[str, str] = {}
        self._float_matmuls: dict[str, bool] = {}  # component -> its session unpacks INT8 MatMuls (_unpacks)
        if saved_sessions is None:  # published folders only: the build opens many short-lived artifacts
            saved_sessions = saved_sessions_default() and (self.path / PUBLISHED_MANIFEST).is_file()
        if saved_sessions is True:
            saved_sessions = SavedSessions()
        self._saved: SavedSessions | None = saved_sessions or None
        self.public_key = Path(public_key).expanduser() if public_key is not None else None
        for key in RUNTIME_FILES:
            self._check_plain_file(key)
        for name in (EMBED, GPT, HEAD_CODE, VOCODER):
            self.check_component(name)
        # Every recorded file, before the first session: a changed byte anywhere is refused here.
        self._expected = expected_files(self.path, self.meta)
        self.verification: CheckReport = check_files(self.path, self._expected, verify)
        self._verified_stats = {rel: _stat_of(self.path / rel) for rel in self._expected}
        if self.provider == "cpu":
            warn_if_kernels_saturate(self.path, self.meta)
        # debug: a command's one-line error must stay its only output (synth logs the summary at the end)
        log.debug("%s: %s", self.path, self.verification.summary())
        if self.public_key is not None:
            self._check_signature()

    def _check_signature(self) -> None:
        """The folder's model.sig against the public key, from the sha256s just checked (no second read)."""
        # signing: only with a public key; 3.6 ms to import
        from chattts_forge.signing import verify_folder

        checked = {rel: e.sha256 for rel, e in self._expected.items() if e.sha256}

        def hashes(root: Path, rels: list[str]) -> dict[str, str]:
            # Files the records list were hashed (or vouched for) above; any other file is hashed now.
            return {rel: checked[rel] if rel in checked else sha256_file(root / rel) for rel in rels}

        verify_folder(self.path, self.public_key, hashes=hashes)  # type: ignore[arg-type]
        log.debug("%s: signature model.sig verified with %s", self.path, self.public_key)

    @property
    def variant(self) -> str:
        return self.meta.variant

    def file(self, key: str) -> Path:
        """A support file (`files.KEY` of artifact.json), confined to the artifact folder."""
        return self.meta.support_path(self.path, key)

    def _check_plain_file(self, key: str) -> None:
        p = self.file(key)
        if not p.is_file():
            raise ForgeError(f"artifact file {p} is missing")

    def component_path(self, name: str) -> Path:
        return self.meta.component_path(self.path, name)

    def check_component(self, name: str) -> Path:
        """The component's graph file, which must exist (its bytes, and its external data's, were
        checked when the artifact was opened)."""
        if name not in self.components:
            raise ForgeError(f"{self.meta.where} lists no component '{name}'")
        p = self.component_path(name)
        self.meta.external_data_path(self.path, name)  # confined to the folder, or an error naming the field
        if not p.is_file():
            raise ArtifactChanged(f"artifact file {p} (component '{name}') is missing")
        return p

    def _recheck_component(self, name: str) -> None:
        """A session made after the artifact was opened (sessions are made on first use) reads its files
        then: those whose stat changed since they were verified are checked again (`verify` mode), so a
        file changed on disk under a running process is an ArtifactChanged naming it, never loaded."""
        if self.verify_mode == "none":
            return
        paths = [self.component_path(name), self.meta.external_data_path(self.path, name)]
        rels = [Path(os.path.relpath(p, self.path)).as_posix() for p in paths if p is not None]
        changed = {
            rel: self._expected[rel]
            for rel in rels
            if rel in self._expected and _stat_of(self.path / rel) != self._verified_stats.get(rel)
        }
        if changed:
            check_files(self.path, changed, self.verify_mode)
            self._verified_stats.update({rel: _stat_of(self.path / rel) for rel in changed})

    def has_component(self, name: str) -> bool:
        return name in self.components and self.component_path(name).is_file()

    def session_threads(self, name: str) -> int | None:
        """Intra-op threads of a component's session (None: onnxruntime's default, one per core)."""
        return 1 if name in SINGLE_THREAD_COMPONENTS else self.threads

    def add_observer(
        self, observer: RunObserver, components: Iterable[str] | None = None
    ) -> Callable[[], None]:
        """Call `observer(component, feeds, output_names, outputs)` after every `run` of the sessions of
        `components` (all when None), those already open included. Returns a function that removes it."""
        entry = (None if components is None else frozenset(components), observer)
        self._observers.append(entry)

        def remove() -> None:
            if entry in self._observers:
                self._observers.remove(entry)

        return remove

    def session(self, name: str) -> Any:
        """The onnxruntime session of a component (created on first use), observable (`add_observer`)."""
        if name not in self._sessions:
            # onnxruntime: only once a session is made here; 0.06 s to import
            import onnxruntime as ort

            path = self.check_component(name)
            self._recheck_component(name)
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            opts.inter_op_num_threads = 1
            threads = self.session_threads(name)
            if threads is not None:
                opts.intra_op_num_threads = threads
            if name in NO_SPIN_COMPONENTS:
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if name in NO_MEM_PATTERN_COMPONENTS:
                opts.enable_mem_pattern = False
            opts.log_severity_level = 3
            t0 = time.perf_counter()
            session, source = self._create_session(name, path, opts, threads)
            got = session.get_providers()
            if got[0] != self.providers[0]:  # onnxruntime's silent fallback (see runtime.providers)
                raise ForgeError(
                    f"{path.name} could not be placed on {self.providers[0]} (got {', '.join(got)})"
                )
            release_free_heap()
            self._sessions[name] = ObservedSession(session, name, self._observers)
            self.session_sources[name] = source
            log.debug(
                "loaded %s on %s in %.3f s (%s)",
                path.name,
                self.providers[0],
                time.perf_counter() - t0,
                source,
            )
        return self._sessions[name]

    def _saved_key(self, name: str, threads: int | None) -> dict[str, Any] | None:
        """The saved-session key of a component (runtime.saved_sessions), or None where none is used:
        turned off, not on the CPU, or files not hashed (verify size/none: a saved graph must never
        stand in for a file nobody checked)."""
        if (
            self._saved is None
            or name not in SAVED_COMPONENTS
            or self.provider != "cpu"
            or self.verify_mode not in ("sha256", "full")
        ):
            return None

        def record(p: Path) -> Any:
            return self._expected.get(Path(os.path.relpath(p, self.path)).as_posix())

        graph = record(self.component_path(name))
        data_path = self.meta.external_data_path(self.path, name)
        data = record(data_path) if data_path is not None else None
        if (
            graph is None
            or graph.sha256 is None
            or (data_path is not None and (data is None or data.sha256 is None))
        ):
            return None
        options = {"threads": threads, "spinning": name not in NO_SPIN_COMPONENTS, "level": "all"}
        if self._unpacks(name):
            options["float_matmuls"] = True  # the graph saved is the unpacked one (runtime.float_weights)
        return saved_key(graph.sha256, data.sha256 if data is not None else None, options)

    def _unpacks(self, name: str) -> bool:
        """Whether the component's session is made from its graph with the INT8 Decoder MatMuls as float
        ones (runtime.float_weights: the Decoder on the CPU)."""
        if name != DECODER or self.provider != "cpu":
            return False
        if name not in self._float_matmuls:
            self._float_matmuls[name] = has_float_compute_nbits(self.component_path(name))
        return self._float_matmuls[name]

    def _create_session(self, name: str, path: Path, opts: Any, threads: int | None) -> tuple[Any, str]:
        """A new session of `path` and where it came from: "saved" (this host's saved optimized graph,
        loaded with optimizations off), "built and saved", or "built"."""
        # onnxruntime: only once a session is made here; 0.06 s to import
        import onnxruntime as ort

        key = self._saved_key(name, threads)
        saved = self._saved.lookup(key) if key is not None and self._saved is not None else None
        if saved is not None:
            level = opts.graph_optimization_level
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            try:
                return ort.InferenceSession(str(saved), sess_options=opts, providers=self.providers), "saved"
            except Exception as e:  # a saved entry onnxruntime refuses: built again from the artifact
                log.info(
                    "saved session %s refused (%s): building %s again",
                    saved,
                    str(e).splitlines()[0],
                    path.name,
                )
                opts.graph_optimization_level = level
        try:
            graph: str | bytes = str(path)
            if self._unpacks(name):
                graph = float_decoder_bytes(path) or graph
            if key is None or self._saved is None:
                return ort.InferenceSession(graph, sess_options=opts, providers=self.providers), "built"
            with self._saved.saving(key, opts):
                session = ort.InferenceSession(graph, sess_options=opts, providers=self.providers)
            return session, "built and saved"
        except Exception as e:  # onnxruntime raises its own exception types
            raise ForgeError(f"cannot load {path}: {str(e).splitlines()[0]}") from None

    @cached_property
    def speaker_stats(self) -> np.ndarray:
        return load_speaker_stats(self.file("speaker_stats"), self.dims.hidden_size)

    def token_ids(self) -> dict[str, int]:
        return dict(self.meta.tokens or {})
