"""The build's steps: what each `chattts-forge` stage of a build is asked to do (its command, inputs
and output), the content fingerprints that key them, and `StepPlan`, the step builders of a build
(`records.Build` runs them; driver/pipeline.py's docstring tells the whole story).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chattts_forge.artifact import FLOAT_VARIANTS, VARIANT_KV_CACHE, VARIANT_METHOD
from chattts_forge.calibration_data.calibrate_config import CalibrateConfig
from chattts_forge.cli import SUBCOMMANDS
from chattts_forge.codegraph import CodeGraph
from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.evaluate_config import EvaluateConfig, EvaluateSettings, LatencyRunConfig
from chattts_forge.evaluate.latency_run import RECORD_FILE
from chattts_forge.integrity import BUILD_CACHE_MAX_ENTRIES, VerifiedHashCache
from chattts_forge.options import changed_args, declared_fields, option_args, option_spec
from chattts_forge.quantize.config import (
    METHOD_CONFIGS,
    QuantizeCommandOptions,
    QuantizeConfig,
    fields_read_by,
    options_read_by,
)
from chattts_forge.quantize.methods import calibrated_variants, method_class
from chattts_forge.runtime.synth import WarmConfig

# Variants quantized from the calibration set (the method registry says which).
CALIBRATED = calibrated_variants()
DEFAULT_CALIB_CORPUS = "builtin:calibration"
DEFAULT_EVAL_CORPUS = "builtin:evaluation"
STAGES = ("checkpoint", "convert", "calibrate", "quantize", "evaluate")


def within(stage: str, until: str | None) -> bool:
    """Whether a step of `stage` runs in a build stopped after `until` (None: the whole build)."""
    return until is None or STAGES.index(stage) <= STAGES.index(until)


# A stage runs as `python -m chattts_forge.cli SUBCOMMAND ...`; the CLI imports the subcommand's
# module by name (chattts_forge.cli.SUBCOMMANDS), so both are the entries of the step's closure.
CLI_MODULE = "chattts_forge.cli"
DEFAULT_FORGE = [sys.executable, "-m", "chattts_forge.cli"]
# A `tiny` synthetic run is a smoke run of the whole chain: lighter calibration and fidelity settings
# keep it to a minute or two. User --stage-args come after these, so they win.
PRESET_STAGE_ARGS: dict[str, dict[str, list[str]]] = {
    "tiny": {
        "calibrate": option_args(CalibrateConfig, {"max_samples": "8", "max_new_token": 48}),
        "evaluate": option_args(
            EvaluateSettings,
            {
                "max_sentences": 3,
                "max_new_token": 48,
                "fidelity_sentences": 3,
                "fidelity_steps": 24,
                "batch_sizes": (1, 4),
                "bucket_sentences": 2,
                "cache_phrases": 4,
            },
        ),
    },
    # The full synthetic model's random weights rarely emit EOS: every phrase would run to 2048 code
    # steps (and 384 refinement steps), hours on a CPU. Its cache serves only requests with these knobs.
    "full": {"warm": option_args(WarmConfig, {"max_new_token": 96, "refine": False})},
}
# The preset's quantize options (field -> value), each step given only those its method's config
# reads (`preset_quantize_args`), after its own options; user --stage-args quantize=... come after.
PRESET_QUANTIZE_OPTIONS: dict[str, dict[str, Any]] = {
    # --block-size 32 (int4, auto): the tiny GPT's projections are 64 wide (GPTQ cannot pad a 128 block).
    "tiny": {"fidelity_sentences": 4, "fidelity_steps": 32, "block_size": 32},
}


def preset_quantize_args(preset: str, method: str) -> list[str]:
    """The words of `preset`'s quantize options that `method`'s config reads, in the preset's order."""
    return option_args(METHOD_CONFIGS[method], options_read_by(method, PRESET_QUANTIZE_OPTIONS.get(preset, {})))


def _quantize_flags() -> dict[str, tuple[str, bool]]:
    """Every spelling of a quantize option -> (its field, whether a value follows it)."""
    flags: dict[str, tuple[str, bool]] = {}
    for f in declared_fields(QuantizeCommandOptions):
        spec = option_spec(f)
        switch = spec.is_flag or len(spec.names) == 2
        for name in spec.names:
            flags[name] = (f.name, not switch)
    return flags


def method_stage_args(method: str, words: list[str]) -> tuple[list[str], list[str]]:
    """`--stage-args quantize=...` words split into those `method`'s config reads and those it does
    not (another method's options: a build's quantize steps share the stage's words, and each method
    refuses an option of another). Words that name no quantize option are kept: quantize judges them."""
    flags = _quantize_flags()
    held = fields_read_by(method)
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(words):
        name = words[i].split("=", 1)[0]
        field_name, takes_value = flags.get(name, (None, False))
        group = words[i : i + (2 if takes_value and "=" not in words[i] else 1)]
        (dropped if field_name is not None and field_name not in held else kept).extend(group)
        i += len(group)
    return kept, dropped


# The phrase cache a build publishes with each version: the shipped customer-service list with
# `synth`'s and `serve`'s default knobs (seed 0, no speaker, ChatTTS's knobs, refinement on), so their
# default requests are served from it. (The tiny model emits EOS: ~190 steps a phrase, about a minute.)
WARM_ARGS = option_args(WarmConfig, {"seed": 0}, spell_defaults=True)


# ---- content fingerprints --------------------------------------------------------------------


def step_code_files(subcommand: str, graph: CodeGraph) -> dict[str, Path]:
    """The files a `chattts-forge SUBCOMMAND` run executes or reads as package data, by stable name."""
    if subcommand not in SUBCOMMANDS:
        raise ForgeError(f"no chattts-forge subcommand {subcommand!r}")
    return graph.files(graph.closure([CLI_MODULE, SUBCOMMANDS[subcommand][0]]))


def code_fingerprint(files: dict[str, Path], cache: VerifiedHashCache) -> str:
    """Fingerprint of a set of named files: each name and the sha256 of its content."""
    h = hashlib.sha256()
    for name, path in sorted(files.items()):
        h.update(f"{name}\0{cache.sha256(path)}\n".encode())
    return h.hexdigest()


def spec_fingerprint(spec: str | None, cache: VerifiedHashCache) -> str | None:
    """A corpus/gate argument: a path's content fingerprint, or the spec itself (built-in names)."""
    if spec is None:
        return None
    p = Path(spec)
    return f"file:{cache.tree(p)}" if p.exists() else f"spec:{spec}"


# ---- steps -----------------------------------------------------------------------------------


@dataclass
class Step:
    name: str  # unique, also the record's file name
    kind: str  # checkpoint | convert | calibrate | quantize | evaluate
    argv: list[str]  # chattts-forge arguments
    out: Path  # what the step produces (removed before a re-run)
    inputs: dict[str, str] = field(default_factory=dict)  # name -> fingerprint
    gate_may_fail: bool = False  # evaluate: a written report with a failed gate is a result
    capture_stdout: bool = False  # the output is the command's stdout, written to `out` atomically
    feeds: tuple[str, ...] = ()  # variants that need this step (a failure sets them aside); () = all
    optional: bool = False  # a failure is logged and nothing is set aside (what reads it does without)
    # It times nothing (calibrate, most quantize steps): `--jobs` may run it beside another such step.
    untimed: bool = False
    method: str | None = None  # quantize: the method, whose config reads only its own --stage-args


@dataclass
class StepPlan:
    """What a build builds, and its step builders: its paths and, stage by stage, the steps it takes
    (`records.Build` adds the steps' records and runs them)."""
    work: Path
    to: Path
    variants: tuple[str, ...]
    checkpoint: Path | None
    preset: str
    seed: int
    calib_corpus: str
    eval_corpus: str
    gate: str | None
    extra: dict[str, list[str]]
    until: str | None = None
    pytorch_baseline: bool = True
    cache: VerifiedHashCache = field(init=False)
    broken: dict[str, str] = field(default_factory=dict)  # variant -> why it could not be built

    def __post_init__(self) -> None:
        # the one stat-keyed cache of known sha256s (chattts_forge.integrity), the build's own file
        self.cache = VerifiedHashCache(self.work / ".steps" / "hashcache.json", BUILD_CACHE_MAX_ENTRIES)

    # paths
    @property
    def ckpt_dir(self) -> Path:
        return self.checkpoint if self.checkpoint is not None else self.work / "checkpoint"

    def artifact_dir(self, variant: str) -> Path:
        if variant in FLOAT_VARIANTS:
            return self.work / "convert" / variant
        return self.work / "quantized" / variant

    def report_dir(self, variant: str) -> Path:
        return self.work / "reports" / variant

    # the plan
    def steps(self, until: str | None = None) -> Iterator[Step]:
        """Yield steps in order, those of stages after `until` left out; inputs are computed when each
        step is reached (after its upstream ran), so a left-out step never reads what was not built."""
        def wanted(stage: str) -> bool:
            return within(stage, until)

        yield from self.shared_steps(until)
        # first, and with the quantize steps: its FP32 runs are also every quantize step's fidelity runs
        reference_first = wanted("quantize") and bool(self.quantized_variants())
        if reference_first:
            yield self.reference_step()
        for variant in self.quantized_variants() if wanted("quantize") else []:
            if variant not in self.broken:
                yield self.quantize_step(variant)
        if not wanted("evaluate"):
            return
        if not reference_first:
            yield self.reference_step()
        yield from self.evaluation_steps()

    def evaluation_steps(self) -> Iterator[Step]:
        """The shared latency run, then every variant's evaluation (after the reference run)."""
        latency = self.latency_step()
        if latency is not None:
            yield latency
        for variant in self.variants:
            if variant not in self.broken:
                yield self.evaluate_step(variant)

    def quantized_variants(self) -> list[str]:
        return [v for v in self.variants if v in VARIANT_METHOD]

    def shared_steps(self, until: str | None = None, calibrate: bool = True) -> Iterator[Step]:
        """The steps every variant needs: checkpoint, its verification, convert, calibrate (those of
        stages after `until` left out; calibrate also with `calibrate=False`)."""
        if self.checkpoint is None:
            yield Step(
                "checkpoint",
                "checkpoint",
                [
                    "checkpoint",
                    "synthesize",
                    "--preset",
                    self.preset,
                    "--seed",
                    str(self.seed),
                    "--out",
                    str(self.ckpt_dir),
                ],
                self.ckpt_dir,
            )
        yield Step(
            "checkpoint-verify",
            "checkpoint",
            ["checkpoint", "verify", str(self.ckpt_dir), "--json"],
            self.work / "checkpoint-verify.json",
            {"checkpoint": self.cache.tree(self.ckpt_dir)},
            capture_stdout=True,
        )
        if not within("convert", until):
            return
        yield Step(
            "convert",
            "convert",
            [
                "convert",
                "--checkpoint",
                str(self.ckpt_dir),
                "--out",
                str(self.work / "convert"),
                "--precision",
                "all",
            ],
            self.work / "convert",
            {"checkpoint": self.cache.tree(self.ckpt_dir)},
        )
        step = self.calibrate_step() if calibrate and within("calibrate", until) else None
        if step is not None:
            yield step

    def calibrate_step(self) -> Step | None:
        """The calibrate step (None: no variant of the build reads a calibration)."""
        fp32 = self.artifact_dir("fp32")
        calibrated = tuple(v for v in self.quantized_variants() if v in CALIBRATED)
        if not calibrated:
            return None
        return Step(
            "calibrate",
            "calibrate",
            [
                "calibrate",
                *option_args(
                    CalibrateConfig,
                    {"artifact_dir": fp32, "corpus": self.calib_corpus, "out_dir": self.work / "calibration"},
                    spell_defaults=True,
                ),
            ],
            self.work / "calibration",
            {"fp32": self.cache.tree(fp32), "corpus": spec_fingerprint(self.calib_corpus, self.cache) or ""},
            feeds=calibrated,
            untimed=True,
        )

    def quantize_step(self, variant: str) -> Step:
        """The variant's `quantize` command: its options its method's config (`QuantizeConfig`), spelled
        as the options declare (`changed_args`: the ones that differ from their defaults, in declaration
        order), then the preset's options that the method reads."""
        fp32, method = self.artifact_dir("fp32"), VARIANT_METHOD[variant]
        held = fields_read_by(method)  # the options the method's config reads
        options: dict[str, Any] = {}
        inputs = {"fp32": self.cache.tree(fp32)}
        if variant in CALIBRATED:
            options["calibration"] = self.work / "calibration"
            inputs["calibration"] = self.cache.tree(self.work / "calibration")
        kv_cache = VARIANT_KV_CACHE.get(variant)
        if kv_cache is not None:  # the float-cache variants keep their command (and step key)
            options["kv_cache"] = kv_cache
        runs = self.reference_run_dir / "trajectories.npz"
        if runs.is_file():  # recorded once by evaluate-reference (read when its settings are fidelity's)
            options["fp32_runs"] = runs
            inputs["fp32_runs"] = self.cache.sha256(runs)
        if "gate" in held and self.gate:  # auto: meets the gate evaluate applies
            options["gate"] = self.gate
            inputs["gate"] = spec_fingerprint(self.gate, self.cache) or ""
        argv = [
            "quantize",
            "--artifact",
            str(fp32),
            "--method",
            method,
            "--out",
            str(self.artifact_dir(variant)),
            *changed_args(QuantizeConfig(method, **options)),
            # a synthetic checkpoint's preset (as the other stages' preset args: not with a real one)
            *(preset_quantize_args(self.preset, method) if self.checkpoint is None else []),
        ]
        return Step(
            f"quantize-{variant}",
            "quantize",
            argv,
            self.artifact_dir(variant),
            inputs,
            feeds=(variant,),
            untimed=not method_class(method).times_the_machine,
            method=method,
        )

    def quantize_is_untimed(self, variant: str) -> bool:
        """Whether the variant's quantize step times nothing (see `Step.untimed`)."""
        return not method_class(VARIANT_METHOD[variant]).times_the_machine

    @property
    def reference_run_dir(self) -> Path:
        return self.work / "reference_run"

    def _baseline_options(self, inputs: dict[str, str]) -> dict[str, Any]:
        """The PyTorch baseline options of the evaluate steps (and their input, the checkpoint)."""
        if self.pytorch_baseline:  # every speed figure also as a ratio to ChatTTS's own PyTorch code
            inputs["checkpoint"] = self.cache.tree(self.ckpt_dir)
            return {"baseline_checkpoint": self.ckpt_dir}
        return {
            "no_baseline": True
        }  # evaluate would otherwise find the artifact's source checkpoint by itself

    def reference_step(self) -> Step:
        """What every evaluation shares, measured once per build (evaluate.reference_run): the FP32
        reference's latency run and audio, ChatTTS's PyTorch baseline, the ASR of the reference's
        audio. It takes the evaluate steps' options (its kind is "evaluate"), so it is measured with
        exactly the settings they read it with; every variant's evaluation needs it."""
        fp32 = self.artifact_dir("fp32")
        inputs = {
            "reference": self.cache.tree(fp32),
            "corpus": spec_fingerprint(self.eval_corpus, self.cache) or "",
        }
        options = {
            "reference": fp32,
            "corpus": self.eval_corpus,
            "out": self.reference_run_dir,
            **self._baseline_options(inputs),
        }
        argv = ["evaluate-reference", *option_args(EvaluateSettings, options, spell_defaults=True)]
        return Step("evaluate-reference", "evaluate", argv, self.reference_run_dir, inputs)

    @property
    def latency_run_dir(self) -> Path:
        return self.work / "latency_run"

    def latency_step(self) -> Step | None:
        """Every variant but fp32 (its own reference) timed against the FP32 reference in the same
        interleaved rounds, once for the build (evaluate.latency_run): the reference is synthesized
        once per round for all of them instead of once per variant's evaluation. Optional: should it
        fail, each evaluation times its variant itself, as without it."""
        timed = [v for v in self.variants if v != "fp32" and v not in self.broken]
        if not timed:
            return None
        fp32 = self.artifact_dir("fp32")
        inputs = {
            "reference": self.cache.tree(fp32),
            "corpus": spec_fingerprint(self.eval_corpus, self.cache) or "",
        }
        for variant in timed:
            inputs[variant] = self.cache.tree(self.artifact_dir(variant))
        options = {
            "reference": fp32,
            "corpus": self.eval_corpus,
            "out": self.latency_run_dir,
            "artifacts": tuple(self.artifact_dir(v) for v in timed),
        }
        argv = ["evaluate-latency", *option_args(LatencyRunConfig, options, spell_defaults=True)]
        return Step("evaluate-latency", "evaluate", argv, self.latency_run_dir, inputs, optional=True)

    def timed_in_latency_run(self, variant: str) -> bool:
        """Whether the build's latency run (when it ran) holds `variant`'s timings."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            record = json.loads((self.latency_run_dir / RECORD_FILE).read_text(encoding="utf-8"))
            return variant in record.get("artifacts", {})
        return False

    def evaluate_step(self, variant: str) -> Step:
        fp32 = self.artifact_dir("fp32")
        options: dict[str, Any] = {
            "artifact": self.artifact_dir(variant),
            "reference": fp32,
            "corpus": self.eval_corpus,
            "out": self.report_dir(variant),
        }
        inputs = {
            "artifact": self.cache.tree(self.artifact_dir(variant)),
            "reference": self.cache.tree(fp32),
            "corpus": spec_fingerprint(self.eval_corpus, self.cache) or "",
        }
        options.update(self._baseline_options(inputs))
        if self.gate:
            options["gate"] = self.gate
            inputs["gate"] = spec_fingerprint(self.gate, self.cache) or ""
        # the reference's side, measured once for the build by `reference_step`
        options["reference_run"] = self.reference_run_dir
        inputs["reference_run"] = self.cache.tree(self.reference_run_dir)
        if self.timed_in_latency_run(variant):  # timed with the other variants, in the same rounds
            options["latency_run"] = self.latency_run_dir
            inputs["latency_run"] = self.cache.tree(self.latency_run_dir)
        argv = ["evaluate", *option_args(EvaluateConfig, options, spell_defaults=True)]
        return Step(
            f"evaluate-{variant}",
            "evaluate",
            argv,
            self.report_dir(variant),
            inputs,
            gate_may_fail=True,
            feeds=(variant,),
        )
