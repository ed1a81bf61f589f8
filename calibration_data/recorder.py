"""Capture the real inputs (and outputs) of the runtime's onnxruntime sessions, without editing runtime/.

The runtime (`chattts_forge.runtime.pipeline.Pipeline`) gets every session from
`Artifact.session(name)`, which caches them in `Artifact._sessions`; the GPT step keeps its own
reference in `Pipeline.gpt.session`. `instrument(pipe, callback)` replaces those objects with a
`RecordingSession` proxy: `run()` forwards to the real session and then calls
`callback(component, feeds, output_names, outputs)`; every other attribute is the real session's.
If a future runtime stops calling `session.run` (e.g. IO binding), `check_recorded` raises a clear
error instead of silently recording nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError

Callback = Callable[[str, dict[str, np.ndarray], list[str], list[np.ndarray]], None]


class RecordingSession:
    """Proxy of an onnxruntime InferenceSession that reports every `run`."""

    def __init__(self, inner: Any, component: str, callback: Callback) -> None:
        self._inner = inner
        self._component = component
        self._callback = callback
        self.calls = 0

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, Any], run_options: Any = None) -> list:
        outs = self._inner.run(output_names, input_feed, run_options)
        self.calls += 1
        names = list(output_names) if output_names else [o.name for o in self._inner.get_outputs()]
        self._callback(self._component, input_feed, names, outs)
        return outs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def instrument(pipe: Any, callback: Callback, components: Sequence[str]) -> dict[str, RecordingSession]:
    """Wrap the sessions of `components` of a runtime Pipeline; returns the proxies by name."""
    art = pipe.artifact
    sessions = getattr(art, "_sessions", None)
    if not isinstance(sessions, dict):
        raise ForgeError("the runtime's Artifact has no session cache to instrument (runtime API changed)")
    proxies = {}
    for name in components:
        if not art.has_component(name):
            continue
        proxy = RecordingSession(art.session(name), name, callback)
        sessions[name] = proxy
        proxies[name] = proxy
    gpt_step = getattr(pipe, "gpt", None)
    if "gpt" in proxies and gpt_step is not None and hasattr(gpt_step, "session"):
        gpt_step.session = proxies["gpt"]
    return proxies


def check_recorded(proxies: dict[str, RecordingSession], component: str = "gpt") -> None:
    if component in proxies and proxies[component].calls == 0:
        raise ForgeError(
            f"the runtime ran without calling the '{component}' session's run(): it changed how it calls "
            "onnxruntime (see calibration_data/recorder.py) and calibration cannot observe it"
        )


def new_pipeline(artifact_dir: Any, threads: int | None) -> Any:
    """A runtime Pipeline on `artifact_dir` (imported lazily: the runtime is optional at import time)."""
    try:
        from chattts_forge.runtime.pipeline import Pipeline
    except ImportError as e:
        raise ForgeError(f"the runtime is unavailable ({e}); calibration needs chattts_forge.runtime") from None
    try:
        pipe = Pipeline(artifact_dir, threads=threads, engine="plain")
    except TypeError:  # a runtime without engine selection
        pipe = Pipeline(artifact_dir, threads=threads)
    # The fused fast GPT (gpt_fast.onnx, IO binding) has other graph inputs than gpt.onnx, which is
    # what quantize reads; record through the plain graph (same numbers, ~1e-6).
    from chattts_forge.runtime.session import GptStep

    if not isinstance(getattr(pipe, "gpt", None), GptStep):
        pipe.gpt = GptStep(pipe.artifact.session("gpt"), pipe.dims)
    return pipe


def synth_params(pipe: Any, seed: int, max_new_token: int) -> Any:
    """Code-stage parameters of one recorded sentence: ChatTTS defaults, a seeded random speaker."""
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams

    return SynthParams(
        code=InferCodeParams(spk_emb=pipe.random_speaker(seed), seed=seed, max_new_token=max_new_token)
    )


