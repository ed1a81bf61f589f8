"""evaluate's corpus-level work sharded over Ray actors (`evaluate --ray ADDRESS|local --ray-workers N`).

What runs where:

- on the Ray workers: teacher-forced fidelity (the FP32 synthesis of each held-out sentence, recorded,
  and its replay through the quantized graphs) and the ASR transcription of the synthesized audio;
  the corpus is cut into one contiguous shard per worker; each worker is a Ray actor that loads the
  artifact, its FP32 reference and the ASR model once and keeps them for all its shards;
- in the evaluating process: latency (timing shares no node with the sharded work: it runs before the
  actors start, and the report's `machine` section says where), the per-tensor error table (4
  recorded whole-graph samples, shipped back by the workers), the merge and the gate.

Sentence i is seeded `seed + i` wherever it runs, and the shards' results are merged in corpus order
before any corpus figure is computed, so the fidelity and intelligibility figures equal the
single-process run's. Artifacts are read by path: every worker node must see the artifact and
reference folders at the same path (a shared file system); nothing is copied through Ray's object
store but the per-sentence results (logits, hidden states, mels: ~10 KB per GPT step).

A worker that dies mid-shard is restarted and its shard retried (`retries`, default 1); a shard that
still fails is a one-line `ForgeError` naming it, raised before any report is written.

Ray is the optional `scale` extra; it is imported only inside functions (`chattts_forge.raycluster`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.evaluate.asr import get_backend
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.raycluster import connect

log = get_logger(__name__)

# Called in the worker at the start of every shard as hook(kind, shard_index): tests use it to kill
# a worker's process mid-evaluation.
ShardHook = Callable[[str, int], None]


def shard_indices(count: int, shards: int) -> list[list[int]]:
    """`count` indices cut into at most `shards` contiguous, near-equal, non-empty blocks in order."""
    shards = max(1, min(shards, count))
    bounds = np.linspace(0, count, shards + 1).round().astype(int)
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def where() -> dict[str, Any]:
    """This process's place in the cluster (for the report)."""
    return {"hostname": socket.gethostname(), "pid": os.getpid()}


class CorpusWorker:
    """One Ray actor's state: the artifact pair and ASR backends, loaded once, reused for every shard."""

    def __init__(self, reference: str, artifact: str, threads: int | None, hook: ShardHook | None = None) -> None:
        from chattts_forge.quantize.fidelity import ReplaySessions

        self.reference, self.artifact, self.threads, self.hook = Path(reference), Path(artifact), threads, hook
        self.sessions: Any = None
        self._ReplaySessions = ReplaySessions
        self.backends: dict[tuple[str, str, str | None], Any] = {}

    def describe(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        node_id = ctx.get_node_id()
        # The address the node joined the cluster with (get_node_ip_address guesses a routable one).
        node_ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), None)
        return {**where(), "node_id": node_id, "node_ip": node_ip, "actor_id": ctx.get_actor_id()}

    def fidelity_shard(self, shard: int, corpus: Any, indices: list[int], max_sentences: int, steps: int,
                       seed: int) -> tuple[list[Any], list[Any]]:
        """(per-sentence comparisons, the trajectories stripped to what the local merge needs)."""
        from chattts_forge.quantize.fidelity import FidelitySettings, Trajectory, record_trajectories

        if self.hook is not None:
            self.hook("fidelity", shard)
        if self.sessions is None:
            self.sessions = self._ReplaySessions(self.reference, self.artifact, self.threads)
        with quiet_logger():
            settings = FidelitySettings(max_sentences=max_sentences, max_new_token=steps, seed=seed,
                                        threads=self.threads, progress=False)
            trajs = record_trajectories(self.reference, corpus, settings, indices=indices)
        comparisons = [self.sessions.compare(t) for t in trajs]
        # The local side needs every trajectory's hidden states (head error) and the first whole-graph
        # samples (per-tensor table: the first 4 of the corpus), not the per-step feeds.
        slim, kept = [], 0
        for t in trajs:
            samples = t.full_samples[: max(0, 4 - kept)]
            kept += len(samples)
            slim.append(Trajectory(t.text, hidden=t.hidden, full_samples=samples))
        return comparisons, slim

    def transcribe_shard(self, shard: int, asr: str, lang: str, asr_model: str | None,
                         waves: dict[str, tuple[np.ndarray, int]], ids: list[str]
                         ) -> tuple[dict[str, str], dict[str, dict[str, float]], dict[str, Any]]:
        from chattts_forge.evaluate.score import transcribe_waveforms

        if self.hook is not None:
            self.hook("asr", shard)
        key = (asr, lang, asr_model)
        if key not in self.backends:
            self.backends[key] = get_backend(asr, lang, asr_model, self.threads)
        backend = self.backends[key]
        hyps, timing = transcribe_waveforms(waves, ids, backend, progress=False)
        return hyps, timing, backend.describe()


@dataclass
class RayShards:
    """A pool of `workers` CorpusWorker actors on the cluster at `address`; use as a context manager
    (the actors are killed on exit, the cluster itself is left running)."""

    address: str
    workers: int
    reference: Path
    artifact: Path
    threads: int | None
    retries: int = 1
    hook: ShardHook | None = None

    def __enter__(self) -> RayShards:
        if self.workers < 1:
            raise BadInput("--ray-workers must be >= 1")
        ray = self.ray = connect(self.address)
        remote = ray.remote(num_cpus=1, max_restarts=self.retries, max_task_retries=self.retries)(CorpusWorker)
        self.actors = [remote.remote(str(self.reference), str(self.artifact), self.threads,
                                                        self.hook) for _ in range(self.workers)]
        self.names = [f"ray-worker-{i}" for i in range(self.workers)]
        try:
            self.placement = self._gather("describe", [(a, ()) for a in self.actors], "start")
        except BaseException:
            self.__exit__()  # no actor outlives a pool that failed to start
            raise
        for name, place in zip(self.names, self.placement, strict=True):
            place["name"] = name
            log.info("%s: %s pid %s (node %s)", name, place["hostname"], place["pid"], place["node_ip"])
        return self

    def __exit__(self, *exc: object) -> None:
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a)
            except Exception as e:  # an actor already gone: nothing left to stop
                log.debug("ray.kill: %s", e)

    def _gather(self, method: str, calls: list[tuple[Any, tuple[Any, ...]]], what: str) -> list[Any]:
        """Run `method` on each (actor, args) and wait for all; a failure names the shard and worker."""
        ray = self.ray
        refs = [getattr(actor, method).remote(*args) for actor, args in calls]
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else e
                if isinstance(cause, ForgeError):
                    raise ForgeError(f"Ray {what} shard {i}: {cause}") from None
                first = (str(cause).strip().splitlines() or [type(cause).__name__])[-1]
                raise ForgeError(f"Ray {what} shard {i} failed on ray-worker-{i}: {first}") from None
            except ray.exceptions.RayError as e:
                raise ForgeError(
                    f"Ray {what} shard {i}: worker ray-worker-{i} died and the shard failed again after "
                    f"{self.retries} retr{'y' if self.retries == 1 else 'ies'} ({type(e).__name__})") from None
        return out

    def fidelity(self, corpus: Any, sentences: int, steps: int, seed: int,
                 per_tensor: bool = True, top_tensors: int = 8) -> dict[str, Any]:
        """`measure_fidelity`'s record for the first `sentences` of `corpus`, computed on the workers."""
        from chattts_forge.quantize.fidelity import ReplaySessions, summarize_fidelity

        shards = shard_indices(min(sentences, len(corpus.sentences)), self.workers)
        t0 = time.perf_counter()
        results = self._gather("fidelity_shard", [
            (self.actors[i], (i, corpus, idx, sentences, steps, seed)) for i, idx in enumerate(shards)], "fidelity")
        log.info("fidelity: %d shard(s) on %d Ray worker(s) in %.1f s", len(shards), self.workers,
                 time.perf_counter() - t0)
        comparisons = [c for cmp, _ in results for c in cmp]
        trajectories = [t for _, trajs in results for t in trajs]
        if not comparisons:
            raise BadInput(f"no sentence of corpus '{corpus.name}' could be synthesized for fidelity")
        result = summarize_fidelity(self.reference, corpus, comparisons,
                                    {"max_sentences": sentences, "max_new_token": steps, "seed": seed})
        if per_tensor:
            sessions = ReplaySessions(self.reference, self.artifact, self.threads)
            try:
                result["per_tensor"] = sessions.tensor_table(trajectories, top_tensors, False)
            except ForgeError as e:  # FP16 graphs: see evaluate._fidelity
                log.info("per-tensor error table unavailable for %s (%s)", self.artifact, e)
                result["per_tensor_unavailable"] = str(e)
        return result

    def transcriber(self, asr: str, asr_model: str | os.PathLike[str] | None) -> Callable[..., Any]:
        """A `score_intelligibility` transcriber: the utterances sharded over the workers, merged in order."""
        model = str(asr_model) if asr_model is not None else None

        def transcribe(lang: str, waves: dict[str, tuple[np.ndarray, int]], ids: Sequence[str]
                       ) -> tuple[dict[str, str], dict[str, dict[str, float]], dict[str, Any]]:
            shards = shard_indices(len(ids), self.workers)
            calls = []
            for i, idx in enumerate(shards):
                part = [ids[j] for j in idx]
                calls.append((self.actors[i], (i, asr, lang, model, {k: waves[k] for k in part}, part)))
            results = self._gather("transcribe_shard", calls, f"ASR {lang}")
            hyps: dict[str, str] = {}
            timing: dict[str, dict[str, float]] = {}
            for h, t, _ in results:
                hyps.update(h)
                timing.update(t)
            return hyps, timing, results[0][2]

        return transcribe

    def describe(self) -> dict[str, Any]:
        """For the report's `machine` section: the cluster, the workers and what they ran."""
        return {
            "address": self.address,
            "workers": self.placement,
            "retries": self.retries,
            "sharded": ["fidelity (FP32 synthesis + teacher-forced replay)", "ASR transcription"],
            "latency_measured_on": {**where(), "role": "the evaluating process, before any Ray worker started"},
        }
