"""ChatTTS's own torch modules built with a checkpoint's dimensions (imports torch; export side only).

Used to prove that a synthetic checkpoint is what ChatTTS loads: `build_modules(dims)` constructs
the real ChatTTS 0.2.5 Embed/DVAE/Decoder, vocos Vocos and transformers LlamaModel exactly as
`ChatTTS.Chat._load` does, but with `dims` instead of the default Config; `load_modules(asset_dir)`
loads a checkpoint into them with strict `load_state_dict`. With device="meta" nothing is
allocated for the large modules (the full preset's inventory check costs no memory).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chattts_forge.checkpoint.inventory import DECODER_FILE, DVAE_FILE, EMBED_FILE, GPT_FILE, VOCOS_FILE
from chattts_forge.checkpoint.layout import ConvStackDims, Dims, load_dims, resolve_asset_dir


def _stack(c: ConvStackDims) -> dict[str, int]:
    return asdict(c)


def build_modules(dims: Dims, meta: bool = False) -> dict[str, Any]:
    """{asset file: torch module} for every tensor file, built like ChatTTS.Chat._load does."""
    # torch, ChatTTS, transformers, vocos: the PyTorch modules only; ChatTTS alone takes 7.9 s to import
    import torch
    from ChatTTS.model.dvae import DVAE
    from ChatTTS.model.embed import Embed
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    vocos = Vocos(
        feature_extractor=MelSpectrogramFeatures(
            sample_rate=dims.sample_rate, n_fft=dims.n_fft, hop_length=dims.hop_length,
            n_mels=dims.n_mels, padding="center",
        ),
        backbone=VocosBackbone(
            input_channels=dims.n_mels, dim=dims.vocos_dim,
            intermediate_dim=dims.vocos_intermediate_dim, num_layers=dims.vocos_num_layers,
        ),
        head=ISTFTHead(dim=dims.vocos_dim, n_fft=dims.n_fft, hop_length=dims.hop_length, padding="center"),
    )  # fmt: skip
    # torchaudio computes mel filterbanks eagerly (.item()), so the DVAE is never built on meta.
    dvae = DVAE(
        decoder_config=_stack(dims.dvae_decoder),
        encoder_config=_stack(dims.dvae_encoder),
        vq_config={
            "dim": dims.vq_dim,
            "levels": tuple(dims.vq_levels),
            "G": dims.vq_groups,
            "R": dims.vq_residuals,
        },
        dim=dims.dvae_dim,
    )
    decoder = DVAE(decoder_config=_stack(dims.decoder), dim=dims.decoder_dim)
    device = torch.device("meta") if meta else torch.device("cpu")
    with device:
        embed = Embed(dims.hidden_size, dims.num_audio_tokens, dims.num_text_tokens, dims.num_vq)
        gpt = LlamaModel(LlamaConfig(**dims.gpt_config_json()))
    return {GPT_FILE: gpt, EMBED_FILE: embed, DVAE_FILE: dvae, DECODER_FILE: decoder, VOCOS_FILE: vocos}


def load_modules(asset_dir: str | Path) -> dict[str, Any]:
    """Build the modules for the checkpoint's dims and load it with strict load_state_dict."""
    # safetensors.torch imports torch (3.0 s)
    from safetensors.torch import load_file

    asset = resolve_asset_dir(asset_dir)
    dims = load_dims(asset)
    cfg = json.loads((asset / "gpt" / "config.json").read_text(encoding="utf-8"))
    if cfg != dims.gpt_config_json():
        raise ValueError(f"{asset}/gpt/config.json does not match the checkpoint's dims")
    modules = build_modules(dims)
    for file, module in modules.items():
        module.load_state_dict(load_file(str(asset / file)), strict=True)
        module.eval()
    return modules
