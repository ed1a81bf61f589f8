"""Synthetic ChatTTS checkpoints: seeded random weights in the exact released layout.

Library use::

    from chattts_forge.checkpoint.synthesize import synthesize_checkpoint
    asset_dir = synthesize_checkpoint("ckpt/tiny", preset="tiny", seed=0)

writes an asset folder (gpt/config.json, gpt/model.safetensors, Embed/DVAE/Decoder/Vocos
.safetensors, tokenizer/, and the marker `chattts_forge_synthetic.json`) and returns its path.

- The tensors are exactly `inventory.checkpoint_inventory(dims)` (what ChatTTS 0.2.5 loads strictly),
  float32, and filled as `TensorSpec.init` says; mel filterbanks and Hann windows hold the values
  torch/torchaudio compute.
- Every tensor has its own generator, PCG64 seeded from (seed, hash of file and tensor name), so
  adding a tensor never changes the others and the same seed always gives the same bytes (the
  safetensors writer sorts keys; the marker has no timestamp).
- Files are written one at a time, one tensor at a time, so `full` (~1.2 GB) needs about the memory
  of its largest tensor. The folder appears under its final name only when complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pybase16384 as b14
from tqdm import tqdm

from chattts_forge import __version__
from chattts_forge.checkpoint import dsp
from chattts_forge.checkpoint.inventory import (
    SAFETENSORS_DTYPE,
    TensorSpec,
    checkpoint_inventory,
)
from chattts_forge.checkpoint.layout import ASSET_FILES, MARKER_NAME, PRESETS, Dims, preset_dims, read_marker
from chattts_forge.checkpoint.release import release_spk_stat
from chattts_forge.checkpoint.safetensors_io import write_safetensors
from chattts_forge.checkpoint.tokenizer import write_tokenizer
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_output_dir, atomic_write_text
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger
from chattts_forge.options import option

log = get_logger(__name__)

TOOL_NAME = "chattts-forge"


def tensor_rng(seed: int, file: str, name: str) -> np.random.Generator:
    """The generator of one tensor: PCG64 seeded from the checkpoint seed and the tensor's identity."""
    digest = hashlib.sha256(f"{file}::{name}".encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *words])))


def make_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Fill one tensor as its spec says (float32)."""
    init, shape = spec.init, spec.shape
    kind = init.kind
    if kind == "normal":
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(init.std)
        if init.mean:
            out += np.float32(init.mean)
        return out
    if kind == "lognormal":
        out = (init.center * np.exp(init.sigma * rng.standard_normal(shape))).astype(np.float32)
        for row, value in init.fixed_rows:
            out[row] = value
        return out
    if kind == "uniform":
        return rng.uniform(init.low, init.high, shape).astype(np.float32)
    if kind == "hann":
        return dsp.hann_window(shape[0])
    if kind == "mel_fb":
        fb = dsp.mel_filterbank(init.sample_rate, init.n_fft, shape[1])
        if fb.shape != shape:
            raise ForgeError(f"internal: mel filterbank {fb.shape} != {shape} for {spec.name}")
        return fb
    if kind == "istft_head_weight":
        half = shape[0] // 2
        out = rng.standard_normal(shape, dtype=np.float32)
        out[:half] *= np.float32(init.std)
        out[half:] *= np.float32(init.std2)
        return out
    if kind == "istft_head_bias":
        half = shape[0] // 2
        tilt = np.linspace(init.high, init.low, half) + init.std * rng.standard_normal(half)
        phase = rng.uniform(-math.pi, math.pi, shape[0] - half)
        return np.concatenate([tilt, phase]).astype(np.float32)
    raise BadInput(f"internal: unknown init kind {kind!r} for {spec.name}")


def synthetic_spk_stat(dims: Dims, seed: int) -> str:
    """A ChatTTS speaker-statistics string for a synthetic GPT of `dims.hidden_size`.

    Format as ChatTTS's `Speaker` decodes `Config.spk_stat`: pybase16384 of float16
    concat[std, mean]. Scales follow the released statistics (std ~ 3.7, |mean| ~ 1).
    """
    rng = tensor_rng(seed, "spk_stat", "spk_stat")
    h = dims.hidden_size
    std = 3.5 * np.exp(0.4 * rng.standard_normal(h))
    mean = rng.standard_normal(h)
    return b14.encode_to_string(np.concatenate([std, mean]).astype(np.float16).tobytes())


def spk_stat_for(preset: str, dims: Dims, seed: int) -> str:
    """`full` keeps ChatTTS's own Config().spk_stat (768-wide); other presets get matching statistics."""
    if preset == "full":
        return release_spk_stat()
    return synthetic_spk_stat(dims, seed)


def _write_tensor_file(path: Path, file: str, specs: list[TensorSpec], seed: int, bar: tqdm) -> None:
    by_name = {s.name: s for s in specs}

    def produce(name: str) -> np.ndarray:
        spec = by_name[name]
        return make_tensor(spec, tensor_rng(seed, file, name))

    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(
        path,
        [(s.name, s.shape, SAFETENSORS_DTYPE[s.dtype]) for s in specs],
        produce,
        on_tensor=lambda _name, n: bar.update(n),
    )


def _make_readable(root: Path) -> None:
    """Temp files/folders are created private (0600/0700); a checkpoint is shared data (umask applies)."""
    umask = os.umask(0)
    os.umask(umask)
    for p in [root, *root.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _check_out_dir(out: Path) -> None:
    """Refuse to replace a folder that is not a checkpoint we made (a typo must not erase data)."""
    if out.exists():
        if not out.is_dir():
            raise BadInput(f"{out} exists and is not a folder")
        if any(out.iterdir()) and read_marker(out) is None:
            raise BadInput(f"{out} exists and is not a synthetic checkpoint; choose an empty or new folder")


@dataclass(frozen=True)
class SyntheticCheckpointConfig:
    """One `chattts-forge checkpoint synthesize` run (`synthesize_checkpoint`'s arguments), each option
    declared on its field (chattts_forge.options)."""

    preset: str = option(
        "tiny", "--preset", "full: the released model's exact tensor inventory (~1.2 GB); "
        "tiny: same vocabularies and audio settings, small widths/depths (seconds to run).",
        choices=tuple(sorted(PRESETS)), show_default=True)
    seed: int = option(0, "--seed", "Same seed, same bytes.", kind=click.IntRange(min=0), show_default=True)
    out_dir: Path = option(
        MISSING, "--out", "Asset folder to write (replaced atomically if it holds a synthetic checkpoint).",
        kind=click.Path(file_okay=False, path_type=Path), kw_only=True)
    progress: bool | None = option(None, "--progress/--no-progress", "Progress bar (default: on a terminal).")

    def run(self) -> Path:
        return synthesize_checkpoint(self.out_dir, preset=self.preset, seed=self.seed, progress=self.progress)


def synthesize_checkpoint(
    out_dir: str | Path, preset: str = "tiny", seed: int = 0, progress: bool | None = None
) -> Path:
    """Write a synthetic ChatTTS asset folder at `out_dir` and return its path.

    `preset` is "tiny" (small widths/depths, real vocabularies and audio settings) or "full" (the
    released model's dimensions, ~1.2 GB). `progress`: show a tqdm bar (None: only on a terminal).
    """
    dims = preset_dims(preset)
    if not isinstance(seed, int) or seed < 0:
        raise BadInput(f"seed must be a non-negative integer, got {seed!r}")
    out = Path(out_dir).expanduser()
    _check_out_dir(out)
    inventory = checkpoint_inventory(dims)
    total = sum(s.nbytes for specs in inventory.values() for s in specs)
    log.info(
        "synthesizing %s checkpoint (seed %d, %.1f MB of tensors) into %s", preset, seed, total / 1e6, out
    )
    with atomic_output_dir(out) as tmp:
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"synthesize {preset}",
            disable=None if progress is None else not progress,
        ) as bar:
            for file, specs in inventory.items():
                bar.set_postfix_str(file)
                _write_tensor_file(tmp / file, file, specs, seed, bar)
        atomic_write_text(
            tmp / "gpt" / "config.json", json.dumps(dims.gpt_config_json(), indent=2, sort_keys=True) + "\n"
        )
        write_tokenizer(tmp / "tokenizer")
        missing = [f for f in ASSET_FILES if not (tmp / f).is_file()]
        if missing:
            raise ForgeError(f"internal: synthesize did not write {', '.join(missing)}")
        marker: dict[str, Any] = {
            "synthetic": True,
            "preset": preset,
            "seed": seed,
            "tool": TOOL_NAME,
            "tool_version": __version__,
            "dims": dims.to_dict(),
            "spk_stat": spk_stat_for(preset, dims, seed),
            "files": {f: sha256_file(tmp / f) for f in ASSET_FILES},
        }
        atomic_write_text(tmp / MARKER_NAME, json.dumps(marker, indent=2, ensure_ascii=False) + "\n")
        _make_readable(tmp)
    log.info("wrote synthetic %s checkpoint (seed %d) to %s", preset, seed, out)
    return out
