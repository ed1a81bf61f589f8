"""The runtime's public hooks: graph-input observers, a replaceable GPT step, the engine choice."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from chattts_forge.calibration_data.recorder import check_recorded, instrument
from chattts_forge.errors import ForgeError
from chattts_forge.runtime import (
    GptStep,
    InferCodeParams,
    Pipeline,
    SynthParams,
    choose_engine,
    open_gpt_step,
)
from chattts_forge.runtime.fast_gpt import FastGptStep

STEPS = 12


def _params(seed: int = 0) -> SynthParams:
    # min_new_token = max_new_token: EOS is masked, so every step is kept (one head run per step)
    return SynthParams(code=InferCodeParams(seed=seed, max_new_token=STEPS, min_new_token=STEPS))


def _record(pipe: Pipeline, components: tuple[str, ...]) -> tuple[dict[str, list], Callable[[], None]]:
    seen: dict[str, list] = {c: [] for c in components}

    def observer(component: str, feeds, names, outs) -> None:
        seen[component].append(({k: np.array(v) for k, v in feeds.items()}, list(names), [np.array(o) for o in outs]))

    return seen, pipe.artifact.add_observer(observer, components)


def test_observer_sees_every_run_of_its_components(tiny_artifacts: dict[str, Path]) -> None:
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1, engine="plain")
    pipe.gpt.reset(1)  # the GPT step exists (and holds its session) before the observer is added
    seen, remove = _record(pipe, ("gpt", "head_code"))
    [res] = pipe.synthesize("你好，欢迎使用。", _params())
    assert len(seen["gpt"]) == STEPS and len(seen["head_code"]) == STEPS
    feeds, names, outs = seen["gpt"][0]
    assert {"inputs_embeds", "attention_mask", "position_ids", "past_key_values.0.key"} <= set(feeds)
    assert names[0] == "last_hidden_state" and len(outs) == len(names)
    # what the code head was fed, step by step, is what the pipeline kept as hidden states
    fed = np.concatenate([f["hidden_states"] for f, _, _ in seen["head_code"]])
    np.testing.assert_array_equal(fed, res.hiddens)
    np.testing.assert_array_equal(fed[0], seen["gpt"][0][2][0][0, -1])
    remove()
    pipe.synthesize("你好。", _params())
    assert len(seen["gpt"]) == STEPS  # removed: nothing more recorded


def test_observing_changes_nothing(tiny_artifacts: dict[str, Path]) -> None:
    plain = Pipeline(tiny_artifacts["fp32"], threads=1, engine="plain")
    observed = Pipeline(tiny_artifacts["fp32"], threads=1, engine="plain")
    _record(observed, ("gpt", "head_code", "decoder", "vocos"))
    a = plain.synthesize("今天天气很好", _params(3))[0]
    b = observed.synthesize("今天天气很好", _params(3))[0]
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.wav, b.wav)


def test_the_fused_engine_is_observed_as_the_plain_graphs_feeds(tiny_artifacts: dict[str, Path]) -> None:
    """The fast engine runs gpt_fast through IO binding (no session.run): calibration's recorder reports
    each of its steps as the plain gpt.onnx feed it equals, so the plain observer graphs read the same
    activations (the fused cache's slots are the plain graph's past up to float rounding)."""
    fused = Pipeline(tiny_artifacts["fp32"], threads=1)  # auto: the artifact has gpt_fast
    plain = Pipeline(tiny_artifacts["fp32"], threads=1, engine="plain")
    assert fused.engine == "fast"
    seen: dict[str, list[dict[str, np.ndarray]]] = {"fused": [], "plain": []}
    for name, pipe in (("fused", fused), ("plain", plain)):
        recording = instrument(pipe, lambda c, feeds, names, outs, name=name: seen[name].append(
            {k: np.array(v) for k, v in feeds.items()}) if c == "gpt" else None, ("gpt", "head_code"))
        pipe.synthesize("你好。", _params())
        check_recorded(recording, "gpt")
        recording.remove()
    assert len(seen["fused"]) == len(seen["plain"]) == STEPS
    for f, p in zip(seen["fused"], seen["plain"], strict=True):
        assert set(f) == set(p)
        for k in p:
            assert f[k].shape == p[k].shape, k
            np.testing.assert_allclose(f[k], p[k], atol=1e-4, err_msg=k)
    assert isinstance(fused.gpt, FastGptStep)  # removing the recording gave the step back


def test_replaceable_gpt_step(tiny_artifacts: dict[str, Path]) -> None:
    """Any object with the GptStepLike interface drives the pipeline; a wrapper sees every step."""
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1, engine="plain")
    ref = pipe.synthesize("你好。", _params(1))[0]

    class Counting:
        def __init__(self, inner) -> None:
            self.inner, self.calls = inner, 0

        def reset(self, batch: int) -> None:
            self.inner.reset(batch)

        @property
        def past_length(self) -> int:
            return self.inner.past_length

        def __call__(self, inputs_embeds, attention_mask, position_ids):
            self.calls += 1
            return self.inner(inputs_embeds, attention_mask, position_ids)

    pipe.gpt = Counting(open_gpt_step(pipe.artifact, "plain"))
    got = pipe.synthesize("你好。", _params(1))[0]
    assert pipe.gpt.calls == STEPS
    np.testing.assert_array_equal(got.codes, ref.codes)


def test_engine_choice(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    with_fast = Pipeline(tiny_artifacts["fp32"], threads=1).artifact
    assert choose_engine(with_fast, "auto") == "fast" and choose_engine(with_fast, "plain") == "plain"
    assert isinstance(open_gpt_step(with_fast, "auto"), FastGptStep)
    assert isinstance(open_gpt_step(with_fast, "plain"), GptStep)
    # the same artifact without its gpt_fast component
    art = shutil.copytree(tiny_artifacts["fp32"], tmp_path / "plain-only")
    meta = json.loads((art / "artifact.json").read_text())
    del meta["components"]["gpt_fast"]
    (art / "artifact.json").write_text(json.dumps(meta))
    plain_only = Pipeline(art, threads=1).artifact
    assert choose_engine(plain_only, "auto") == "plain"
    with pytest.raises(ForgeError, match="no gpt_fast component"):
        choose_engine(plain_only, "fast")
    with pytest.raises(ForgeError, match="unknown GPT engine 'turbo'"):
        choose_engine(plain_only, "turbo")
