"""ChatTTS's code knobs are one dataclass, `chattts_defaults.CodeKnobs` (issue 35): the configs of
`synth`, `warm` and `reference` inherit it, and the sampling options of their commands are its
declared fields, with ChatTTS's InferCodeParams defaults."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from chattts_forge.chattts_defaults import CodeKnobs
from chattts_forge.errors import BadInput
from chattts_forge.runtime.compat_params import InferCodeParams
from chattts_forge.runtime.synth import SynthConfig, WarmConfig

KNOBS = ("temperature", "top_p", "top_k", "repetition_penalty", "min_new_token", "max_new_token", "prompt")


def test_the_knobs_are_chattts_own_defaults() -> None:
    ours, theirs = CodeKnobs(), InferCodeParams()
    assert {f.name for f in fields(CodeKnobs)} == set(KNOBS)
    assert (ours.temperature, ours.top_p, ours.top_k, ours.repetition_penalty) == (
        theirs.temperature, theirs.top_P, theirs.top_K, theirs.repetition_penalty)
    assert (ours.max_new_token, ours.min_new_token, ours.prompt) == (
        theirs.max_new_token, theirs.min_new_token, theirs.prompt)


def test_the_configs_inherit_the_knobs_and_keep_their_own_positions() -> None:
    from chattts_forge.torch_ref.reference import ReferenceParams

    synth = SynthConfig(Path("a"), Path("b.wav"), "text", top_k=5)  # artifact, out, text: positional as before
    assert (synth.artifact, synth.out, synth.text, synth.top_k) == (Path("a"), Path("b.wav"), "text", 5)
    warm = WarmConfig(Path("a"), Path("p.txt"), Path("c.bin"))
    for config in (synth, warm, ReferenceParams()):
        assert isinstance(config, CodeKnobs)
        assert [getattr(config, k) for k in KNOBS if k != "top_k"] == [getattr(CodeKnobs(), k) for k in KNOBS
                                                                       if k != "top_k"]
    with pytest.raises(BadInput, match=r"^--top-p must lie in \(0, 1\]$"):
        ReferenceParams(top_p=1.5).check()
    with pytest.raises(BadInput, match="--min-new-token must lie between 0 and --max-new-token"):
        CodeKnobs(min_new_token=9, max_new_token=4).check_knobs()


def test_the_reference_sampling_options_are_the_declared_knobs() -> None:
    from chattts_forge.torch_ref.cli import reference
    from chattts_forge.torch_ref.reference import ReferenceParams

    names = {p.name for p in reference.params}
    assert {"speaker", "temperature", "top_p", "top_k", "repetition_penalty", "min_new_token", "use_decoder"} <= names
    ctx = reference.make_context("reference", ["--checkpoint", "c", "--text", "t", "--out", "o.wav", "--top-k", "7"])
    knobs = {k: v for k, v in ctx.params.items() if k in KNOBS}
    assert CodeKnobs(**knobs) == CodeKnobs(top_k=7)
    assert ReferenceParams(**knobs) == ReferenceParams(top_k=7)
