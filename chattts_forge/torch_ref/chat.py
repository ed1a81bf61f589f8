"""Load ChatTTS's own `Chat` from any checkpoint folder: released, or synthetic at any preset.

Library use::

    from chattts_forge.torch_ref.chat import load_chat
    chat = load_chat("path/to/asset")          # ChatTTS.Chat, modules in eval mode, on CPU

`Chat.load(source="custom")` insists on the released sha256s and on ChatTTS's default `Config`
(the released dimensions), so it cannot open a synthetic `tiny` checkpoint. `load_chat` therefore
builds a fresh `Config` whose every dimension comes from the checkpoint's `Dims`, and calls
ChatTTS's own `Chat._load` with explicit file paths. A real checkpoint is first checked against
ChatTTS's own `res/sha256_map.json`, as `Chat.load` would do; a synthetic one brings its speaker
statistics (`spk_stat`) in its marker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chattts_forge.checkpoint.layout import (
    ASSET_FILES,
    Dims,
    load_dims,
    read_marker,
    resolve_asset_dir,
    sha256_map_key,
)
from chattts_forge.errors import ForgeError, IntegrityError
from chattts_forge.integrity import sha256_file
from chattts_forge.log import get_logger

if TYPE_CHECKING:
    import ChatTTS
    from ChatTTS.config.config import Config

log = get_logger(__name__)

# The logger ChatTTS's Chat uses by default; `setup_logging` keeps the "ChatTTS" tree at WARNING.
CHATTTS_LOGGER = "ChatTTS.core"


def build_config(dims: Dims, spk_stat: str | None = None) -> Config:
    """A ChatTTS `Config` with every dimension taken from `dims`.

    Every nested dataclass is built anew: ChatTTS's `Config` uses shared instances as field
    defaults, so mutating `Config().gpt` in place would change every other Chat in the process.
    """
    # ChatTTS: the PyTorch reference only; 7.9 s to import
    from ChatTTS.config import config as C

    def stack(s: Any) -> C.Decoder:
        return C.Decoder(idim=s.idim, odim=s.odim, hidden=s.hidden, n_layer=s.n_layer, bn_dim=s.bn_dim)

    kw: dict[str, Any] = {}
    if spk_stat is not None:
        kw["spk_stat"] = spk_stat
    return C.Config(
        path=C.Path(),
        decoder=stack(dims.decoder),
        dvae=C.DVAE(
            encoder=stack(dims.dvae_encoder),
            decoder=stack(dims.dvae_decoder),
            vq=C.VQ(dim=dims.vq_dim, levels=tuple(dims.vq_levels), G=dims.vq_groups, R=dims.vq_residuals),
        ),
        gpt=C.GPT(
            hidden_size=dims.hidden_size,
            intermediate_size=dims.intermediate_size,
            num_attention_heads=dims.num_attention_heads,
            num_hidden_layers=dims.num_hidden_layers,
            use_cache=False,
            max_position_embeddings=dims.max_position_embeddings,
            spk_emb_dim=dims.spk_emb_dim,
            spk_KL=False,
            num_audio_tokens=dims.num_audio_tokens,
            num_text_tokens=dims.num_text_tokens,
            num_vq=dims.num_vq,
        ),
        embed=C.Embed(
            hidden_size=dims.hidden_size,
            num_audio_tokens=dims.num_audio_tokens,
            num_text_tokens=dims.num_text_tokens,
            num_vq=dims.num_vq,
        ),
        vocos=C.Vocos(
            feature_extractor=C.FeatureExtractor(
                init_args=C.FeatureExtractorInitArgs(
                    sample_rate=dims.sample_rate,
                    n_fft=dims.n_fft,
                    hop_length=dims.hop_length,
                    n_mels=dims.n_mels,
                    padding="center",
                )
            ),
            backbone=C.Backbone(
                init_args=C.BackboneInitArgs(
                    input_channels=dims.n_mels,
                    dim=dims.vocos_dim,
                    intermediate_dim=dims.vocos_intermediate_dim,
                    num_layers=dims.vocos_num_layers,
                )
            ),
            head=C.FourierHead(
                init_args=C.FourierHeadInitArgs(
                    dim=dims.vocos_dim, n_fft=dims.n_fft, hop_length=dims.hop_length, padding="center"
                )
            ),
        ),
        **kw,
    )


@contextlib.contextmanager
def quiet_chattts(verbose: bool = False) -> Iterator[None]:
    """Silence ChatTTS's and transformers' chatter while ChatTTS code runs, unless `verbose`.

    Hidden: INFO/WARNING logs (e.g. 'incomplete result. hit max_new_token', which every
    fixed-length parity run triggers), transformers' 'Loading weights' bar and its deprecation
    notices about ChatTTS's `past_key_values` calls. Errors still show.
    """
    if verbose:
        yield
        return
    # transformers: the PyTorch side only; 0.75 s to import
    from transformers.utils import logging as hf_logging

    names = ("ChatTTS", CHATTTS_LOGGER, "transformers")
    saved = {n: logging.getLogger(n).level for n in names}
    bars = hf_logging.is_progress_bar_enabled()
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
            yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()


def _check_files(asset_dir: Path) -> None:
    for rel in ASSET_FILES:
        if not (asset_dir / rel).is_file():
            raise IntegrityError(f"{asset_dir}: checkpoint file {rel} is missing")


def _check_released_hashes(asset_dir: Path, sha256_map: dict[str, str]) -> None:
    """ChatTTS's own check (`check_all_assets`) where the folder is named `asset`, else the same
    comparison against the same `res/sha256_map.json`, naming the first mismatching file."""
    if asset_dir.name == "asset":
        # ChatTTS: the PyTorch reference only; 7.9 s to import
        from ChatTTS.utils import check_all_assets

        with quiet_chattts():
            if check_all_assets(asset_dir.parent, sha256_map, update=False):
                return
    for rel in ASSET_FILES:
        expected = sha256_map.get(sha256_map_key(rel))
        if expected is not None and sha256_file(asset_dir / rel) != expected:
            raise IntegrityError(
                f"{asset_dir / rel}: sha256 differs from the released ChatTTS checkpoint and there is no "
                "synthetic marker (run `chattts-forge checkpoint verify` for details)"
            )


def load_chat(
    path: str | os.PathLike[str] | None,
    device: str = "cpu",
    *,
    verify_hashes: bool = True,
    verbose: bool = False,
) -> ChatTTS.Chat:
    """ChatTTS's `Chat` loaded from the checkpoint at `path` (asset folder, snapshot root or HF cache).

    Dimensions come from the checkpoint (`load_dims`), so `tiny` checkpoints load as they are.
    Loading never disturbs the caller's torch RNG (ChatTTS draws a throw-away DVAE coef from it).
    """
    # torch, ChatTTS: the PyTorch reference only; 7.9 s to import
    import ChatTTS
    import torch
    from ChatTTS.core import Chat

    asset_dir = resolve_asset_dir(path)
    _check_files(asset_dir)
    marker = read_marker(asset_dir)
    dims = load_dims(asset_dir)

    chat: Chat = ChatTTS.Chat(logging.getLogger(CHATTTS_LOGGER))
    if marker is None:
        if verify_hashes:
            _check_released_hashes(asset_dir, chat.sha256_map)
        spk_stat = None  # the released statistics: ChatTTS's own Config().spk_stat
        kind = "released"
    else:
        spk_stat = marker.get("spk_stat")
        if not isinstance(spk_stat, str) or not spk_stat:
            raise ForgeError(f"{asset_dir}: synthetic marker has no spk_stat (speaker statistics)")
        kind = f"synthetic {marker.get('preset', '?')} seed {marker.get('seed', '?')}"
    chat.config = build_config(dims, spk_stat)

    paths = {
        "vocos_ckpt_path": str(asset_dir / "Vocos.safetensors"),
        "dvae_ckpt_path": str(asset_dir / "DVAE.safetensors"),
        "gpt_ckpt_path": str(asset_dir / "gpt"),
        "embed_path": str(asset_dir / "Embed.safetensors"),
        "decoder_ckpt_path": str(asset_dir / "Decoder.safetensors"),
        "tokenizer_path": str(asset_dir / "tokenizer"),
    }
    log.info("loading ChatTTS (%s checkpoint) from %s on %s", kind, asset_dir, device)
    try:
        with quiet_chattts(verbose), torch.random.fork_rng(devices=[]):
            ok = chat._load(device=torch.device(device), compile=False, **paths)
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ForgeError(f"{asset_dir}: ChatTTS could not load the checkpoint: {first_line}") from None
    if not ok:
        raise ForgeError(f"{asset_dir}: ChatTTS reports modules missing after loading")
    chat.forge_asset_dir = asset_dir  # type: ignore[attr-defined]
    chat.forge_dims = dims  # type: ignore[attr-defined]
    return chat
