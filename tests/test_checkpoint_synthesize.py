"""Synthetic checkpoints: layout, determinism, realistic activations, ChatTTS loads them."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pybase16384 as b14
import pytest
from safetensors.numpy import load_file

from chattts_forge.checkpoint.inventory import GPT_FILE, TENSOR_FILES, checkpoint_inventory, gpt_inventory
from chattts_forge.checkpoint.layout import ASSET_FILES, MARKER_NAME, TINY, load_dims, read_marker
from chattts_forge.checkpoint.synthesize import make_tensor, synthesize_checkpoint, tensor_rng
from chattts_forge.errors import ForgeError
from chattts_forge.integrity import sha256_file


def _all_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_and_marker(tiny_ckpt: Path) -> None:
    for rel in ASSET_FILES:
        assert (tiny_ckpt / rel).is_file(), rel
    marker = read_marker(tiny_ckpt)
    assert marker is not None
    assert marker["synthetic"] is True and marker["preset"] == "tiny" and marker["seed"] == 0
    assert marker["tool"] == "chattts-forge" and marker["tool_version"]
    assert load_dims(tiny_ckpt) == TINY
    assert marker["files"] == {rel: sha256_file(tiny_ckpt / rel) for rel in ASSET_FILES}
    cfg = json.loads((tiny_ckpt / "gpt" / "config.json").read_text())
    assert cfg == TINY.gpt_config_json()
    # Nothing but the asset files and the marker.
    assert set(_all_files(tiny_ckpt)) == set(ASSET_FILES) | {MARKER_NAME}


def test_same_seed_same_bytes_other_seed_other_weights(tiny_ckpt: Path, tmp_path: Path) -> None:
    again = synthesize_checkpoint(tmp_path / "again", preset="tiny", seed=0)
    assert _all_files(again) == _all_files(tiny_ckpt)
    other = synthesize_checkpoint(tmp_path / "other", preset="tiny", seed=1)
    for rel in TENSOR_FILES:
        assert sha256_file(other / rel) != sha256_file(tiny_ckpt / rel), rel
    # The tokenizer and config do not depend on the seed.
    for rel in ("gpt/config.json", "tokenizer/tokenizer.json"):
        assert (other / rel).read_bytes() == (tiny_ckpt / rel).read_bytes()


def test_tensors_readable_and_seeded_per_tensor(tiny_ckpt: Path) -> None:
    """safetensors reads every file; each tensor depends only on (seed, file, name)."""
    for file, specs in checkpoint_inventory(TINY).items():
        tensors = load_file(str(tiny_ckpt / file))
        assert sorted(tensors) == sorted(s.name for s in specs)
        for spec in specs:
            arr = tensors[spec.name]
            assert arr.dtype == np.float32 and arr.shape == spec.shape
            assert np.isfinite(arr).all(), spec.name
            expected = make_tensor(spec, tensor_rng(0, file, spec.name))
            np.testing.assert_array_equal(arr, expected, err_msg=spec.name)


def test_positive_gains_and_layer_scales(tiny_ckpt: Path) -> None:
    dvae = load_file(str(tiny_ckpt / "DVAE.safetensors"))
    decoder = load_file(str(tiny_ckpt / "Decoder.safetensors"))
    vocos = load_file(str(tiny_ckpt / "Vocos.safetensors"))
    for coef in (dvae["coef"], decoder["coef"]):
        assert (coef > 0.5).all() and (coef < 2.0).all() and abs(float(coef.mean()) - 1.0) < 0.15
    scales = [
        v
        for tensors in (dvae, decoder)
        for k, v in tensors.items()
        if "decoder_block" in k and k.endswith(".weight") and k.count(".") == 3  # ConvNeXt layer scale
    ]
    scales += [v for k, v in vocos.items() if k.endswith(".gamma")]
    assert len(scales) == 2 * 2 + 2 + 2  # DVAE encoder+decoder, Decoder, Vocos blocks (2 each in tiny)
    for s in scales:
        assert 0.05 < float(np.median(s)) < 0.6


def test_refuses_to_replace_a_foreign_folder(tmp_path: Path) -> None:
    victim = tmp_path / "data"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    with pytest.raises(ForgeError, match="not a synthetic checkpoint"):
        synthesize_checkpoint(victim, preset="tiny")
    assert (victim / "precious.txt").read_text() == "keep me"
    with pytest.raises(ForgeError, match="unknown preset"):
        synthesize_checkpoint(tmp_path / "x", preset="huge")


def test_spk_stat_decodes_like_chattts_speaker(tiny_ckpt: Path) -> None:
    pytest.importorskip("torch")
    from ChatTTS.model.speaker import Speaker

    marker = read_marker(tiny_ckpt)
    speaker = Speaker(TINY.hidden_size, marker["spk_stat"])
    assert speaker.std.shape == (TINY.hidden_size,) and speaker.mean.shape == (TINY.hidden_size,)
    assert (speaker.std > 0).all()
    sampled = speaker._decode(speaker.sample_random())
    assert sampled.shape == (TINY.hidden_size,) and np.isfinite(sampled).all()


def test_full_spk_stat_is_chattts_own() -> None:
    pytest.importorskip("torch")
    from ChatTTS.config import Config

    from chattts_forge.checkpoint.release import _vendored, release_spk_stat
    from chattts_forge.checkpoint.synthesize import spk_stat_for

    assert release_spk_stat() == Config().spk_stat == _vendored()["spk_stat"]
    assert spk_stat_for("full", dataclasses.replace(TINY), 0) == Config().spk_stat
    stat = np.frombuffer(b14.decode_from_string(Config().spk_stat), dtype=np.float16)
    assert stat.size == 2 * 768


# --- ChatTTS's own torch code on the synthetic weights -----------------------------------------


@pytest.fixture(scope="module")
def tiny_modules(tiny_ckpt: Path):
    pytest.importorskip("torch")
    from chattts_forge.checkpoint.torch_modules import load_modules

    return load_modules(tiny_ckpt)  # strict load_state_dict of every file


def _hidden_rms_per_layer(gpt, x) -> list[float]:
    import torch

    with torch.no_grad():
        out = gpt(inputs_embeds=x, output_hidden_states=True)
    return [float(h.pow(2).mean().sqrt()) for h in out.hidden_states]


def _prompt_embeds(embed, dims, n_text: int = 24, n_code: int = 40):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 21128, (1, n_text), generator=g)
    codes = torch.randint(0, dims.num_audio_tokens - 1, (1, n_code, dims.num_vq), generator=g)
    with torch.no_grad():
        text = embed.emb_text(ids)
        code = sum(embed.emb_code[i](codes[..., i]) for i in range(dims.num_vq))
    return torch.cat([text, code], 1), codes


def test_gpt_activations_and_logits_realistic(tiny_modules) -> None:
    import torch

    gpt, embed = tiny_modules[GPT_FILE], tiny_modules["Embed.safetensors"]
    x, _ = _prompt_embeds(embed, TINY)
    rms = _hidden_rms_per_layer(gpt, x)
    assert len(rms) == TINY.num_hidden_layers + 1
    assert all(0.3 < r < 3.0 for r in rms), rms
    with torch.no_grad():
        h = gpt(inputs_embeds=x).last_hidden_state
        assert torch.isfinite(h).all()
        logits = torch.stack([embed.head_code[i](h) for i in range(TINY.num_vq)], 2)
        text_logits = embed.head_text(h)
    for lg in (logits, text_logits):
        std = lg.std(-1)
        assert 1.5 < float(std.mean()) < 6.0
        top2 = lg.topk(2, -1).values
        gap = top2[..., 0] - top2[..., 1]
        assert float(gap.median()) > 0.3  # a clear winner, not flat logits
        assert float(lg.softmax(-1).max(-1).values.mean()) > 0.05


def test_gpt_stays_in_range_through_20_layers() -> None:
    """The released depth with the same (fan-in scaled) init: RMS stays O(1) at every layer."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaModel

    dims = dataclasses.replace(TINY, num_hidden_layers=20)
    state = {
        s.name: torch.from_numpy(make_tensor(s, tensor_rng(0, GPT_FILE, s.name))) for s in gpt_inventory(dims)
    }
    gpt = LlamaModel(LlamaConfig(**dims.gpt_config_json())).eval()
    gpt.load_state_dict(state, strict=True)
    g = torch.Generator().manual_seed(1)
    x = 0.8 * torch.randn(1, 64, dims.hidden_size, generator=g)
    rms = _hidden_rms_per_layer(gpt, x)
    assert len(rms) == 21
    assert all(0.3 < r < 4.0 for r in rms), rms
    assert rms[-1] > rms[0]  # every layer adds to the residual stream


def test_decoder_dvae_vocos_give_audible_finite_audio(tiny_modules) -> None:
    import torch

    gpt, embed = tiny_modules[GPT_FILE], tiny_modules["Embed.safetensors"]
    decoder, dvae, vocos = (
        tiny_modules[f] for f in ("Decoder.safetensors", "DVAE.safetensors", "Vocos.safetensors")
    )
    x, codes = _prompt_embeds(embed, TINY)
    with torch.no_grad():
        hidden = gpt(inputs_embeds=x).last_hidden_state[:, -codes.shape[1] :]
        mels = {
            "decoder": decoder(hidden.transpose(1, 2).contiguous()),
            "dvae": dvae(codes.transpose(1, 2).contiguous()),
        }
        for name, mel in mels.items():
            assert mel.shape == (1, TINY.n_mels, 2 * codes.shape[1]), name
            assert torch.isfinite(mel).all() and 0.2 < float(mel.std()) < 5.0, name
            wav = vocos.decode(mel)
            assert wav.shape == (1, TINY.hop_length * (mel.shape[-1] - 1)), name
            assert torch.isfinite(wav).all(), name
            rms = float(wav.pow(2).mean().sqrt())
            assert rms > 0.02, f"{name}: silent ({rms})"
            assert float((wav.abs() > 1).float().mean()) < 0.01, name
        # The encoder side works too: audio -> codes, using several distinct codes.
        ind = dvae(wav[0], "encode")
        assert ind.shape[1] == TINY.num_vq and len(torch.unique(ind)) > 5


def test_chattts_tokenizer_loads_synthetic_folder(tiny_ckpt: Path) -> None:
    pytest.importorskip("torch")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ChatTTS.model.tokenizer import Tokenizer

    tok = Tokenizer(str(tiny_ckpt / "tokenizer"))
    assert tok.len == 21178
    assert tok.spk_emb_ids == 21143 and tok.break_0_ids == 21147 and tok.eos_token == 21136


def test_chattts_generation_stops_on_its_own(tiny_chat) -> None:
    """The stop tokens' gains make ChatTTS's own sampling end before its budget, like a trained model."""
    from chattts_forge.torch_ref.reference import reference_synthesize

    budget = 600
    res = reference_synthesize(
        tiny_chat, "你好，今天天气真不错。", seed=0, refine=False, max_new_token=budget
    )
    assert 8 <= len(res.codes) < budget
    assert np.isfinite(res.wav).all() and float(np.sqrt(np.mean(res.wav**2))) > 0.01
    refined = reference_synthesize(
        tiny_chat, "你好，今天天气真不错。", seed=0, refine=True, max_new_token=8, refine_max_new_token=200
    )
    # the refiner stopped at [Ebreak] well before 200 tokens (ChatTTS decodes the ids back to text)
    assert 0 < len(refined.texts[0]) < 150
