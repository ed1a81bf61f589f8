"""Capture the real inputs (and outputs) of the runtime's onnxruntime sessions through its public hook.

The runtime (`chattts_forge.runtime.Pipeline`) reports every session `run` to the observers of its
artifact (`LoadedArtifact.add_observer`). `instrument(pipe, callback, components)` adds one that calls
`callback(component, feeds, output_names, outputs)` and counts the calls per component. If a
future runtime stops calling `session.run` for a component (e.g. IO binding), `check_recorded`
raises a clear error instead of silently recording nothing.

The GPT generates with the fused graph (gpt_fast.onnx, IO binding, its KV cache updated in place),
whose steps cost a fraction of the plain graph's (which copies the whole cache in and out every
step). It runs no `session.run`, so `PlainFeedGptStep` reports each of its calls as the plain
gpt.onnx feed it equals: the same embeddings, mask and positions, and as `past_key_values` the fused
cache's slots (the plain graph's past up to float rounding, ~1e-6). The feed is built only when an
observer reads it, so unobserved steps cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chattts_forge.artifact import GPT
from chattts_forge.errors import ForgeError

Callback = Callable[[str, Mapping[str, np.ndarray], list[str], list[np.ndarray]], None]


@dataclass
class Recording:
    """The components being recorded and how many `run` calls of each were seen."""

    calls: dict[str, int] = field(default_factory=dict)
    remove: Callable[[], None] = lambda: None  # stops recording


class PlainGptFeed(Mapping[str, np.ndarray]):
    """The plain gpt.onnx feed of one fused-graph step, its arrays made (copied) on first access."""

    def __init__(self, step: Any, inputs: dict[str, np.ndarray], past: int) -> None:
        self._step, self._inputs, self._past = step, inputs, past
        self._names = [*inputs, *step.past_names]
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._inputs:
            return self._inputs[name]
        if name not in self._cache:
            buf = self._step.cache_buffer(name)  # [B, kv_heads, capacity, head_dim]; KeyError if unknown
            self._cache[name] = np.array(buf[:, :, : self._past], dtype=np.float32)
        return self._cache[name]

    def select(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The feed of batch `rows` only, copying just their part of the cache (a step of many rows
        observed a few rows at a time)."""
        out = {name: np.ascontiguousarray(arr[rows]) for name, arr in self._inputs.items()}
        for name in self._step.past_names:
            out[name] = np.array(self._step.cache_buffer(name)[rows, :, : self._past], dtype=np.float32)
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class PlainFeedGptStep:
    """A fused GPT step (runtime.fast_gpt.FastGptStep) whose calls are reported as plain-graph feeds."""

    def __init__(self, step: Any, report: Callable[[Mapping[str, np.ndarray], list[str], list[np.ndarray]], None]) -> None:
        self.inner = step
        self._report = report

    def reserve(self, positions: int) -> None:
        self.inner.reserve(positions)

    def reset(self, batch: int) -> None:
        self.inner.reset(batch)

    @property
    def past_length(self) -> int:
        return int(self.inner.past_length)

    def __call__(self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        past = self.past_length
        hidden = self.inner(inputs_embeds, attention_mask, position_ids)
        inputs = {"inputs_embeds": np.ascontiguousarray(inputs_embeds, dtype=np.float32),
                  "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
                  "position_ids": np.ascontiguousarray(position_ids, dtype=np.int64)}
        self._report(PlainGptFeed(self.inner, inputs, past), ["last_hidden_state"], [hidden])
        return hidden


def instrument(pipe: Any, callback: Callback, components: Sequence[str]) -> Recording:
    """Observe the sessions of `components` (those the artifact has) of a runtime Pipeline; the fused
    GPT step, when the pipeline generates with it, is reported as "gpt" (`PlainFeedGptStep`)."""
    art = pipe.artifact
    recording = Recording(calls={name: 0 for name in components if art.has_component(name)})

    def observe(component: str, feeds: Mapping[str, np.ndarray], names: list[str], outs: list[np.ndarray]) -> None:
        recording.calls[component] += 1
        callback(component, feeds, names, outs)

    remove_observer = art.add_observer(observe, recording.calls)
    fused = pipe.gpt if GPT in recording.calls and hasattr(pipe.gpt, "cache_buffer") else None
    if fused is not None:
        pipe.gpt = PlainFeedGptStep(fused, lambda feeds, names, outs: observe(GPT, feeds, names, outs))

    def remove() -> None:
        remove_observer()
        if fused is not None:
            pipe.gpt = fused

    recording.remove = remove
    return recording


def check_recorded(recording: Recording, component: str = GPT) -> None:
    if recording.calls.get(component) == 0:
        raise ForgeError(
            f"the runtime ran without calling the '{component}' session's run(): it changed how it calls "
            "onnxruntime (see calibration_data/recorder.py) and calibration cannot observe it"
        )


def new_pipeline(artifact_dir: Any, threads: int | None, engine: str = "auto") -> Any:
    """A runtime Pipeline on `artifact_dir`: the fused GPT graph generates when the artifact has one
    ("auto"; its steps are observed as plain-graph feeds, `instrument`), else the plain graph."""
    # the runtime package loads soundfile (12 ms): needed only here
    from chattts_forge.runtime import Pipeline

    return Pipeline(artifact_dir, threads=threads, engine=engine)


def synth_params(pipe: Any, seed: int, max_new_token: int) -> Any:
    """Code-stage parameters of one recorded sentence: ChatTTS defaults, a seeded random speaker."""
    # runtime.pipeline loads soundfile (12 ms): needed only here
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams

    # The corpus's text as ChatTTS's own front end reads it: calibration (and quantize's fidelity, which
    # reads these parameters) stays independent of the runtime's text normalizer, so a new normalizer
    # leaves every quantized graph's bytes as they were.
    return SynthParams(
        code=InferCodeParams(spk_emb=pipe.random_speaker(seed), seed=seed, max_new_token=max_new_token),
        text_normalization=False,
    )


