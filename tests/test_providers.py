"""The execution provider choice (cpu / cuda / auto), the device-bound GPT step, and artifacts loaded
by the other onnxruntime release (the one onnxruntime-gpu pins) giving the same codes.

No GPU here: `cuda` must fail in one line, `auto` must run on the CPU and say so, and the CUDA code
path of the GPT step (cache kept on the device through IO binding) is checked on the CPU device.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from chattts_forge.errors import ForgeError
from chattts_forge.runtime import providers
from chattts_forge.runtime.device_gpt import DeviceGptStep
from chattts_forge.runtime.gpt_step import GptStep
from chattts_forge.runtime.loaded_artifact import LoadedArtifact
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, SynthParams

TEXTS = ["你好，欢迎光临。", "Hello, how can I help you today?", "请稍等 one moment please."]
# Where `make env` puts the CPU build of the onnxruntime release that onnxruntime-gpu pins.
ORT_COMPAT_VERSION = "1.31.1"
ORT_COMPAT_DIR = Path(sys.prefix) / "ort-compat" / ORT_COMPAT_VERSION


@pytest.fixture(autouse=True)
def _fresh_probe():
    providers.cuda_status.cache_clear()
    yield
    providers.cuda_status.cache_clear()


def test_cpu_is_cpu() -> None:
    assert providers.resolve_provider("cpu") == "cpu"
    assert providers.session_providers("cpu") == ["CPUExecutionProvider"]


def test_unknown_provider_is_refused() -> None:
    with pytest.raises(ForgeError, match="unknown provider 'tpu'"):
        providers.resolve_provider("tpu")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
def test_cuda_without_gpu_is_one_line_error() -> None:
    with pytest.raises(ForgeError) as e:
        providers.resolve_provider("cuda")
    message = str(e.value)
    assert "\n" not in message and "--provider cuda" in message and "no CUDA provider" in message


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
def test_auto_without_gpu_runs_on_cpu_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="chattts_forge.runtime.providers"):
        assert providers.resolve_provider("auto") == "cpu"
    assert any("running on CPU" in r.getMessage() for r in caplog.records)


def test_silent_cpu_fallback_counts_as_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu without a device or libraries places the probe on the CPU instead of failing:
    simulated by a CPU build that claims CUDA (a session asked for an absent provider runs on CPU)."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    usable, why = providers.cuda_status()
    assert not usable and "fell back to CPUExecutionProvider" in why
    with pytest.raises(ForgeError, match="fell back"):
        providers.resolve_provider("cuda")
    assert providers.resolve_provider("auto") == "cpu"


def test_synth_cli_provider_choice(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    from chattts_forge.cli import main

    runner = CliRunner()
    args = ["synth", "--artifact", str(tiny_artifacts["fp32"]), "--text", TEXTS[0], "--max-new-token", "8"]
    cuda = runner.invoke(main, [*args, "--out", str(tmp_path / "cuda.wav"), "--provider", "cuda"])
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert cuda.exit_code != 0
        error_lines = [line for line in cuda.output.splitlines() if line.startswith("error:")]
        assert len(error_lines) == 1 and "--provider cuda" in error_lines[0]
        assert not (tmp_path / "cuda.wav").exists()
    auto = runner.invoke(main, [*args, "--out", str(tmp_path / "auto.wav"), "--provider", "auto"])
    assert auto.exit_code == 0, auto.output
    assert (tmp_path / "auto.wav").stat().st_size > 44


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_device_gpt_step_equals_host_step(tiny_artifacts: dict[str, Path], variant: str) -> None:
    """The IO-bound step (cache kept as OrtValues on the device) computes what GptStep computes."""
    art = LoadedArtifact(tiny_artifacts[variant], threads=1)
    dims = art.dims
    host, bound = GptStep(art.session("gpt"), dims), DeviceGptStep(art.session("gpt"), dims, device="cpu")
    rng = np.random.default_rng(0)
    batch, prompt = 2, 5
    mask = np.ones((batch, prompt), dtype=np.int64)
    mask[1, :2] = 0  # left padding, as ChatTTS batches
    host.reset(batch)
    bound.reset(batch)
    embeds = rng.standard_normal((batch, prompt, dims.hidden_size)).astype(np.float32)
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    np.testing.assert_array_equal(bound(embeds, mask, pos), host(embeds, mask, pos))
    for _ in range(4):
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        pos = mask.sum(axis=1, keepdims=True) - 1
        embeds = rng.standard_normal((batch, 1, dims.hidden_size)).astype(np.float32)
        np.testing.assert_array_equal(bound(embeds, mask, pos), host(embeds, mask, pos))
    assert bound.past_length == host.past_length == mask.shape[1]


def test_device_gpt_step_needs_reset(tiny_artifacts: dict[str, Path]) -> None:
    art = LoadedArtifact(tiny_artifacts["fp32"], threads=1)
    step = DeviceGptStep(art.session("gpt"), art.dims, device="cpu")
    with pytest.raises(ForgeError, match="reset"):
        step(np.zeros((1, 1, art.dims.hidden_size), np.float32), np.ones((1, 1), np.int64), np.zeros((1, 1), np.int64))
    with pytest.raises(ForgeError, match="unknown device"):
        DeviceGptStep(art.session("gpt"), art.dims, device="tpu")


_CODES_SCRIPT = """
import json, sys
import onnxruntime
from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, SynthParams
out = {"onnxruntime": onnxruntime.__version__, "codes": {}}
for variant, path in json.loads(sys.argv[1]).items():
    pipe = Pipeline(path, threads=1)
    params = SynthParams(code=InferCodeParams(seed=0, temperature=1e-9, max_new_token=24, min_new_token=24))
    out["codes"][variant] = {"engine": pipe.engine, "rows": [r.codes.tolist() for r in pipe.synthesize(sys.argv[2:], params)]}
print(json.dumps(out))
"""


def _codes(artifacts: dict[str, Path], pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-c", _CODES_SCRIPT, json.dumps({k: str(v) for k, v in artifacts.items()}), *TEXTS],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_artifacts_give_the_same_codes_on_the_other_onnxruntime(tiny_artifacts: dict[str, Path]) -> None:
    """Built with this onnxruntime (1.32, CPU), run with 1.31.1 (what onnxruntime-gpu pins): same codes,
    for the fused fp32 graph and the fp16 graphs."""
    if not (ORT_COMPAT_DIR / "onnxruntime").is_dir():
        pytest.fail(f"{ORT_COMPAT_DIR} is missing: `make env` installs onnxruntime {ORT_COMPAT_VERSION} there")
    here = _codes(tiny_artifacts, None)
    other = _codes(tiny_artifacts, str(ORT_COMPAT_DIR))
    assert here["onnxruntime"] == ort.__version__ and other["onnxruntime"] == ORT_COMPAT_VERSION
    assert here["codes"]["fp32"]["engine"] == "fast"  # the fused graph is what services run
    for variant in tiny_artifacts:
        assert other["codes"][variant] == here["codes"][variant], variant
    assert len(here["codes"]["fp32"]["rows"]) == len(TEXTS)


def test_pipeline_auto_engine_is_fast_on_cpu(tiny_artifacts: dict[str, Path]) -> None:
    pipe = Pipeline(tiny_artifacts["fp32"], provider="auto", threads=1)
    assert pipe.artifact.provider == "cpu" and pipe.engine == "fast"
    res = pipe.synthesize(TEXTS[1], SynthParams(code=InferCodeParams(seed=0, max_new_token=6, min_new_token=6)))
    assert res[0].codes.shape == (6, pipe.num_vq)


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
@pytest.mark.parametrize("command", ["bench", "evaluate"])
def test_bench_and_evaluate_refuse_cuda_without_gpu(tiny_artifacts: dict[str, Path], tmp_path: Path, command: str) -> None:
    from chattts_forge.cli import main

    art = str(tiny_artifacts["fp32"])
    args = {
        "bench": ["bench", "--artifact", art, "--batch", "1", "--steps", "4", "--reps", "1", "--json", str(tmp_path / "b.json")],
        "evaluate": ["evaluate", "--artifact", art, "--reference", art, "--corpus", "builtin:evaluation",
                     "--out", str(tmp_path / "report"), "--no-baseline"],
    }[command]  # fmt: skip
    result = CliRunner().invoke(main, [*args, "--provider", "cuda"])
    assert result.exit_code != 0
    error_lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "--provider cuda" in error_lines[0], result.output
    assert not any(tmp_path.iterdir())  # refused before any work


def test_bench_records_the_resolved_provider(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    from chattts_forge.evaluate.bench import run_bench

    report = run_bench(tiny_artifacts["fp32"], batches=(1,), steps=4, reps=1, warmup_steps=2, threads=1,
                       first_audio=False, provider="auto")  # fmt: skip
    expected = "cuda" if providers.cuda_status()[0] else "cpu"
    assert report["settings"]["provider"] == expected
    assert report["machine"]["provider"] == providers.EXECUTION_PROVIDERS[expected]
