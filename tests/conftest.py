"""Session-wide fixtures: one tiny synthetic checkpoint and its converted artifacts, shared by all tests.

Building them once per session keeps the whole suite fast; tests must not modify them (copy first).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# The tests' reference data (released tokenizer and config, real speech): inside the repository,
# next to the tests, so a clone tests on its own. Provenance and licences: tests/data/README.md.
DATA_DIR = Path(__file__).resolve().parent / "data"

# Tests run on 2 cores next to other work: keep every library single-threaded unless a test asks.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Routers take the build's routing unless a test turns the host autotune on (timings decide nothing
# in a test), and nothing is written to the user's cache.
os.environ["CHATTTS_FORGE_AUTOTUNE"] = "0"
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="forge-test-cache-")


@pytest.fixture(scope="session", autouse=True)
def user_dirs(tmp_path_factory: pytest.TempPathFactory):
    """The user's config and cache folders (the signing key pair, the verified-hash cache) in a temporary
    folder of the session, never in the real home; subprocesses the tests start inherit them."""
    saved = {k: os.environ.get(k) for k in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    base = tmp_path_factory.mktemp("user")
    os.environ["XDG_CONFIG_HOME"] = str(base / "config")
    os.environ["XDG_CACHE_HOME"] = str(base / "cache")
    yield base
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: `chattts-tokenizer/`, `chattts-release/`, `speech/{en,zh}/`."""
    if not DATA_DIR.is_dir():
        pytest.fail(f"reference data folder {DATA_DIR} is missing (it is part of the repository)")
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `tiny` synthetic checkpoint (seed 0): the asset folder."""
    from chattts_forge.checkpoint.synthesize import synthesize_checkpoint

    return synthesize_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-seed0", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_artifacts(tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """FP32 and FP16 artifacts converted from `tiny_ckpt`: {"fp32": dir, "fp16": dir}."""
    from chattts_forge.convert.export import convert_checkpoint

    return convert_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("artifacts"), precision="all")


@pytest.fixture(scope="session")
def tiny_chat(tiny_ckpt: Path):
    """ChatTTS's own `Chat`, loaded on `tiny_ckpt` (the PyTorch reference oracle)."""
    from chattts_forge.torch_ref.chat import load_chat

    return load_chat(tiny_ckpt)


@pytest.fixture(scope="session")
def tiny_calib(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small calibration set recorded on the tiny FP32 artifact (for static quantization)."""
    from chattts_forge.calibration_data.calibrate import calibrate

    return calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path_factory.mktemp("qc") / "calib",
                     max_samples=3, max_new_token=12, decode_positions=3, head_steps=4, threads=1)


@pytest.fixture(scope="session")
def tiny_quantized(tiny_artifacts: dict[str, Path], tiny_calib: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny FP32 artifact quantized by every method: {"dynamic", "static", "int4", "auto": dir}."""
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    root = tmp_path_factory.mktemp("quant")
    fp32 = tiny_artifacts["fp32"]
    fidelity = {"fidelity_sentences": 2, "fidelity_steps": 16, "threads": 1}
    return {
        "dynamic": quantize_artifact(fp32, root / "dyn", QuantizeConfig("dynamic", **fidelity)),
        "static": quantize_artifact(fp32, root / "static", QuantizeConfig("static", calibration=tiny_calib, **fidelity)),
        "int4": quantize_artifact(fp32, root / "int4", QuantizeConfig("int4", block_size=32, **fidelity)),
        "auto": quantize_artifact(fp32, root / "auto", QuantizeConfig("auto", calibration=tiny_calib, **fidelity)),
    }


@pytest.fixture(scope="session")
def tiny_kv8(tiny_artifacts: dict[str, Path], tiny_calib: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny FP32 artifact as dynamic INT8 with an INT8 KV cache (int8-dynamic-kv8), scales from `tiny_calib`."""
    from chattts_forge.quantize import QuantizeConfig, quantize_artifact

    return quantize_artifact(tiny_artifacts["fp32"], tmp_path_factory.mktemp("quant-kv8") / "dyn-kv8", QuantizeConfig("dynamic",
                             calibration=tiny_calib, kv_cache="int8", fidelity_sentences=2, fidelity_steps=16,
                             threads=1))
