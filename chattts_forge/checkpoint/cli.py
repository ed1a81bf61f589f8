"""`chattts-forge checkpoint ...`: synthesize, verify and inspect ChatTTS checkpoints."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from chattts_forge.checkpoint.inventory import inventory_summary
from chattts_forge.checkpoint.layout import PRESETS, load_dims, preset_dims, read_marker, resolve_asset_dir
from chattts_forge.checkpoint.synthesize import SyntheticCheckpointConfig
from chattts_forge.options import declared_options


@click.group("checkpoint")
def checkpoint() -> None:
    """Synthesize, verify and inspect ChatTTS checkpoints.

    \b
    A checkpoint is a ChatTTS asset folder (gpt/, Embed.safetensors, DVAE.safetensors,
    Decoder.safetensors, Vocos.safetensors, tokenizer/). Every command also accepts a snapshot
    root that contains asset/, or a Hugging Face cache (models--2Noise--ChatTTS).
    """


@checkpoint.command(
    "synthesize", short_help="Write a synthetic checkpoint (released layout, seeded weights)."
)
@declared_options(SyntheticCheckpointConfig)
def synthesize_cmd(**options: Any) -> None:
    """Write a synthetic ChatTTS checkpoint (seeded random weights, real layout).

    The folder holds everything ChatTTS loads, with the released file names, tensor names,
    shapes and dtypes, a tokenizer identical to the released one, and a marker file
    (chattts_forge_synthetic.json) recording preset, seed, dims and file hashes.
    """
    config = SyntheticCheckpointConfig(**options)
    start = time.perf_counter()
    asset = config.run()
    took = time.perf_counter() - start
    size = sum(p.stat().st_size for p in asset.rglob("*") if p.is_file())
    click.echo(
        f"synthetic {config.preset} checkpoint (seed {config.seed}) written to {asset}: {size / 1e6:.1f} MB in {took:.1f} s"
    )


@checkpoint.command("verify", short_help="Tell a released, synthetic or broken checkpoint apart.")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def verify_cmd(path: Path | None, as_json: bool) -> None:
    """Say whether PATH is the released ChatTTS checkpoint, a synthetic one, or broken.

    \b
    released:  every file's sha256 equals ChatTTS's res/sha256_map.json
    synthetic: marker present, files match its hashes, dims match gpt/config.json and tensors
    broken:    a one-line error naming the missing, truncated, non-safetensors, wrong-shape
               or hash-mismatched file; exit status 2
    PATH may be an asset folder, a snapshot root containing asset/, or a Hugging Face cache;
    without PATH the default Hugging Face cache is searched.
    """
    from chattts_forge.checkpoint.verify import verify_checkpoint

    report = verify_checkpoint(path)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(report.summary())


@checkpoint.command("inspect", short_help="Show dims and tensor inventory of a checkpoint or preset.")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option(
    "--preset", type=click.Choice(sorted(PRESETS)), help="Describe a preset's inventory instead of a folder."
)
def inspect_cmd(path: Path | None, preset: str | None) -> None:
    """Print the dimensions and per-file tensor inventory of a checkpoint (or of a preset)."""
    if preset is not None:
        dims = preset_dims(preset)
        click.echo(f"preset {preset}")
    else:
        asset = resolve_asset_dir(path)
        dims = load_dims(asset)
        marker = read_marker(asset)
        kind = f"synthetic {marker.get('preset')} (seed {marker.get('seed')})" if marker else "released dims"
        click.echo(f"{asset}: {kind}")
    d = dims
    click.echo(
        f"gpt: hidden {d.hidden_size}, layers {d.num_hidden_layers}, heads {d.num_attention_heads}/"
        f"{d.num_key_value_heads}, ffn {d.intermediate_size}; text tokens {d.num_text_tokens}, "
        f"audio tokens {d.num_audio_tokens} x {d.num_vq}"
    )
    click.echo(
        f"audio: {d.sample_rate} Hz, hop {d.hop_length}, n_fft {d.n_fft}, {d.n_mels} mels; "
        f"vocos dim {d.vocos_dim} x {d.vocos_num_layers}"
    )
    total = 0
    for file, info in inventory_summary(dims).items():
        total += info["bytes"]
        click.echo(
            f"  {file:24s} {info['tensors']:4d} tensors {info['numel']:>12,d} params {info['bytes'] / 1e6:9.1f} MB"
        )
    click.echo(f"  {'total':24s} {'':4s}         {'':>12s}        {total / 1e6:9.1f} MB")
