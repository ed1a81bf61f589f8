"""A command whose options are declared on a config dataclass (chattts_forge.options) reads back the
words `option_args` writes for it: the build driver's step words and the command's parser agree."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from chattts_forge.calibration_data.calibrate_config import CalibrateConfig
from chattts_forge.calibration_data.cli import calibrate
from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput
from chattts_forge.evaluate.bench_cli import bench
from chattts_forge.evaluate.bench_options import FIELDS_READ_BY, LOAD_RUN, PLAIN_RUN, SOAK_RUN, BenchOptions
from chattts_forge.evaluate.cli import evaluate, evaluate_latency, score
from chattts_forge.evaluate.evaluate_config import EvaluateConfig, LatencyRunConfig
from chattts_forge.evaluate.score import ScoreSettings
from chattts_forge.options import declared_options, option, option_args, parse_declared_choices
from chattts_forge.runtime.cli import normalize, synth, warm
from chattts_forge.runtime.generation import GptEngine
from chattts_forge.runtime.providers import Provider
from chattts_forge.runtime.serve.cli import serve
from chattts_forge.runtime.serve.config import ServeConfig, ServeLaunch
from chattts_forge.runtime.synth import NormalizeConfig, SynthConfig, WarmConfig


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
    (normalize, NormalizeConfig, {"text": "Hi.", "lang": "en", "artifact": Path("a"), "text_normalization": False}),
    (serve, ServeConfig, {"artifact": Path("a"), "port": 9000, "max_batch": 2, "first_chunk_priority": False,
                          "provider": "auto", "voices_file": Path("v.json"), "deadline_s": 10.0,
                          "admin_loopback": True, "admin_hosts": ("h1", "h2"), "cors_origins": ("https://a.b",),
                          "canary_share": 0.5, "verify": "full", "memory_limit": "6G"}),
    (bench, BenchOptions, {"artifact": "a", "baseline": "pytorch", "batch": "1,2", "engine": "plain", "load": True,
                           "arrival": "poisson", "rate": 2.0, "decode_overlap": False, "first_chunk_priority": True,
                           "stream_lookahead": 4, "provider": "auto", "phrase_cache": "c.bin", "json_out": "o.json"}),
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


def test_serve_reads_its_launch_options_beside_its_config() -> None:
    launch = {"ray_address": "local", "replicas": 3}
    args = option_args(ServeConfig, {"artifact": Path("a")}) + option_args(ServeLaunch, launch)
    params = _read_back(serve, args)
    assert {name: params[name] for name in launch} == launch


def test_a_closed_set_given_as_its_spelling_becomes_its_member() -> None:
    cfg = SynthConfig(artifact=Path("a"), out=Path("o.wav"), engine="fast", provider="auto", verify="cheap")
    assert cfg.engine is GptEngine.FAST and cfg.provider is Provider.AUTO and cfg.verify == "sha256"
    assert BenchOptions(artifact="a", engine="plain").engine is GptEngine.PLAIN
    with pytest.raises(BadInput, match="unknown provider 'gpu'"):
        WarmConfig(Path("a"), Path("p"), Path("o"), provider="gpu")


def test_bench_options_map_onto_the_run_they_pick() -> None:
    load = BenchOptions(artifact="a", load=True, concurrency="2,8", arrival="poisson", rate=2.0).load_config()
    assert (list(load.concurrency), load.arrival, load.rate, load.baseline) == ([2, 8], "poisson", 2.0, None)
    assert type(load.arrival) is str  # the report records the spelling
    soak = BenchOptions(artifact="a", soak_s=5.0, url="http://h:1", concurrency="2,8").soak_config()
    assert (soak.seconds, soak.concurrency, soak.artifact) == (5.0, 8, "a")
    plain_run = BenchOptions(artifact="a", baseline="pytorch", batch="4,1", provider="auto").bench_config()
    assert (plain_run.baseline, list(plain_run.batches), plain_run.provider) == ("pytorch", [4, 1], "auto")
    with pytest.raises(BadInput, match=r"^--url does not apply to the plain benchmark \(it applies to: --load, --soak\)$"):
        BenchOptions(artifact="a", url="http://h:1")
    with pytest.raises(BadInput, match="--batch takes values >= 1"):
        BenchOptions(artifact="a", batch="0").bench_config()


def test_a_spelled_value_is_written_as_the_command_line_reads_it() -> None:
    # batch sizes are a tuple in the config and "1,4" on the command line; "auto" (the baseline's
    # default) is the option left out, so even a command line that spells its defaults omits it
    assert option_args(EvaluateConfig, {"batch_sizes": (1, 4)}) == ["--batch", "1,4"]
    assert option_args(EvaluateConfig, {"baseline_checkpoint": "auto"}, spell_defaults=True) == []
    params = _read_back(evaluate, ["--artifact", "a", "--reference", "r", "--corpus", "c", "--out", "o"])
    assert EvaluateConfig(**params).batch_sizes == (1, 4, 8)
    assert EvaluateConfig(**params).baseline_checkpoint == "auto"
    assert EvaluateConfig(**{**params, "no_baseline": True}).baseline_checkpoint is None


class _Flavour(Choice):
    SWEET = "sweet"
    SOUR = "sour"


@dataclass(frozen=True)
class _Order:
    flavour: _Flavour = option(_Flavour.SWEET, "--flavour", choices=_Flavour)
    topping: _Flavour | None = option(None, "--topping", choices=_Flavour, noun="topping flavour")
    # plain text on the command line, a Choice in the config (as --provider)
    side: _Flavour = option(_Flavour.SOUR, "--side", parsed_as=_Flavour)

    def __post_init__(self) -> None:
        parse_declared_choices(self)


def test_declared_choices_are_parsed_by_one_helper_naming_each_field() -> None:
    order = _Order(flavour="sour", side="sweet")
    assert order.flavour is _Flavour.SOUR and order.side is _Flavour.SWEET and order.topping is None
    with pytest.raises(BadInput, match=r"^unknown flavour 'salty' \(choose from: sweet, sour\)$"):
        _Order(flavour="salty")
    with pytest.raises(BadInput, match=r"^unknown topping flavour 'salty' "):
        _Order(topping="salty")
    with pytest.raises(BadInput, match=r"^unknown side 'salty' "):
        _Order(side="salty")
    with pytest.raises(BadInput, match=r"^unknown flavour 'None' "):  # None is no value where the default is one
        _Order(flavour=None)  # type: ignore[arg-type]


def test_a_parsed_as_choice_is_plain_text_on_the_command_line() -> None:
    @click.command()
    @declared_options(_Order)
    def order(**values: Any) -> None:
        _Order(**values)

    side = next(p for p in order.params if p.name == "side")
    flavour = next(p for p in order.params if p.name == "flavour")
    assert not isinstance(side.type, click.Choice) and isinstance(flavour.type, click.Choice)
    result = CliRunner().invoke(order, ["--side", "salty"])
    assert result.exit_code != 0 and isinstance(result.exception, BadInput)
    assert str(result.exception) == "unknown side 'salty' (choose from: sweet, sour)"


@pytest.mark.parametrize("given, message", [
    ({"steps": 100, "load": True}, "--steps does not apply to --load (it applies to: the plain benchmark)"),
    ({"threads": 4, "soak_s": 5.0, "url": "http://h:1"},
     "--threads does not apply to --soak (it applies to: the plain benchmark, --load)"),
    ({"plot": "p.png", "load": True}, "--plot does not apply to --load (it applies to: --soak)"),
    ({"first_chunk_priority": False}, "--no-first-chunk-priority does not apply to the plain benchmark "
                                      "(it applies to: --load)"),
])  # fmt: skip
def test_bench_refuses_an_option_its_run_does_not_read(given: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput, match=f"^{re.escape(message)}$") as refused:
        BenchOptions(artifact="a", **given)
    assert refused.value.param == next(name for name in given if name not in ("load", "soak_s", "url"))


def test_bench_takes_defaults_and_the_environments_admin_token_in_every_run() -> None:
    # the defaults spelled out, and a token exported for the soak, are no refusal in another run
    assert BenchOptions(artifact="a", load=True, steps=422, admin_token="t").run == LOAD_RUN
    assert BenchOptions(artifact="a", concurrency="1,4,8", admin_token="t").run == PLAIN_RUN


class _ReadRecorder:
    """Stands in for a BenchOptions in its mapping methods, recording the fields they read."""

    def __init__(self, opts: BenchOptions) -> None:
        self.opts, self.read = opts, set()

    def __getattr__(self, name: str) -> Any:
        attr = inspect.getattr_static(BenchOptions, name, None)
        if isinstance(attr, property):
            return attr.fget(self)  # type: ignore[misc]
        self.read.add(name)
        return getattr(self.opts, name)


@pytest.mark.parametrize("run, opts, mapping, beside", [
    (PLAIN_RUN, BenchOptions(artifact="a"), BenchOptions.bench_config, {"artifact", "json_out"}),
    (LOAD_RUN, BenchOptions(artifact="a", load=True), BenchOptions.load_config, set()),
    (SOAK_RUN, BenchOptions(artifact="a", soak_s=5.0, url="http://h:1"), BenchOptions.soak_config,
     {"json_out", "plot"}),
])  # fmt: skip
def test_the_fields_declared_read_by_a_run_are_those_its_config_reads(
    run: str, opts: BenchOptions, mapping: Any, beside: set[str]
) -> None:
    # `beside`: what bench_cli reads itself next to the run's config; --load and --soak pick the run
    recorder = _ReadRecorder(opts)
    mapping(recorder)
    assert recorder.read | beside | {"load", "soak_s"} == FIELDS_READ_BY[run]
