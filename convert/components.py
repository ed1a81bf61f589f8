"""What each exported component is: its wrapper, graph I/O, export examples and parity cases.

The PyTorch reference of every parity case is ChatTTS's own code path (not the export wrapper):
`Embed.forward`, the `LlamaModel` called the way `GPT.generate` calls it (2-D float mask, float
position ids, a `DynamicCache`, `cache_position`), the weight-normed heads under
`parametrize.cached()`, `DVAE.forward` for the Decoder and the DVAE, and `Vocos.decode`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn
from transformers.cache_utils import DynamicCache

from chattts_forge.artifact import DECODER, DVAE, DVAE_ENCODER, EMBED, GPT, HEAD_CODE, HEAD_TEXT, VOCODER
from chattts_forge.checkpoint.layout import Dims
from chattts_forge.convert.modules import (
    DvaeEncoderForExport,
    EmbedForExport,
    GptStepForExport,
    HeadCodeForExport,
    HeadTextForExport,
    MelDecoderForExport,
    VocosForExport,
)
from chattts_forge.convert.parity import ParityCase


@dataclass
class SourceModules:
    """The ChatTTS PyTorch modules a checkpoint loads into (from a `ChatTTS.Chat`)."""

    embed: nn.Module  # ChatTTS.model.Embed (emb_code, emb_text, head_code, head_text)
    llama: nn.Module  # transformers LlamaModel (ChatTTS GPT.gpt)
    decoder: nn.Module  # ChatTTS.model.DVAE without VQ (Chat.decoder)
    dvae: nn.Module  # ChatTTS.model.DVAE with GFSQ (Chat.dvae)
    vocos: nn.Module  # vocos.Vocos (Chat.vocos)

    @classmethod
    def from_chat(cls, chat: Any) -> SourceModules:
        return cls(
            embed=chat.embed,
            llama=chat.gpt.gpt,
            decoder=chat.decoder,
            dvae=chat.dvae,
            vocos=chat.vocos,
        )


@dataclass
class IOSpec:
    name: str
    shape: list[str | int]
    dtype: str


@dataclass
class ComponentSpec:
    name: str
    file: str
    wrapper: nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    cases: Callable[[], list[ParityCase]]
    tolerance_abs: float = 1e-4
    fp16: bool = True
    extra_meta: dict[str, str] = field(default_factory=dict)

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        axes: dict[str, dict[int, str]] = {}
        for io in (*self.inputs, *self.outputs):
            dyn = {i: d for i, d in enumerate(io.shape) if isinstance(d, str)}
            if dyn:
                axes[io.name] = dyn
        return axes


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------- embed
def _embed_ids(dims: Dims, batch: int, seq: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    text_mask = torch.rand(batch, seq, generator=g) < 0.5
    text_mask[:, 0] = True
    text_ids = torch.randint(0, dims.num_text_tokens, (batch, seq), generator=g)
    code_ids = torch.randint(0, dims.num_audio_tokens, (batch, seq, dims.num_vq), generator=g)
    # ChatTTS's tokenizer repeats a text id over the num_vq streams.
    ids = torch.where(text_mask.unsqueeze(-1), text_ids.unsqueeze(-1).expand(-1, -1, dims.num_vq), code_ids)
    return ids.long(), text_mask


def embed_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    def cases() -> list[ParityCase]:
        out = []
        for name, b, s, seed in (("b1_s5", 1, 5, 1), ("b3_s9", 3, 9, 2), ("b3_s300_long", 3, 300, 3)):
            ids, mask = _embed_ids(dims, b, s, _gen(seed))
            with torch.inference_mode():
                ref = src.embed(ids, mask)
            out.append(
                ParityCase(name, {"input_ids": _np(ids), "text_mask": _np(mask)}, {"inputs_embeds": _np(ref)})
            )
        return out

    ids, mask = _embed_ids(dims, 2, 4, _gen(0))
    return ComponentSpec(
        name=EMBED,
        file="embed.onnx",
        wrapper=EmbedForExport(src.embed),
        example=(ids, mask),
        inputs=[
            IOSpec("input_ids", ["batch", "seq", dims.num_vq], "int64"),
            IOSpec("text_mask", ["batch", "seq"], "bool"),
        ],
        outputs=[IOSpec("inputs_embeds", ["batch", "seq", dims.hidden_size], "float32")],
        cases=cases,
    )


# ---------------------------------------------------------------------------------- gpt
def gpt_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    past = []
    present = []
    for i in range(num_layers):
        past += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        present += [f"present.{i}.key", f"present.{i}.value"]
    return ["inputs_embeds", "attention_mask", "position_ids", *past], ["last_hidden_state", *present]


def chattts_position_ids(attention_mask: torch.Tensor, seq: int) -> torch.Tensor:
    """As ChatTTS `_prepare_generation_inputs`: cumsum(mask) - 1, masked positions 1, last `seq`."""
    pos = attention_mask.long().cumsum(-1) - 1
    pos.masked_fill_(attention_mask.eq(0), 1)
    return pos[:, -seq:]


def gpt_reference(
    llama: nn.Module,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor,
    past: list[torch.Tensor],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The LlamaModel call of ChatTTS `GPT.generate` (float mask and positions, DynamicCache)."""
    seq = inputs_embeds.shape[1]
    past_len = past[0].shape[2] if past else 0
    position_ids = chattts_position_ids(attention_mask, seq)
    cache = DynamicCache([(past[i], past[i + 1]) for i in range(0, len(past), 2)]) if past_len > 0 else None
    dtype = inputs_embeds.dtype
    with torch.no_grad():
        out = llama(
            attention_mask=attention_mask.to(dtype),
            position_ids=position_ids.to(dtype),
            cache=cache,  # ChatTTS passes it as `past_key_values`, which transformers renames
            inputs_embeds=inputs_embeds,
            use_cache=True,
            cache_position=torch.arange(past_len, past_len + seq).to(dtype),
        )
    present_cache = out.cache  # transformers 5 name of `past_key_values`
    presents: list[torch.Tensor] = []
    for layer in present_cache.layers:
        presents += [layer.keys, layer.values]
    return out.last_hidden_state, presents


def _gpt_case_tensors(
    src: SourceModules, dims: Dims, batch: int, seq: int, past_len: int, pads: list[int], g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Embeddings of random text ids, a left-padded mask, and a past computed by the model itself."""
    total = past_len + seq
    attention_mask = torch.ones(batch, total, dtype=torch.long)
    for b, p in enumerate(pads[:batch]):
        attention_mask[b, :p] = 0
    ids = torch.randint(0, dims.num_text_tokens, (batch, total), generator=g)
    with torch.no_grad():
        embeds = src.embed.emb_text(ids)
    past: list[torch.Tensor] = []
    if past_len > 0:
        _, past = gpt_reference(src.llama, embeds[:, :past_len], attention_mask[:, :past_len], [])
    else:
        shape = (batch, dims.num_key_value_heads, 0, dims.head_dim)
        past = [torch.zeros(shape) for _ in range(2 * dims.num_hidden_layers)]
    return embeds[:, past_len:].contiguous(), attention_mask, past


def gpt_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    in_names, out_names = gpt_io_names(dims.num_hidden_layers)
    kv_shape: list[str | int] = ["batch", dims.num_key_value_heads, "past_seq", dims.head_dim]
    present_shape: list[str | int] = ["batch", dims.num_key_value_heads, "total_seq", dims.head_dim]

    def cases() -> list[ParityCase]:
        out = []
        plan = (
            # name, batch, new positions, past length, left padding per row
            ("b1_s7_p0", 1, 7, 0, [0]),
            ("b3_s6_p0_leftpad", 3, 6, 0, [0, 2, 4]),
            ("b3_s1_p9_leftpad", 3, 1, 9, [0, 3, 5]),
            ("b1_s1_p20", 1, 1, 20, [0]),
            ("b3_s4_p6", 3, 4, 6, [1, 0, 2]),
            ("b3_s64_p0_long", 3, 64, 0, [0, 10, 30]),
            ("b1_s1_p300_long", 1, 1, 300, [0]),
        )
        for i, (name, b, s, p, pads) in enumerate(plan):
            embeds, mask, past = _gpt_case_tensors(src, dims, b, s, p, pads, _gen(100 + i))
            hidden, presents = gpt_reference(src.llama, embeds, mask, past if p > 0 else [])
            inputs = {
                "inputs_embeds": _np(embeds),
                "attention_mask": _np(mask),
                "position_ids": _np(chattts_position_ids(mask, s)),
            }
            expected = {"last_hidden_state": _np(hidden)}
            # Padding positions are never read by ChatTTS; compare real positions only.
            masks = {"last_hidden_state": _np(mask[:, p:].bool())[:, :, None]}
            for j, name_in in enumerate(in_names[3:]):
                inputs[name_in] = _np(past[j])
            for j, name_out in enumerate(out_names[1:]):
                expected[name_out] = _np(presents[j])
                masks[name_out] = _np(mask.bool())[:, None, :, None]
            out.append(ParityCase(name, inputs, expected, masks))
        return out

    embeds, mask, past = _gpt_case_tensors(src, dims, 2, 3, 4, [0, 2], _gen(7))
    example = (embeds, mask, chattts_position_ids(mask, 3), *past)
    inputs = [
        IOSpec("inputs_embeds", ["batch", "seq", dims.hidden_size], "float32"),
        IOSpec("attention_mask", ["batch", "total_seq"], "int64"),
        IOSpec("position_ids", ["batch", "seq"], "int64"),
    ] + [IOSpec(n, kv_shape, "float32") for n in in_names[3:]]
    outputs = [IOSpec("last_hidden_state", ["batch", "seq", dims.hidden_size], "float32")] + [
        IOSpec(n, present_shape, "float32") for n in out_names[1:]
    ]
    return ComponentSpec(
        name=GPT,
        file="gpt.onnx",
        wrapper=GptStepForExport(src.llama),
        example=example,
        inputs=inputs,
        outputs=outputs,
        cases=cases,
    )


# ---------------------------------------------------------------------------------- heads
def _hidden(dims: Dims, batch: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(batch, dims.hidden_size, generator=g)


def head_code_reference(embed: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), parametrize.cached():
        return torch.stack([h(hidden) for h in embed.head_code], 1)


def head_code_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    def cases() -> list[ParityCase]:
        out = []
        for name, b, seed in (("b1", 1, 11), ("b3", 3, 12), ("b16", 16, 13)):
            h = _hidden(dims, b, _gen(seed))
            out.append(
                ParityCase(
                    name, {"hidden_states": _np(h)}, {"logits": _np(head_code_reference(src.embed, h))}
                )
            )
        return out

    return ComponentSpec(
        name=HEAD_CODE,
        file="head_code.onnx",
        wrapper=HeadCodeForExport(src.embed.head_code),
        example=(_hidden(dims, 2, _gen(0)),),
        inputs=[IOSpec("hidden_states", ["batch", dims.hidden_size], "float32")],
        outputs=[IOSpec("logits", ["batch", dims.num_vq, dims.num_audio_tokens], "float32")],
        cases=cases,
    )


def head_text_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    def reference(h: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), parametrize.cached():
            return src.embed.head_text(h)

    def cases() -> list[ParityCase]:
        return [
            ParityCase(name, {"hidden_states": _np(h)}, {"logits": _np(reference(h))})
            for name, h in (("b1", _hidden(dims, 1, _gen(21))), ("b3", _hidden(dims, 3, _gen(22))))
        ]

    return ComponentSpec(
        name=HEAD_TEXT,
        file="head_text.onnx",
        wrapper=HeadTextForExport(src.embed.head_text),
        example=(_hidden(dims, 2, _gen(0)),),
        inputs=[IOSpec("hidden_states", ["batch", dims.hidden_size], "float32")],
        outputs=[IOSpec("logits", ["batch", dims.num_text_tokens], "float32")],
        cases=cases,
    )


# ---------------------------------------------------------------------------------- decoder / dvae
def decoder_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    def make(b: int, t: int, seed: int) -> torch.Tensor:
        return torch.randn(b, dims.hidden_size, t, generator=_gen(seed))

    def cases() -> list[ParityCase]:
        out = []
        for name, b, t, seed in (("b1_t1", 1, 1, 31), ("b3_t17", 3, 17, 32), ("b1_t400_long", 1, 400, 33)):
            h = make(b, t, seed)
            with torch.inference_mode():
                ref = src.decoder(h.clone())
            out.append(ParityCase(name, {"hidden_states": _np(h)}, {"mel": _np(ref)}))
        return out

    return ComponentSpec(
        name=DECODER,
        file="decoder.onnx",
        wrapper=MelDecoderForExport(src.decoder),
        example=(make(2, 5, 0),),
        inputs=[IOSpec("hidden_states", ["batch", dims.hidden_size, "frames"], "float32")],
        outputs=[IOSpec("mel", ["batch", dims.n_mels, "mel_frames"], "float32")],
        cases=cases,
    )


def dvae_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    n_codes = int(np.prod(dims.vq_levels))

    def make(b: int, t: int, seed: int) -> torch.Tensor:
        return torch.randint(0, n_codes, (b, dims.num_vq, t), generator=_gen(seed))

    def cases() -> list[ParityCase]:
        out = []
        for name, b, t, seed in (("b1_t1", 1, 1, 41), ("b3_t17", 3, 17, 42), ("b1_t400_long", 1, 400, 43)):
            c = make(b, t, seed)
            with torch.inference_mode():
                ref = src.dvae(c.clone())
            out.append(ParityCase(name, {"codes": _np(c)}, {"mel": _np(ref)}))
        return out

    return ComponentSpec(
        name=DVAE,
        file="dvae.onnx",
        wrapper=MelDecoderForExport(src.dvae),
        example=(make(2, 5, 0),),
        inputs=[IOSpec("codes", ["batch", dims.num_vq, "frames"], "int64")],
        outputs=[IOSpec("mel", ["batch", dims.n_mels, "mel_frames"], "float32")],
        cases=cases,
    )


def speech_like_recording(samples: int, sample_rate: int, g: torch.Generator) -> torch.Tensor:
    """A speech-like float32 recording [samples] in [-1, 1]: a few harmonics with a drifting pitch,
    an amplitude envelope and a little noise (the encoder's parity inputs, and the tests')."""
    t = torch.arange(samples, dtype=torch.float64) / sample_rate
    f0 = 110.0 + 60.0 * torch.rand((), generator=g, dtype=torch.float64)
    pitch = f0 * (1.0 + 0.1 * torch.sin(2 * math.pi * 0.7 * t))
    phase = 2 * math.pi * torch.cumsum(pitch, 0) / sample_rate
    wav = sum(torch.sin(h * phase) / h for h in range(1, 6))
    envelope = 0.5 + 0.5 * torch.sin(2 * math.pi * 2.3 * t).abs()
    noise = 0.02 * torch.randn(samples, generator=g, dtype=torch.float64)
    return (0.3 * envelope * wav + noise).clamp(-1, 1).float()


def dvae_encoder_reference(dvae: nn.Module, wav: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ChatTTS's encode path on one recording [samples]: (codes [num_vq, T], features [vq_dim, T]).

    Codes come from `DVAE.forward(wav, "encode")` itself (what `Chat.sample_audio_speaker` runs);
    the features are the same steps stopped before the quantizer (its submodules, in its order)."""
    with torch.inference_mode():
        codes = dvae(wav.clone(), "encode")[0]
        mel = dvae.preprocessor_mel(wav.clone())
        feats = dvae.encoder(dvae.downsample_conv(mel / dvae.coef.view(-1, 1)).unsqueeze(0))[0]
    return codes, feats


def dvae_encoder_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    def make(b: int, samples: int, seed: int) -> torch.Tensor:
        g = _gen(seed)
        return torch.stack([speech_like_recording(samples, dims.sample_rate, g) for _ in range(b)])

    def cases() -> list[ParityCase]:
        out = []
        # 513 samples: the shortest recording (reflect padding needs more than n_fft / 2).
        plan = (("b1_s513_short", 1, dims.n_fft // 2 + 1, 61), ("b3_s12000", 3, 12000, 62),
                ("b1_s72000_long", 1, 72000, 63))
        for name, b, n, seed in plan:
            wav = make(b, n, seed)
            refs = [dvae_encoder_reference(src.dvae, row) for row in wav]
            expected = {"codes": _np(torch.stack([c for c, _ in refs]).long()),
                        "features": _np(torch.stack([f for _, f in refs]))}
            out.append(ParityCase(name, {"wav": _np(wav)}, expected))
        return out

    return ComponentSpec(
        name=DVAE_ENCODER,
        file="dvae_encoder.onnx",
        wrapper=DvaeEncoderForExport(src.dvae),
        example=(make(2, 4000, 0),),
        inputs=[IOSpec("wav", ["batch", "samples"], "float32")],
        outputs=[
            IOSpec("codes", ["batch", dims.num_vq, "frames"], "int64"),
            IOSpec("features", ["batch", dims.vq_dim, "frames"], "float32"),
        ],
        cases=cases,
        fp16=False,  # codes must equal ChatTTS's exactly (spk_smp strings): FP16 would move roundings
    )


# ---------------------------------------------------------------------------------- vocos
def vocos_spec(src: SourceModules, dims: Dims) -> ComponentSpec:
    def make(b: int, f: int, seed: int) -> torch.Tensor:
        # Around the range of ChatTTS's log-mel (clipped at log(1e-5)).
        return torch.randn(b, dims.n_mels, f, generator=_gen(seed)) * 2.0 - 3.0

    def cases() -> list[ParityCase]:
        out = []
        for name, b, f, seed in (("b1_f2", 1, 2, 51), ("b3_f24", 3, 24, 52), ("b1_f400_long", 1, 400, 53)):
            m = make(b, f, seed)
            with torch.inference_mode():
                ref = src.vocos.decode(m.clone())
            out.append(ParityCase(name, {"mel": _np(m)}, {"waveform": _np(ref)}))
        return out

    return ComponentSpec(
        name=VOCODER,
        file="vocos.onnx",
        wrapper=VocosForExport(src.vocos),
        example=(make(2, 6, 0),),
        inputs=[IOSpec("mel", ["batch", dims.n_mels, "frames"], "float32")],
        outputs=[IOSpec("waveform", ["batch", "samples"], "float32")],
        cases=cases,
        fp16=False,
    )


SPEC_BUILDERS: dict[str, Callable[[SourceModules, Dims], ComponentSpec]] = {
    EMBED: embed_spec,
    GPT: gpt_spec,
    HEAD_CODE: head_code_spec,
    HEAD_TEXT: head_text_spec,
    DECODER: decoder_spec,
    DVAE: dvae_spec,
    DVAE_ENCODER: dvae_encoder_spec,
    VOCODER: vocos_spec,
}
