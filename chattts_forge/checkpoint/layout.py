"""The ChatTTS asset folder layout and the model dimensions every tool rebuilds modules from.

The released checkpoint (2Noise/ChatTTS, `asset/`) is described by ChatTTS's own `Config`
(chattts 0.2.5, ChatTTS/config/config.py) and `gpt/config.json`. A synthetic checkpoint writes
the same files; its marker file (`MARKER_NAME`) records preset, seed and the dimensions, so that
`tiny` checkpoints can be rebuilt by any tool without guessing.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, ForgeError, NotFound

MARKER_NAME = "chattts_forge_synthetic.json"

# Files of the released asset folder, keyed like ChatTTS's res/sha256_map.json
# ("sha256_asset_" + path with "/" and "." turned into "_").
ASSET_FILES: tuple[str, ...] = (
    "Decoder.safetensors",
    "DVAE.safetensors",
    "Embed.safetensors",
    "Vocos.safetensors",
    "gpt/config.json",
    "gpt/model.safetensors",
    "tokenizer/special_tokens_map.json",
    "tokenizer/tokenizer_config.json",
    "tokenizer/tokenizer.json",
)


def sha256_map_key(rel_path: str) -> str:
    return "sha256_asset_" + rel_path.replace("/", "_").replace(".", "_")


@dataclass(frozen=True)
class ConvStackDims:
    """One DVAEDecoder stack (ChatTTS config.Decoder)."""

    idim: int
    odim: int
    hidden: int
    n_layer: int
    bn_dim: int


@dataclass(frozen=True)
class Dims:
    """Every dimension of a ChatTTS checkpoint. `full` equals the released model."""

    # GPT (a transformers LlamaModel) and its embeddings/heads (Embed.safetensors)
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    num_hidden_layers: int = 20
    max_position_embeddings: int = 4096
    llama_vocab_size: int = 32000  # the unused `embed_tokens` of the LlamaModel
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    num_audio_tokens: int = 626  # 625 FSQ codes (5^4) + EOS
    num_text_tokens: int = 21178
    num_vq: int = 4
    spk_emb_dim: int = 192
    # Decoder.safetensors: GPT hidden states -> mel (DVAE without encoder/VQ)
    decoder: ConvStackDims = field(default_factory=lambda: ConvStackDims(384, 384, 512, 12, 128))
    # DVAE.safetensors: encoder, decoder, VQ
    dvae_encoder: ConvStackDims = field(default_factory=lambda: ConvStackDims(512, 1024, 256, 12, 128))
    dvae_decoder: ConvStackDims = field(default_factory=lambda: ConvStackDims(512, 512, 256, 12, 128))
    vq_dim: int = 1024
    vq_levels: tuple[int, ...] = (5, 5, 5, 5)
    vq_groups: int = 2
    vq_residuals: int = 2
    # Vocos.safetensors
    vocos_dim: int = 512
    vocos_intermediate_dim: int = 1536
    vocos_num_layers: int = 8
    n_mels: int = 100
    n_fft: int = 1024
    hop_length: int = 256
    sample_rate: int = 24000

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def decoder_dim(self) -> int:
        """ChatTTS builds the Decoder with dim=config.decoder.idim."""
        return self.decoder.idim

    @property
    def dvae_dim(self) -> int:
        """ChatTTS builds the DVAE with dim=config.dvae.decoder.idim."""
        return self.dvae_decoder.idim

    @property
    def eos_token(self) -> int:
        return self.num_audio_tokens - 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["vq_levels"] = list(self.vq_levels)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Dims:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"unknown checkpoint dimension(s): {', '.join(sorted(unknown))}")
        kw = dict(d)
        for key in ("decoder", "dvae_encoder", "dvae_decoder"):
            if key in kw and isinstance(kw[key], dict):
                kw[key] = ConvStackDims(**kw[key])
        if "vq_levels" in kw:
            kw["vq_levels"] = tuple(kw["vq_levels"])
        return cls(**kw)

    def gpt_config_json(self) -> dict[str, Any]:
        """`gpt/config.json` with the released file's fields (transformers 4.41.2 wrote it)."""
        return {
            "architectures": ["LlamaModel"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": self.num_attention_heads,
            "num_audio_tokens": self.num_audio_tokens,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_text_tokens": self.num_text_tokens,
            "num_vq": self.num_vq,
            "pretraining_tp": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": None,
            "rope_theta": self.rope_theta,
            "spk_KL": False,
            "spk_emb_dim": self.spk_emb_dim,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.41.2",
            "use_cache": False,
            "vocab_size": self.llama_vocab_size,
        }


FULL = Dims()

# Small enough that a whole pipeline (export, runtime, parity) runs in seconds; the vocabularies,
# mel bins, sample rate, hop and FSQ levels are the real ones so every interface stays identical.
TINY = Dims(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_hidden_layers=2,
    decoder=ConvStackDims(32, 32, 48, 2, 16),
    dvae_encoder=ConvStackDims(32, 64, 32, 2, 16),
    dvae_decoder=ConvStackDims(32, 32, 32, 2, 16),
    vq_dim=64,
    vocos_dim=32,
    vocos_intermediate_dim=64,
    vocos_num_layers=2,
)

PRESETS: dict[str, Dims] = {"tiny": TINY, "full": FULL}


def preset_dims(name: str) -> Dims:
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInput(f"unknown preset '{name}' (choose from: {', '.join(PRESETS)})") from None


def read_marker(asset_dir: Path) -> dict[str, Any] | None:
    """The synthetic marker of an asset folder, None for a real checkpoint."""
    p = asset_dir / MARKER_NAME
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{p}: unreadable synthetic marker ({e})") from None


def load_dims(asset_dir: str | os.PathLike[str]) -> Dims:
    """Dimensions of the checkpoint in `asset_dir`: from its marker, else the released model's."""
    marker = read_marker(Path(asset_dir))
    if marker is None:
        return FULL
    return Dims.from_dict(marker["dims"])


def _hf_cache_roots() -> list[Path]:
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")))
    roots.append(hf_home / "hub")
    return roots


def find_hf_snapshot(cache_root: Path | None = None) -> Path | None:
    """The newest `models--2Noise--ChatTTS/snapshots/<rev>` in the Hugging Face cache, or None.

    Follows the cache's `refs/main` when present (the revision `snapshot_download` resolved),
    else the most recently modified snapshot, as ChatTTS itself does.
    """
    roots = [cache_root] if cache_root is not None else _hf_cache_roots()
    for root in roots:
        repo = root / "models--2Noise--ChatTTS"
        snaps = repo / "snapshots"
        if not snaps.is_dir():
            continue
        ref = repo / "refs" / "main"
        if ref.is_file():
            rev = ref.read_text().strip()
            if (snaps / rev).is_dir():
                return snaps / rev
        candidates = [p for p in snaps.iterdir() if p.is_dir()]
        if candidates:
            return max(candidates, key=lambda p: p.stat().st_mtime)
    return None


def resolve_asset_dir(path: str | os.PathLike[str] | None) -> Path:
    """Turn what a user names into the asset folder that holds `gpt/`, `Embed.safetensors`, ...

    Accepts the asset folder itself, a snapshot root containing `asset/`, a Hugging Face cache
    root (containing `models--2Noise--ChatTTS`), or None / "hf" for the default HF cache.
    """
    if path is None or str(path) == "hf":
        snap = find_hf_snapshot()
        if snap is None:
            raise ForgeError(
                "no ChatTTS snapshot in the Hugging Face cache (looked for "
                "models--2Noise--ChatTTS/snapshots under HF_HUB_CACHE, HF_HOME or ~/.cache/huggingface)"
            )
        return resolve_asset_dir(snap)
    p = Path(path).expanduser()
    if not p.exists():
        raise NotFound(f"checkpoint folder {p} does not exist")
    if not p.is_dir():
        raise BadInput(f"checkpoint {p} is not a folder")
    if (p / "gpt").is_dir() or (p / MARKER_NAME).exists() or (p / "Embed.safetensors").exists():
        return p
    if (p / "asset").is_dir():
        return p / "asset"
    if (p / "models--2Noise--ChatTTS").is_dir():
        snap = find_hf_snapshot(p)
        if snap is not None:
            return resolve_asset_dir(snap)
    if (p / "hub" / "models--2Noise--ChatTTS").is_dir():
        snap = find_hf_snapshot(p / "hub")
        if snap is not None:
            return resolve_asset_dir(snap)
    raise BadInput(
        f"{p} is not a ChatTTS checkpoint: expected an asset folder (gpt/, Embed.safetensors, ...), "
        "a snapshot root containing asset/, or a Hugging Face cache"
    )
