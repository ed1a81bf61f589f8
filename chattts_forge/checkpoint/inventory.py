"""The tensor inventory of a ChatTTS checkpoint, as a pure function of its dimensions.

`checkpoint_inventory(dims)` lists, for every safetensors file of the asset folder, each tensor that
ChatTTS 0.2.5 loads with a strict `load_state_dict` (names, shapes, dtype), in the order the torch
modules register them, plus how `synthesize` initialises it. No torch is needed: the tests build
the real ChatTTS / vocos / transformers modules and check that their `state_dict()` equals this.

Initialisation is chosen so that a synthetic model behaves like a trained one in range (see
`TensorSpec.init`): residual streams stay O(1) through every layer, code/text logits have a spread
of a few units, layer scales are large enough that every block matters, `coef` is positive around
1, and Vocos outputs a finite, audible waveform mostly within [-1, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from chattts_forge.checkpoint.layout import ConvStackDims, Dims
from chattts_forge.checkpoint.tokenizer import NUM_TEXT_TOKENS, special_token_id

# Files of the asset folder that hold tensors, in the order `synthesize` writes them.
GPT_FILE = "gpt/model.safetensors"
EMBED_FILE = "Embed.safetensors"
DVAE_FILE = "DVAE.safetensors"
DECODER_FILE = "Decoder.safetensors"
VOCOS_FILE = "Vocos.safetensors"
TENSOR_FILES: tuple[str, ...] = (GPT_FILE, EMBED_FILE, DVAE_FILE, DECODER_FILE, VOCOS_FILE)

DTYPE = "float32"  # the released files are fp32 throughout
SAFETENSORS_DTYPE = {"float32": "F32"}


@dataclass(frozen=True)
class Init:
    """How to fill a tensor. `kind` is one of:

    - "normal": N(mean, std)
    - "lognormal": center * exp(N(0, sigma)), always positive (norm gains, layer scales, coef, g);
      rows listed in `fixed_rows` get a fixed value instead (stop-token gains of the heads)
    - "uniform": U(low, high)
    - "hann": periodic Hann window (torch.hann_window)
    - "mel_fb": torchaudio HTK mel filterbank [n_freqs, n_mels] (norm=None, f_min=0, f_max=sr/2)
    - "istft_head_weight": rows [0, n/2) (log-magnitude) N(0, std), rows [n/2, n) (phase) N(0, std2)
    - "istft_head_bias": log-magnitude falling from `high` to `low` across frequency plus N(0, std),
      phase U(-pi, pi)
    """

    kind: str
    std: float = 0.0
    mean: float = 0.0
    center: float = 1.0
    sigma: float = 0.0
    low: float = 0.0
    high: float = 0.0
    std2: float = 0.0
    sample_rate: int = 0
    n_fft: int = 0
    fixed_rows: tuple[tuple[int, float], ...] = ()  # (row, value) set after drawing (lognormal)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: Init
    dtype: str = DTYPE

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * 4


def _normal(std: float, mean: float = 0.0) -> Init:
    return Init("normal", std=std, mean=mean)


def _fan_in(gain: float, fan_in: int) -> Init:
    return Init("normal", std=gain / math.sqrt(fan_in))


def _gain(center: float = 1.0, sigma: float = 0.1) -> Init:
    return Init("lognormal", center=center, sigma=sigma)


_BIAS = _normal(0.02)
_LN_BIAS = _normal(0.02)
# Layer scale of ConvNeXt blocks: ~0.1-0.5 so every block changes its input (1e-6 in a fresh
# model would make the stacks identities and hide a broken export).
_LAYER_SCALE = Init("lognormal", center=0.25, sigma=0.3)
GELU_GAIN = 1.6  # keeps the RMS of a conv followed by GELU near its input's
EOS_GAIN = 3.5  # weight-norm gain of the audio EOS row (num_audio_tokens - 1) in every head_code
EBREAK_GAIN = 8.0  # weight-norm gain of [Ebreak] (the text refiner's stop token) in head_text


# --- GPT (transformers LlamaModel, saved by save_pretrained) -----------------------------------


def gpt_inventory(d: Dims) -> list[TensorSpec]:
    h, i = d.hidden_size, d.intermediate_size
    kv = d.num_key_value_heads * d.head_dim
    specs = [TensorSpec("embed_tokens.weight", (d.llama_vocab_size, h), _normal(0.02))]
    for n in range(d.num_hidden_layers):
        p = f"layers.{n}."
        specs += [
            # q/k a little above unit gain so attention is not uniform, v/o below so the
            # residual stream grows slowly (RMS stays O(1) after 20 layers).
            TensorSpec(p + "self_attn.q_proj.weight", (h, h), _fan_in(1.4, h)),
            TensorSpec(p + "self_attn.k_proj.weight", (kv, h), _fan_in(1.4, h)),
            TensorSpec(p + "self_attn.v_proj.weight", (kv, h), _fan_in(1.0, h)),
            TensorSpec(p + "self_attn.o_proj.weight", (h, h), _fan_in(0.6, h)),
            TensorSpec(p + "mlp.gate_proj.weight", (i, h), _fan_in(1.0, h)),
            TensorSpec(p + "mlp.up_proj.weight", (i, h), _fan_in(1.0, h)),
            TensorSpec(p + "mlp.down_proj.weight", (h, i), _fan_in(0.6, i)),
            TensorSpec(p + "input_layernorm.weight", (h,), _gain()),
            TensorSpec(p + "post_attention_layernorm.weight", (h,), _gain()),
        ]
    specs.append(TensorSpec("norm.weight", (h,), _gain()))
    return specs


# --- Embed (ChatTTS model/embed.py: embeddings and weight-normed heads) ------------------------


def embed_inventory(d: Dims) -> list[TensorSpec]:
    h = d.hidden_size
    # Folded head weight = g * v / ||v|| per output row, so a logit is ~N(0, g^2 * rms(h)^2):
    # g around 3 gives logits with a std of a few units and clear top-1/top-2 gaps.
    # The stop tokens get a fixed, slightly larger gain so that ChatTTS's sampling ends on its own
    # after a realistic number of steps (with equal gains it rarely stops and runs to
    # max_new_token; much larger gains stop at the first step). Measured with ChatTTS on tiny,
    # seeds 0-3, three texts: EOS gain 3.5 -> 30-390 code steps, [Ebreak] gain 8 -> 40-300 chars.
    head_g = Init("lognormal", center=3.0, sigma=0.25)
    code_g = Init("lognormal", center=3.0, sigma=0.25, fixed_rows=((d.eos_token, EOS_GAIN),))
    text_g = head_g
    if d.num_text_tokens == NUM_TEXT_TOKENS:
        text_g = Init(
            "lognormal", center=3.0, sigma=0.25, fixed_rows=((special_token_id("[Ebreak]"), EBREAK_GAIN),)
        )
    head_v = _normal(0.05)
    specs = [
        TensorSpec(f"emb_code.{q}.weight", (d.num_audio_tokens, h), _normal(0.8 / math.sqrt(d.num_vq)))
        for q in range(d.num_vq)
    ]
    specs.append(TensorSpec("emb_text.weight", (d.num_text_tokens, h), _normal(0.8)))
    specs.append(TensorSpec("head_text.parametrizations.weight.original0", (d.num_text_tokens, 1), text_g))
    specs.append(TensorSpec("head_text.parametrizations.weight.original1", (d.num_text_tokens, h), head_v))
    for q in range(d.num_vq):
        p = f"head_code.{q}.parametrizations.weight."
        specs.append(TensorSpec(p + "original0", (d.num_audio_tokens, 1), code_g))
        specs.append(TensorSpec(p + "original1", (d.num_audio_tokens, h), head_v))
    return specs


# --- DVAE / Decoder (ChatTTS model/dvae.py) -----------------------------------------------------


def _convnext_block(prefix: str, dim: int, intermediate: int, kernel: int = 7) -> list[TensorSpec]:
    return [
        TensorSpec(prefix + "weight", (dim,), _LAYER_SCALE),
        TensorSpec(prefix + "dwconv.weight", (dim, 1, kernel), _fan_in(1.0, kernel)),
        TensorSpec(prefix + "dwconv.bias", (dim,), _BIAS),
        TensorSpec(prefix + "norm.weight", (dim,), _gain()),
        TensorSpec(prefix + "norm.bias", (dim,), _LN_BIAS),
        TensorSpec(prefix + "pwconv1.weight", (intermediate, dim), _fan_in(1.0, dim)),
        TensorSpec(prefix + "pwconv1.bias", (intermediate,), _BIAS),
        TensorSpec(prefix + "pwconv2.weight", (dim, intermediate), _fan_in(1.0, intermediate)),
        TensorSpec(prefix + "pwconv2.bias", (dim,), _BIAS),
    ]


def _conv_stack(prefix: str, c: ConvStackDims) -> list[TensorSpec]:
    """DVAEDecoder(idim, odim, n_layer, bn_dim, hidden): conv_in, ConvNeXt blocks, conv_out."""
    specs = [
        TensorSpec(prefix + "conv_in.0.weight", (c.bn_dim, c.idim, 3), _fan_in(GELU_GAIN, c.idim * 3)),
        TensorSpec(prefix + "conv_in.0.bias", (c.bn_dim,), _BIAS),
        TensorSpec(prefix + "conv_in.2.weight", (c.hidden, c.bn_dim, 3), _fan_in(1.0, c.bn_dim * 3)),
        TensorSpec(prefix + "conv_in.2.bias", (c.hidden,), _BIAS),
    ]
    for n in range(c.n_layer):
        specs += _convnext_block(f"{prefix}decoder_block.{n}.", c.hidden, c.hidden * 4)
    specs.append(TensorSpec(prefix + "conv_out.weight", (c.odim, c.hidden, 1), _fan_in(1.0, c.hidden)))
    return specs


def _mel_buffers(prefix: str, d: Dims) -> list[TensorSpec]:
    """torchaudio.transforms.MelSpectrogram buffers (both are in the state_dict)."""
    n_freqs = d.n_fft // 2 + 1
    return [
        TensorSpec(prefix + "spectrogram.window", (d.n_fft,), Init("hann")),
        TensorSpec(
            prefix + "mel_scale.fb",
            (n_freqs, d.n_mels),
            Init("mel_fb", sample_rate=d.sample_rate, n_fft=d.n_fft),
        ),
    ]


_COEF = Init("lognormal", center=1.0, sigma=0.1)


def dvae_inventory(d: Dims) -> list[TensorSpec]:
    """DVAE.safetensors: DVAE(decoder, encoder, vq, dim=dvae.decoder.idim) with its `coef`."""
    dim = d.dvae_dim
    group_dim = d.vq_dim // d.vq_groups
    codebook_dim = len(d.vq_levels)
    specs = [
        TensorSpec("coef", (1, d.n_mels, 1), _COEF),
        TensorSpec("downsample_conv.0.weight", (dim, d.n_mels, 3), _fan_in(GELU_GAIN, d.n_mels * 3)),
        TensorSpec("downsample_conv.0.bias", (dim,), _BIAS),
        TensorSpec("downsample_conv.2.weight", (dim, dim, 4), _fan_in(GELU_GAIN, dim * 4)),
        TensorSpec("downsample_conv.2.bias", (dim,), _BIAS),
    ]
    specs += _mel_buffers("preprocessor_mel.mel_spec.", d)
    specs += _conv_stack("encoder.", d.dvae_encoder)
    specs += _conv_stack("decoder.", d.dvae_decoder)
    specs.append(TensorSpec("out_conv.weight", (d.n_mels, dim, 3), _fan_in(1.0, dim * 3)))
    # GroupedResidualFSQ: one ResidualFSQ per group, with a projection in/out of the FSQ codebook
    # dimension (len(levels)); the FSQ's own buffers are not persistent.
    for g in range(d.vq_groups):
        p = f"vq_layer.quantizer.rvqs.{g}."
        specs += [
            TensorSpec(p + "project_in.weight", (codebook_dim, group_dim), _fan_in(1.5, group_dim)),
            TensorSpec(p + "project_in.bias", (codebook_dim,), _normal(0.1)),
            TensorSpec(p + "project_out.weight", (group_dim, codebook_dim), _fan_in(1.0, codebook_dim)),
            TensorSpec(p + "project_out.bias", (group_dim,), _BIAS),
        ]
    return specs


def decoder_inventory(d: Dims) -> list[TensorSpec]:
    """Decoder.safetensors: DVAE(decoder only, dim=decoder.idim): GPT hidden states -> mel."""
    specs = [TensorSpec("coef", (1, d.n_mels, 1), _COEF)]
    specs += _conv_stack("decoder.", d.decoder)
    specs.append(TensorSpec("out_conv.weight", (d.n_mels, d.decoder_dim, 3), _fan_in(1.0, d.decoder_dim * 3)))
    return specs


# --- Vocos (vocos 0.1.0: MelSpectrogramFeatures, VocosBackbone, ISTFTHead) ----------------------


def vocos_inventory(d: Dims) -> list[TensorSpec]:
    dim, inter = d.vocos_dim, d.vocos_intermediate_dim
    specs = _mel_buffers("feature_extractor.mel_spec.", d)
    specs += [
        TensorSpec("backbone.embed.weight", (dim, d.n_mels, 7), _fan_in(1.0, d.n_mels * 7)),
        TensorSpec("backbone.embed.bias", (dim,), _BIAS),
        TensorSpec("backbone.norm.weight", (dim,), _gain()),
        TensorSpec("backbone.norm.bias", (dim,), _LN_BIAS),
    ]
    for n in range(d.vocos_num_layers):
        p = f"backbone.convnext.{n}."
        block = _convnext_block(p, dim, inter)
        # vocos names the layer scale `gamma` and registers it first
        specs += [TensorSpec(p + "gamma", (dim,), _LAYER_SCALE)] + block[1:]
    out_dim = d.n_fft + 2
    specs += [
        TensorSpec("backbone.final_layer_norm.weight", (dim,), _gain()),
        TensorSpec("backbone.final_layer_norm.bias", (dim,), _LN_BIAS),
        # Log-magnitude rows vary by ~0.4 around a spectral tilt (loud lows, quiet highs);
        # phase rows are broad so phases look random.
        TensorSpec(
            "head.out.weight",
            (out_dim, dim),
            Init("istft_head_weight", std=0.4 / math.sqrt(dim), std2=3.0 / math.sqrt(dim)),
        ),
        TensorSpec("head.out.bias", (out_dim,), Init("istft_head_bias", high=2.5, low=-3.0, std=0.3)),
        TensorSpec("head.istft.window", (d.n_fft,), Init("hann")),
    ]
    return specs


def checkpoint_inventory(d: Dims) -> dict[str, list[TensorSpec]]:
    """Every tensor file of the asset folder -> its tensors (ChatTTS's strict-load state_dicts)."""
    return {
        GPT_FILE: gpt_inventory(d),
        EMBED_FILE: embed_inventory(d),
        DVAE_FILE: dvae_inventory(d),
        DECODER_FILE: decoder_inventory(d),
        VOCOS_FILE: vocos_inventory(d),
    }


def inventory_table(d: Dims) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    """{file: {tensor name: (shape, dtype)}}: what verify compares safetensors headers against."""
    return {f: {s.name: (s.shape, s.dtype) for s in specs} for f, specs in checkpoint_inventory(d).items()}


def inventory_summary(d: Dims) -> dict[str, Any]:
    """Tensor count, parameter count and bytes per file (for `checkpoint inspect`)."""
    out: dict[str, Any] = {}
    for f, specs in checkpoint_inventory(d).items():
        out[f] = {
            "tensors": len(specs),
            "numel": sum(s.numel for s in specs),
            "bytes": sum(s.nbytes for s in specs),
        }
    return out
