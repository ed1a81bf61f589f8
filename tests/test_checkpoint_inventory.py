"""The synthetic inventory equals what ChatTTS 0.2.5's own torch modules load, for both presets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chattts_forge.checkpoint.inventory import (
    DVAE_FILE,
    GPT_FILE,
    TENSOR_FILES,
    VOCOS_FILE,
    checkpoint_inventory,
    inventory_table,
)
from chattts_forge.checkpoint.layout import FULL, TINY, ConvStackDims
from chattts_forge.checkpoint.safetensors_io import read_header, read_tensor

torch = pytest.importorskip("torch")

_TORCH_DTYPE_NAMES = {torch.float32: "float32"}


def _torch_inventory(dims) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    from chattts_forge.checkpoint.torch_modules import build_modules

    return {
        file: {k: (tuple(t.shape), _TORCH_DTYPE_NAMES[t.dtype]) for k, t in module.state_dict().items()}
        for file, module in build_modules(dims, meta=True).items()
    }


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_inventory_equals_chattts_modules(preset: str) -> None:
    dims = {"tiny": TINY, "full": FULL}[preset]
    ours = inventory_table(dims)
    theirs = _torch_inventory(dims)
    assert set(ours) == set(theirs) == set(TENSOR_FILES)
    for file in TENSOR_FILES:
        assert list(ours[file]) == list(theirs[file]), f"{file}: tensor names/order differ"
        assert ours[file] == theirs[file], f"{file}: shapes/dtypes differ"


def test_full_inventory_facts_of_the_release() -> None:
    """Spot checks of the released layout that the tests above derive from the modules."""
    table = inventory_table(FULL)
    gpt = table[GPT_FILE]
    assert gpt["embed_tokens.weight"] == ((32000, 768), "float32")  # the unused Llama embedding
    assert sum(1 for k in gpt if k.startswith("layers.") and k.endswith("q_proj.weight")) == 20
    embed = table["Embed.safetensors"]
    assert embed["head_text.parametrizations.weight.original0"] == ((21178, 1), "float32")
    assert embed["head_code.3.parametrizations.weight.original1"] == ((626, 768), "float32")
    assert table[DVAE_FILE]["preprocessor_mel.mel_spec.mel_scale.fb"] == ((513, 100), "float32")
    assert table[DVAE_FILE]["coef"] == ((1, 100, 1), "float32")
    assert table[VOCOS_FILE]["head.istft.window"] == ((1024,), "float32")
    total = sum(s.nbytes for specs in checkpoint_inventory(FULL).values() for s in specs)
    assert 1.15e9 < total < 1.3e9


def test_full_gpt_config_equals_release(data_dir) -> None:
    released = json.loads((data_dir / "chattts-release" / "gpt-config.json").read_text())
    ours = FULL.gpt_config_json()
    assert ours == released
    assert set(ours) == set(released)
    for key, value in released.items():
        assert type(ours[key]) is type(value), key


def test_tiny_keeps_vocabularies_and_audio_settings() -> None:
    for field in (
        "num_audio_tokens",
        "num_text_tokens",
        "num_vq",
        "n_mels",
        "sample_rate",
        "hop_length",
        "n_fft",
    ):
        assert getattr(TINY, field) == getattr(FULL, field)
    assert TINY.vq_levels == FULL.vq_levels
    # The Decoder reads GPT hidden states folded in two; the DVAE reads VQ features folded in two.
    assert TINY.decoder.idim * 2 == TINY.hidden_size
    assert TINY.dvae_decoder.idim * 2 == TINY.vq_dim
    assert isinstance(TINY.decoder, ConvStackDims)


def test_deterministic_buffers_equal_torch(tiny_ckpt) -> None:
    """Mel filterbanks and Hann windows hold what torchaudio/torch compute, not noise."""
    from chattts_forge.checkpoint.torch_modules import build_modules

    fresh = build_modules(TINY, meta=False)
    checked = 0
    for file in (DVAE_FILE, VOCOS_FILE):
        state = fresh[file].state_dict()
        for name in state:
            if name.endswith((".window", "mel_scale.fb")):
                ours = read_tensor(tiny_ckpt / file, name)
                # torch computes these in float32 with CPU-dependent vectorised linspace, so the
                # bits differ by machine; we store the float64 values rounded once (<= 2e-5 apart).
                np.testing.assert_allclose(ours, state[name].numpy(), rtol=0, atol=2e-5, err_msg=name)
                checked += 1
    assert checked == 5  # DVAE: window + fb; Vocos: window + fb + istft window


def test_the_hand_read_header_and_safetensors_own_reader_agree(tiny_ckpt) -> None:
    """read_header (verify's, by hand: offsets and failure kinds) describes each tensor as
    read_tensor (safetensors' safe_open) returns it, and its offsets hold the same bytes."""
    for file in (DVAE_FILE, VOCOS_FILE):
        header = read_header(tiny_ckpt / file)
        raw = (tiny_ckpt / file).read_bytes()
        assert header.tensors
        for name, entry in header.tensors.items():
            tensor = read_tensor(tiny_ckpt / file, name)
            assert tensor.shape == entry.shape, name
            assert tensor.dtype.itemsize * tensor.size == entry.end - entry.begin, name
            span = raw[header.data_start + entry.begin : header.data_start + entry.end]
            assert tensor.tobytes() == span, name
