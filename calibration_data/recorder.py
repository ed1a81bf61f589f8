"""Capture the real inputs (and outputs) of the runtime's onnxruntime sessions through its public hook.

The runtime (`chattts_forge.runtime.Pipeline`) reports every session `run` to the observers of its
artifact (`Artifact.add_observer`). `instrument(pipe, callback, components)` adds one that calls
`callback(component, feeds, output_names, outputs)` and counts the calls per component. If a
future runtime stops calling `session.run` for a component (e.g. IO binding), `check_recorded`
raises a clear error instead of silently recording nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError

Callback = Callable[[str, Mapping[str, np.ndarray], list[str], list[np.ndarray]], None]


@dataclass
class Recording:
    """The components being recorded and how many `run` calls of each were seen."""

    calls: dict[str, int] = field(default_factory=dict)
    remove: Callable[[], None] = lambda: None  # stops recording


def instrument(pipe: Any, callback: Callback, components: Sequence[str]) -> Recording:
    """Observe the sessions of `components` (those the artifact has) of a runtime Pipeline."""
    art = pipe.artifact
    recording = Recording(calls={name: 0 for name in components if art.has_component(name)})

    def observe(component: str, feeds: Mapping[str, np.ndarray], names: list[str], outs: list[np.ndarray]) -> None:
        recording.calls[component] += 1
        callback(component, feeds, names, outs)

    recording.remove = art.add_observer(observe, recording.calls)
    return recording


def check_recorded(recording: Recording, component: str = "gpt") -> None:
    if recording.calls.get(component) == 0:
        raise ForgeError(
            f"the runtime ran without calling the '{component}' session's run(): it changed how it calls "
            "onnxruntime (see calibration_data/recorder.py) and calibration cannot observe it"
        )


def new_pipeline(artifact_dir: Any, threads: int | None) -> Any:
    """A runtime Pipeline on `artifact_dir` running the plain GPT graph.

    The fused fast GPT (gpt_fast.onnx, IO binding) has other graph inputs than gpt.onnx, which is
    what quantize reads; record through the plain graph (same numbers, ~1e-6)."""
    from chattts_forge.runtime import Pipeline

    return Pipeline(artifact_dir, threads=threads, engine="plain")


def synth_params(pipe: Any, seed: int, max_new_token: int) -> Any:
    """Code-stage parameters of one recorded sentence: ChatTTS defaults, a seeded random speaker."""
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams

    return SynthParams(
        code=InferCodeParams(spk_emb=pipe.random_speaker(seed), seed=seed, max_new_token=max_new_token)
    )


