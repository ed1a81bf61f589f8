"""A command whose options are declared on a config dataclass (chattts_forge.options) reads back the
words `option_args` writes for it: the build driver's step words and the command's parser agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from chattts_forge.calibration_data.calibrate_config import CalibrateConfig
from chattts_forge.calibration_data.cli import calibrate
from chattts_forge.evaluate.cli import evaluate, evaluate_latency, score
from chattts_forge.evaluate.evaluate_config import EvaluateConfig, LatencyRunConfig
from chattts_forge.evaluate.score import ScoreSettings
from chattts_forge.options import option_args
from chattts_forge.runtime.cli import synth, warm
from chattts_forge.runtime.synth import SynthConfig, WarmConfig


def _read_back(command: click.Command, args: list[str]) -> dict[str, Any]:
    return dict(command.make_context(command.name or "", args).params)


CASES = [
    (calibrate, CalibrateConfig, {"artifact_dir": Path("a"), "corpus": "c.txt", "out_dir": Path("o"),
                                   "max_samples": "all", "merge": (Path("m1"), Path("m2")), "allow_one_language": True,
                                   "disk_budget_mb": 64.0}),
    (evaluate, EvaluateConfig, {"artifact": Path("a"), "reference": Path("r"), "corpus": "c", "out": Path("o"),
                                 "batch_sizes": (1, 4), "no_baseline": True, "listen_sentences": 0, "seam_lookahead": 3,
                                 "provider": "auto"}),
    (evaluate_latency, LatencyRunConfig, {"reference": Path("r"), "corpus": "c", "out": Path("o"),
                                           "artifacts": (Path("a"), Path("b"))}),
    (score, ScoreSettings, {"audio_dir": Path("a"), "transcripts": Path("t.tsv"), "lang": "zh", "mos": True,
                            "json_out": Path("r.json"), "speaker_reference": Path("s.wav")}),
    (synth, SynthConfig, {"artifact": Path("a"), "out": Path("o.wav"), "text": "Hi.", "autotune": False,
                          "stream_lookahead": "exact", "sample_format": "pcm16", "verify": "size", "top_k": 5,
                          "prompt": "[speed_3]", "use_decoder": False, "public_key": Path("k.pub"), "stream": True}),
    (warm, WarmConfig, {"artifact": Path("a"), "phrases": Path("p"), "out": Path("o"), "seed": 3, "refine": False,
                        "use_decoder": False, "engine": "plain", "temperature": 0.5, "max_new_token": 96}),
]  # fmt: skip


@pytest.mark.parametrize("command, declared, values", CASES, ids=[c[0].name for c in CASES])
def test_the_command_reads_back_the_words_written_for_it(
    command: click.Command, declared: type, values: dict[str, Any]
) -> None:
    params = _read_back(command, option_args(declared, values))
    assert {name: params[name] for name in values} == values


def test_a_field_without_default_is_a_required_option() -> None:
    with pytest.raises(click.MissingParameter, match="phrases"):
        warm.make_context("warm", ["--artifact", "a", "--out", "o"])
    assert WarmConfig(Path("a"), Path("p"), Path("o")).seed == 0


@pytest.mark.parametrize("command, args", [(calibrate, ["--out", "o"]),
                                           (evaluate, ["--artifact", "a", "--corpus", "c", "--out", "o"])])  # fmt: skip
def test_a_required_declared_option_must_be_given(command: click.Command, args: list[str]) -> None:
    with pytest.raises(click.MissingParameter):
        command.make_context(command.name or "", args)


def test_a_spelled_value_is_written_as_the_command_line_reads_it() -> None:
    # batch sizes are a tuple in the config and "1,4" on the command line; "auto" (the baseline's
    # default) is the option left out, so even a command line that spells its defaults omits it
    assert option_args(EvaluateConfig, {"batch_sizes": (1, 4)}) == ["--batch", "1,4"]
    assert option_args(EvaluateConfig, {"baseline_checkpoint": "auto"}, spell_defaults=True) == []
    params = _read_back(evaluate, ["--artifact", "a", "--reference", "r", "--corpus", "c", "--out", "o"])
    assert EvaluateConfig(**params).batch_sizes == (1, 4, 8)
    assert EvaluateConfig(**params).baseline_checkpoint == "auto"
    assert EvaluateConfig(**{**params, "no_baseline": True}).baseline_checkpoint is None
