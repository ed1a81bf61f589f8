"""Each quantize option is declared once, on its `QuantizeConfig` field (quantize/config.py): the
CLI's options, the build driver's step commands and the record of the options all come from the
declarations, and the closed option sets are `Choice` enums spelled as before (issue 35, item 2)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from chattts_forge.artifact import ArtifactMeta, DecoderWeights, KvCache, QuantizeMethod
from chattts_forge.choices import plain
from chattts_forge.cli import main
from chattts_forge.driver.records import Build
from chattts_forge.driver.steps import PRESET_STAGE_ARGS, Step, method_stage_args, preset_quantize_args
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.options import changed_args, declared_fields, option_args
from chattts_forge.quantize.cli import given_options
from chattts_forge.quantize.cli import quantize as quantize_command
from chattts_forge.quantize.config import (
    METHOD_CONFIGS,
    CalibrateMethod,
    CommonOptions,
    FidelityOptions,
    FidelitySettings,
    Int4Algorithm,
    Int4Config,
    QuantizeCommandOptions,
    QuantizeConfig,
    options_read_by,
)
from chattts_forge.quantize.int4 import ALGORITHMS
from chattts_forge.quantize.methods import open_method

# Every declared option at a value other than its default.
EVERY_OPTION = dict(
    calibration=Path("calib"), per_channel=False, exclude=("a*", "b"), quantize_head=False, seed=3, threads=2,
    kv_cache="int8", decoder="int8-a8", calibrate_method="entropy", activation_type="int8",
    symmetric_activations=True, percentile=99.5, weight_bits=8, smooth_alpha=0.5, smooth=False, block_size=32,
    accuracy_level=0, algorithm="k_quant", min_agreement=0.9, min_cosine=0.99, max_kl=0.1, step_nodes=5,
    fidelity=False, fidelity_corpus="builtin:calibration", fidelity_sentences=3, fidelity_steps=12,
    fp32_runs=Path("runs.npz"), gate=Path("gate.toml"),
)


def _parsed(args: list[str]) -> QuantizeConfig:
    """`args` read by the `quantize` command's own click parser, as the QuantizeConfig it makes
    (from the options given on the command line, as the command does)."""
    ctx = quantize_command.make_context("quantize", ["--artifact", "a", "--out", "o", *args])
    params = dict(ctx.params)
    params.pop("artifact_dir"), params.pop("out_dir")
    return QuantizeConfig(params.pop("method"), **given_options(ctx, params))


def test_every_field_but_progress_is_a_declared_option_of_the_command() -> None:
    declared = {f.name for f in declared_fields(QuantizeCommandOptions)}
    assert declared == {f.name for f in fields(QuantizeCommandOptions)} - {"progress"}
    assert set(EVERY_OPTION) == declared
    names = {p.name for p in quantize_command.params if isinstance(p, click.Option)}
    assert names == declared | {"artifact_dir", "out_dir", "method"}
    # the command's options are the union of the methods' own; each method reads the common and fidelity ones
    assert declared == {f.name for t in METHOD_CONFIGS.values() for f in declared_fields(t)}
    shared = {f.name for g in (CommonOptions, FidelityOptions) for f in declared_fields(g)}
    assert all(shared <= {f.name for f in fields(t)} for t in METHOD_CONFIGS.values())


def test_the_words_a_config_derives_are_read_back_as_that_config() -> None:
    """What the driver puts in a step's command (`changed_args`) is what the CLI parses into the same
    config, for every method with every option it reads."""
    for method in METHOD_CONFIGS:
        config = QuantizeConfig(method, **options_read_by(method, EVERY_OPTION))
        assert type(config) is METHOD_CONFIGS[method] and config.method == method
        assert _parsed(["--method", method, *changed_args(config)]) == config, method
        assert changed_args(QuantizeConfig(method)) == []  # defaults are not spelled out
        assert _parsed(["--method", method]) == QuantizeConfig(method)


# An option each method does not read, given explicitly (Python keyword or command line), and the methods that do.
FOREIGN = {"dynamic": ("block_size", 32, "--block-size", "int4, auto"),
           "static": ("gate", Path("g.toml"), "--gate", "auto"),
           "int4": ("min_agreement", 0.9, "--min-agreement", "dynamic, static"),
           "auto": ("algorithm", "rtn", "--algorithm", "int4")}  # fmt: skip


@pytest.mark.parametrize("method", list(METHOD_CONFIGS))
def test_each_method_refuses_another_methods_option_given_explicitly(method: str) -> None:
    name, value, flag, readers = FOREIGN[method]
    message = rf"^{flag} does not apply to --method {method} \(it applies to: {readers}\)$"
    with pytest.raises(BadInput, match=message) as err:
        QuantizeConfig(method, **{name: value})
    assert err.value.param == name
    with pytest.raises(BadInput, match=message):  # on the command line: refused when the config is built
        _parsed(["--method", method, flag, str(value)])
    # every option of another method is refused, every one of its own accepted (at a non-default value)
    own = options_read_by(method, EVERY_OPTION)
    for other, other_value in EVERY_OPTION.items():
        if other not in own:
            with pytest.raises(BadInput, match=f"does not apply to --method {method} "):
                QuantizeConfig(method, **{other: other_value})
    assert {f.name for f in declared_fields(QuantizeConfig(method, **own))} >= set(own)


def test_a_foreign_option_is_refused_by_the_command_but_a_default_is_not_given() -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["quantize", "--artifact", "none", "--method", "dynamic", "--out", "o",
                               "--block-size", "32"])
    assert res.exit_code != 0 and "--block-size does not apply to --method dynamic (it applies to: int4, auto)" in (
        res.output + str(res.exception))
    # left at its default, an option of another method is not given: only the options named count
    assert _parsed(["--method", "dynamic", "--per-channel"]) == QuantizeConfig("dynamic", per_channel=True)
    with pytest.raises(BadInput, match="--no-smooth does not apply"):  # a switch is named as given
        _parsed(["--method", "int4", "--no-smooth"])


def test_closed_option_sets_are_enums_spelled_as_before() -> None:
    config = QuantizeConfig("int4", kv_cache="int8", algorithm="gptq", decoder="fp32")
    assert config.method is QuantizeMethod.INT4 and config.kv_cache is KvCache.INT8
    assert config.algorithm is Int4Algorithm.GPTQ and config.decoder is DecoderWeights.FP32
    # a member is its spelling: in text, JSON and as a key of a dict of plain strings
    assert f"{config.kv_cache}" == "int8" and json.dumps([config.algorithm]) == '["gptq"]'
    assert {"int4": 1}[config.method] == 1 and plain(QuantizeConfig("static").calibrate_method) == "minmax"
    assert ALGORITHMS == ("rtn", "k_quant", "gptq", "importance") == Int4Algorithm.values()
    assert CalibrateMethod.values() == ("minmax", "entropy", "percentile")
    with pytest.raises(BadInput, match=r"^unknown INT4 algorithm 'gptx' \(choose from: rtn, k_quant, gptq, importance\)$"):
        QuantizeConfig("int4", algorithm="gptx")
    with pytest.raises(ForgeError, match="unknown method 'int3'"):
        QuantizeConfig("int3")


def test_the_algorithm_choices_and_help_come_from_the_declaration() -> None:
    algorithm = next(p for p in quantize_command.params if p.name == "algorithm")
    assert isinstance(algorithm.type, click.Choice) and tuple(algorithm.type.choices) == Int4Algorithm.values()
    assert "rtn, k_quant, gptq or importance" in (algorithm.help or "")


def test_the_record_holds_the_recorded_fields_of_the_groups_the_method_reads() -> None:
    meta = ArtifactMeta(variant="fp32", components={})
    int4 = open_method(QuantizeConfig("int4", block_size=32, exclude=["x"], decoder="fp32"), Path("src"), meta)
    record = int4.options_record().to_dict()
    assert record == {"per_channel": False, "calibrate_method": None, "activation_type": None,
                      "symmetric_activations": None, "block_size": 32, "accuracy_level": 4, "algorithm": "rtn",
                      "quantize_head": True, "decoder": "fp32", "exclude_patterns": ["x"], "seed": 0}
    assert all(type(v) in (bool, int, str, list, type(None)) for v in record.values())  # plain JSON values
    static = open_method(QuantizeConfig("static", calibrate_method="percentile", weight_bits=8), Path("s"), meta)
    srec = static.options_record().to_dict()
    assert (srec["calibrate_method"], srec["percentile"], srec["weight_bits"], srec["block_size"]) == (
        "percentile", 99.99, 8, None)
    assert "smooth_alpha" not in srec and "algorithm" not in srec
    shared = {f.name for g in (CommonOptions, FidelityOptions) for f in fields(g)}
    assert {f.name for f in fields(Int4Config)} - shared == {"block_size", "accuracy_level", "algorithm"}


def test_fidelity_settings_are_one_type_made_from_the_options() -> None:
    config = QuantizeConfig("dynamic", fidelity_sentences=3, fidelity_steps=12, seed=5, threads=1)
    assert config.fidelity_settings == FidelitySettings(max_sentences=3, max_new_token=12, seed=5, threads=1)


def test_the_driver_spells_each_quantize_step_as_it_did(tmp_path: Path) -> None:
    """The commands (and so the step keys) of every quantized variant are those written by hand
    before the options were declared."""
    work = tmp_path / "w"
    for d in ("convert/fp32", "calibration"):
        (work / d).mkdir(parents=True)
    (work / "reference_run").mkdir()
    (work / "reference_run" / "trajectories.npz").write_bytes(b"runs")
    variants = ("fp32", "int8-dynamic", "int8-static", "int4", "auto", "int8-dynamic-kv8")
    build = Build(work, tmp_path / "to", variants, None, "tiny", 0, "builtin:calibration", "builtin:evaluation",
                  "gate.toml", {})
    fp32, calib, runs = str(work / "convert/fp32"), str(work / "calibration"), str(work / "reference_run/trajectories.npz")

    def out(v: str) -> str:
        return str(work / "quantized" / v)

    # the tiny preset's options follow each step's own, those its method reads (before: all three to
    # every step, appended as the stage's arguments: the int4 and auto commands are unchanged)
    fidelity = ["--fidelity-sentences", "4", "--fidelity-steps", "32"]
    block = ["--block-size", "32"]
    expected = {
        "int8-dynamic": ["--method", "dynamic", "--out", out("int8-dynamic"), "--fp32-runs", runs, *fidelity],
        "int8-static": ["--method", "static", "--out", out("int8-static"), "--calibration", calib, "--fp32-runs", runs,
                        *fidelity],
        "int4": ["--method", "int4", "--out", out("int4"), "--calibration", calib, "--fp32-runs", runs, *fidelity,
                 *block],
        "auto": ["--method", "auto", "--out", out("auto"), "--calibration", calib, "--fp32-runs", runs,
                 "--gate", "gate.toml", *fidelity, *block],
        "int8-dynamic-kv8": ["--method", "dynamic", "--out", out("int8-dynamic-kv8"), "--calibration", calib,
                             "--kv-cache", "int8", "--fp32-runs", runs, *fidelity],
    }  # fmt: skip
    for variant, rest in expected.items():
        assert build.quantize_step(variant).argv == ["quantize", "--artifact", fp32, *rest], variant
    assert "quantize" not in PRESET_STAGE_ARGS["tiny"]  # each quantize step gets its method's share
    assert {m: preset_quantize_args("tiny", m) for m in METHOD_CONFIGS} == {
        "dynamic": fidelity, "static": fidelity, "int4": fidelity + block, "auto": fidelity + block}
    assert preset_quantize_args("full", "int4") == []
    # a real checkpoint gets no preset options (as the other stages' preset arguments)
    real = Build(work, tmp_path / "to", variants, tmp_path / "ckpt", "tiny", 0, "builtin:calibration",
                 "builtin:evaluation", "gate.toml", {})
    assert real.quantize_step("int4").argv[-2:] == ["--fp32-runs", runs]
    assert option_args(Int4Config, {"block_size": 128, "quantize_head": False}) == ["--no-head"]


def test_the_user_quantize_stage_args_reach_the_methods_that_read_them(tmp_path: Path) -> None:
    """`--stage-args quantize=...` is shared by every quantize step of a build: each step gets the
    words its method reads, so `--block-size 64` tunes int4 and auto without dynamic refusing it."""
    words = ["--block-size", "64", "--fidelity-sentences=3", "--no-smooth", "--weight-bits", "8", "--exclude",
             "*head*", "--not-an-option"]
    assert method_stage_args("dynamic", words) == (
        ["--fidelity-sentences=3", "--exclude", "*head*", "--not-an-option"],
        ["--block-size", "64", "--no-smooth", "--weight-bits", "8"])
    assert method_stage_args("static", words)[1] == ["--block-size", "64"]
    assert method_stage_args("int4", words)[1] == ["--no-smooth", "--weight-bits", "8"]
    work = tmp_path / "w"
    for d in ("convert/fp32", "calibration"):
        (work / d).mkdir(parents=True)
    build = Build(work, tmp_path / "to", ("fp32", "int8-dynamic", "int4"), None, "tiny", 0, "builtin:calibration",
                  "builtin:evaluation", None, {"quantize": ["--block-size", "64"], "calibrate": ["--block-size", "1"]})
    assert build.stage_extra(build.quantize_step("int8-dynamic")) == []
    assert build.stage_extra(build.quantize_step("int4")) == ["--block-size", "64"]
    # every other stage's words pass as given: its own command judges them
    assert build.stage_extra(Step("calibrate", "calibrate", ["calibrate"], work / "calibration")) == [
        "--block-size", "1"]
