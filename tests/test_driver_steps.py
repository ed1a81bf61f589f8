"""The build's step commands are derived from each stage's declared options (chattts_forge.options):
the words of every step of a default tiny build are those the driver wrote as literal flags before,
so the steps' keys, and what the build publishes, do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.driver import cli
from chattts_forge.driver.config import BuildConfig
from chattts_forge.driver.pipeline import _prepared_build
from chattts_forge.driver.records import Build
from chattts_forge.driver.steps import PRESET_STAGE_ARGS, WARM_ARGS
from chattts_forge.evaluate.evaluate_config import EvaluateSettings
from chattts_forge.options import option_args
from chattts_forge.runtime.synth import WarmConfig


def _build(tmp_path: Path, pytorch_baseline: bool, gate: str | None) -> Build:
    work = tmp_path / "w"
    for d in (
        "convert/fp32",
        "quantized/int8-dynamic",
        "quantized/int8-static",
        "reference_run",
        "latency_run",
        "checkpoint",
    ):
        (work / d).mkdir(parents=True)
    (work / "latency_run" / "latency_run.json").write_text(json.dumps({"artifacts": {"int8-dynamic": {}}}))
    build = Build(
        work,
        tmp_path / "to",
        ("fp32", "int8-dynamic", "int8-static"),
        None,
        "tiny",
        0,
        "builtin:calibration",
        "builtin:evaluation",
        gate,
        {},
    )
    build.pytorch_baseline = pytorch_baseline
    return build


def test_the_preset_and_warm_words_are_those_written_by_hand() -> None:
    assert PRESET_STAGE_ARGS["tiny"]["calibrate"] == ["--max-samples", "8", "--max-new-token", "48"]
    assert PRESET_STAGE_ARGS["tiny"]["evaluate"] == [
        "--max-sentences", "3", "--max-new-token", "48", "--fidelity-sentences", "3", "--fidelity-steps", "24",
        "--batch", "1,4", "--bucket-sentences", "2", "--cache-phrases", "4",
    ]  # fmt: skip
    assert PRESET_STAGE_ARGS["full"]["warm"] == ["--max-new-token", "96", "--no-refine"]
    assert WARM_ARGS == ["--seed", "0"]


def test_the_calibrate_step_is_spelled_as_it_was(tmp_path: Path) -> None:
    build = _build(tmp_path, False, None)
    work = build.work
    step = build.calibrate_step()
    assert step is not None
    assert step.argv == [
        "calibrate",
        "--artifact",
        str(work / "convert/fp32"),
        "--corpus",
        "builtin:calibration",
        "--out",
        str(work / "calibration"),
    ]


@pytest.mark.parametrize("pytorch_baseline, gate", [(False, None), (True, "gate.toml")])
def test_the_evaluate_steps_are_spelled_as_they_were(
    tmp_path: Path, pytorch_baseline: bool, gate: str | None
) -> None:
    build = _build(tmp_path, pytorch_baseline, gate)
    work = build.work
    fp32, ckpt = str(work / "convert/fp32"), str(work / "checkpoint")
    baseline = ["--baseline-checkpoint", ckpt] if pytorch_baseline else ["--no-baseline"]
    assert build.reference_step().argv == [
        "evaluate-reference", "--reference", fp32, "--corpus", "builtin:evaluation", "--out",
        str(work / "reference_run"), *baseline,
    ]  # fmt: skip
    latency = build.latency_step()
    assert latency is not None
    assert latency.argv == [
        "evaluate-latency", "--reference", fp32, "--corpus", "builtin:evaluation", "--out", str(work / "latency_run"),
        "--artifact", str(work / "quantized/int8-dynamic"), "--artifact", str(work / "quantized/int8-static"),
    ]  # fmt: skip
    gated = ["--gate", gate] if gate else []
    for variant, timed in (("int8-dynamic", True), ("int8-static", False)):
        latency_run = ["--latency-run", str(work / "latency_run")] if timed else []
        assert build.evaluate_step(variant).argv == [
            "evaluate", "--artifact", str(work / "quantized" / variant), "--reference", fp32,
            "--corpus", "builtin:evaluation", "--out", str(work / "reports" / variant), *baseline, *gated,
            "--reference-run", str(work / "reference_run"), *latency_run,
        ], variant  # fmt: skip


def test_the_warm_step_words_are_spelled_as_they_were(tmp_path: Path) -> None:
    version, phrases, out = tmp_path / "M" / "v1", tmp_path / "p.txt", tmp_path / "c.bin"
    words = option_args(
        WarmConfig, {"artifact": version, "phrases": phrases, "out": out}, spell_defaults=True
    )
    assert [*words, *WARM_ARGS] == ["--artifact", str(version), "--phrases", str(phrases), "--out", str(out),
                                    "--seed", "0"]  # fmt: skip


def test_spelled_defaults_name_values_but_never_an_unset_switch() -> None:

    values = {"seed": 0, "no_baseline": False, "threads": 2}
    assert option_args(EvaluateSettings, values) == []
    assert option_args(EvaluateSettings, values, spell_defaults=True) == [
        "--seed",
        "0",
        "--threads",
        "2",
    ]
    assert option_args(EvaluateSettings, {"no_baseline": True}) == ["--no-baseline"]


def _parsed_config(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> tuple[int, object]:
    """`chattts-forge build ARGS` run up to the pipeline: (exit status, the BuildConfig it was given)."""

    given: list[object] = []
    monkeypatch.setattr(cli, "run_pipeline", given.append)
    result = CliRunner().invoke(main, ["build", *args])
    return result.exit_code, (given[0] if given else result.output)


def test_build_turns_its_options_into_one_build_config(monkeypatch: pytest.MonkeyPatch) -> None:
    code, config = _parsed_config(monkeypatch, [
        "--preset", "tiny", "--variants", "fp32,int8-dynamic", "--stage-args", "evaluate=--max-sentences 1",
        "--stage-args", "evaluate=--batch 1", "--require-published", "int8-dynamic", "--accept-regression",
        "int8-dynamic", "--reason", "why", "--jobs", "2", "--no-pytorch-baseline", "--gate", "", "--forge-cmd",
        "python fake.py",
    ])  # fmt: skip
    assert code == 0, config
    assert config == BuildConfig(
        preset="tiny", variants=("fp32", "int8-dynamic"), extra={"evaluate": ["--max-sentences", "1", "--batch", "1"]},
        require_published=("int8-dynamic",), accept_regression=("int8-dynamic",), regression_reason="why", jobs=2,
        pytorch_baseline=False, gate=None, forge_cmd=["python", "fake.py"],
    )  # fmt: skip


def test_build_defaults_are_build_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    code, config = _parsed_config(monkeypatch, [])
    assert code == 0, config
    assert config == BuildConfig(extra={})


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--preset", "huge"], ["--stage-args", "nope=--x"],
                                  ["--no-baseline", "--baseline", "v1"]])  # fmt: skip
def test_build_refuses_bad_options_with_exit_2(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:

    def must_not_run(config: object) -> None:
        _prepared_build(config)  # type: ignore[arg-type]  # the option checks run_pipeline makes first

    monkeypatch.setattr(cli, "run_pipeline", must_not_run)

    result = CliRunner().invoke(main, ["build", *args])
    assert result.exit_code == 2, result.output
