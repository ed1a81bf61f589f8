"""Export-friendly wrappers around ChatTTS's own PyTorch modules.

Each wrapper computes exactly what ChatTTS computes at inference, with the same weights, but in a
form the TorchScript ONNX exporter traces into a graph with dynamic shapes:

- `EmbedForExport`: ChatTTS `Embed.forward` without boolean-mask indexing (data-dependent shapes).
- `GptStepForExport`: one `LlamaModel` call with a key/value cache passed as plain tensors. The
  attention mask is built here as an explicit 4-D additive mask (causal + left padding), so no
  data-dependent branch of transformers' mask code is frozen by the example inputs at trace time.
- `HeadCodeForExport` / `HeadTextForExport`: weight norm folded into plain weights; the 4 code
  heads are one MatMul.
- `MelDecoderForExport`: ChatTTS `DVAE.forward` decode path (for both the `Decoder` and the
  `DVAE`), without the `torch.mul(..., out=)` that the TorchScript exporter rejects.
- `DvaeEncoderForExport`: ChatTTS `DVAE.forward(wav, "encode")` (what `Chat.sample_audio_speaker`
  runs): the log-mel front end with `torch.stft` replaced by one Conv1d whose kernel is the windowed
  real DFT (reflect padding, Hann window, magnitude, torchaudio's mel filterbank), the
  downsampling convs, the encoder stack and the grouped residual FSQ, computed with the quantizer
  library's own `quantize`/`codes_to_indices` but without its einops pack/unpack.
- `VocosForExport`: `vocos.decode` with the ISTFT (`torch.istft`, center=True, Hann window)
  replaced by one ConvTranspose1d whose kernel is the windowed inverse real DFT (it does the
  inverse DFT and the overlap-add at once), then the window-envelope normalisation and the
  center trim.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer


class EmbedForExport(nn.Module):
    """input_ids [B, S, num_vq] int64, text_mask [B, S] bool -> inputs_embeds [B, S, hidden]."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.emb_text = embed.emb_text
        self.emb_code = embed.emb_code
        self.num_vq = int(embed.num_vq)

    def forward(self, input_ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        # Every position goes through both tables; ids of the other kind are clamped to 0 so that
        # Gather never reads out of range (text ids exceed the 626-entry code tables).
        mask = text_mask.unsqueeze(-1)
        text_ids = torch.where(text_mask, input_ids[..., 0], torch.zeros_like(input_ids[..., 0]))
        code_ids = torch.where(mask, torch.zeros_like(input_ids), input_ids)
        emb_text = self.emb_text(text_ids)
        emb_code = self.emb_code[0](code_ids[..., 0])
        for i in range(1, self.num_vq):
            emb_code = emb_code + self.emb_code[i](code_ids[..., i])
        return torch.where(mask, emb_text, emb_code)


def build_cache(past: list[torch.Tensor]) -> DynamicCache:
    """A DynamicCache holding the given [key0, value0, key1, value1, ...] tensors as they are.

    Built layer by layer (not through the constructor) so that the first update is a plain
    Concat(past, new) and no empty 1-D placeholder tensor enters the traced graph.
    """
    layers = []
    for i in range(0, len(past), 2):
        layer = DynamicLayer()
        layer.keys = past[i]
        layer.values = past[i + 1]
        layer.device = past[i].device
        layer.is_initialized = True
        layers.append(layer)
    cache = DynamicCache()
    cache.layers = layers
    return cache


# Added to the scores of keys a query must not see. Not -inf/float32-min: -1e4 still gives those keys
# an exact 0 weight in float32 (exp underflows), but stays finite when the graph runs in FP16, where
# a fully masked (left-padding) row would otherwise turn into -inf and NaN.
MASK_VALUE = -1.0e4


def additive_attention_mask(
    attention_mask: torch.Tensor, seq_len: torch.Tensor | int, dtype: torch.dtype
) -> torch.Tensor:
    """[B, P+S] 0/1 padding mask -> [B, 1, S, P+S] additive mask (0 keep, MASK_VALUE drop).

    Query s sits at absolute position P+s and sees keys k <= P+s that are not padding, as the
    causal + padding mask of transformers does. Rows with nothing to see (left padding) get a
    finite uniform softmax instead of NaN; they are padding and never seen by a real position.
    """
    total = attention_mask.shape[1]
    past = total - seq_len
    key_pos = torch.arange(total, device=attention_mask.device)
    query_pos = torch.arange(seq_len, device=attention_mask.device) + past
    causal = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)  # [S, P+S]
    keep = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)  # [B, S, P+S]
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    drop = torch.full((), MASK_VALUE, dtype=dtype, device=attention_mask.device)
    return torch.where(keep, zero, drop).unsqueeze(1)


class GptStepForExport(nn.Module):
    """One GPT forward with a KV cache, as ChatTTS's `GPT.generate` runs it at every step.

    Inputs: inputs_embeds [B, S, H], attention_mask int64 [B, P+S], position_ids int64 [B, S],
    then past key/value tensors [B, kv_heads, P, head_dim] for every layer (key, value, key, ...).
    Outputs: last_hidden_state [B, S, H], then present key/value [B, kv_heads, P+S, head_dim].
    """

    def __init__(self, llama: nn.Module) -> None:
        super().__init__()
        self.llama = llama
        self.num_layers = int(llama.config.num_hidden_layers)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cache = build_cache(list(past))
        mask = additive_attention_mask(attention_mask, inputs_embeds.shape[1], inputs_embeds.dtype)
        out = self.llama(
            inputs_embeds=inputs_embeds,
            attention_mask=mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )
        presents: list[torch.Tensor] = []
        for layer in cache.layers:
            presents.extend((layer.keys, layer.values))
        return (out.last_hidden_state, *presents)


def folded_weight(linear: nn.Module) -> torch.Tensor:
    """The effective weight of a (possibly weight-normed) Linear: g * v / ||v||, as a plain tensor."""
    with torch.no_grad():
        return linear.weight.detach().clone().float()


class HeadCodeForExport(nn.Module):
    """hidden_states [B, H] -> logits [B, num_vq, num_audio_tokens]; the num_vq heads in one MatMul."""

    def __init__(self, head_code: nn.ModuleList) -> None:
        super().__init__()
        weights = [folded_weight(h) for h in head_code]
        self.num_vq = len(weights)
        self.num_tokens = int(weights[0].shape[0])
        # [H, num_vq * A] so the graph is a single MatMul (what quantizers look for).
        self.register_buffer("weight_t", torch.cat(weights, 0).t().contiguous())

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = torch.matmul(hidden_states, self.weight_t)
        return logits.reshape(hidden_states.shape[0], self.num_vq, self.num_tokens)


class HeadTextForExport(nn.Module):
    """hidden_states [B, H] -> logits [B, num_text_tokens]."""

    def __init__(self, head_text: nn.Module) -> None:
        super().__init__()
        self.register_buffer("weight_t", folded_weight(head_text).t().contiguous())

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.matmul(hidden_states, self.weight_t)


class GfsqLookup(nn.Module):
    """ChatTTS `GFSQ._embed` (GroupedResidualFSQ.get_output_from_indices) as table lookups.

    codes [B, G*R, T] int64 -> features [B, dim, T]. Per group: sum over residual levels of
    `codebook[level][index] * scale[level]`, then the group's `project_out`; groups concatenated
    on the feature axis. The library's einops pack/unpack would freeze shapes when traced.
    """

    def __init__(self, gfsq: nn.Module) -> None:
        super().__init__()
        self.groups = int(gfsq.G)
        self.residuals = int(gfsq.R)
        rvqs = gfsq.quantizer.rvqs
        tables = []
        with torch.no_grad():
            for rvq in rvqs:
                # [R, n_codes, codebook_dim], scaled as get_codes_from_indices scales them
                tables.append((rvq.codebooks * rvq.scales.unsqueeze(1)).detach().clone())
        self.register_buffer("tables", torch.stack(tables))  # [G, R, n_codes, codebook_dim]
        self.project_out = nn.ModuleList([rvq.project_out for rvq in rvqs])

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = codes.transpose(1, 2)  # [B, T, G*R]
        feats = []
        for g in range(self.groups):
            summed = self.tables[g, 0][x[..., g * self.residuals]]
            for r in range(1, self.residuals):
                summed = summed + self.tables[g, r][x[..., g * self.residuals + r]]
            feats.append(self.project_out[g](summed))
        return torch.cat(feats, -1).transpose(1, 2)


class MelDecoderForExport(nn.Module):
    """ChatTTS `DVAE.forward(inp, "decode")` for the Decoder (hidden states) or the DVAE (codes).

    Decoder: hidden_states [B, hidden, T] float -> mel [B, n_mels, 2T].
    DVAE:    codes [B, num_vq, T] int64 -> mel [B, n_mels, 2T] (GFSQ codebook lookup first).
    """

    def __init__(self, dvae: nn.Module) -> None:
        super().__init__()
        self.vq_lookup = GfsqLookup(dvae.vq_layer) if dvae.vq_layer is not None else None
        self.decoder = dvae.decoder
        self.out_conv = dvae.out_conv
        self.register_buffer("coef", dvae.coef.detach().clone())

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        vq_feats = self.vq_lookup(inp) if self.vq_lookup is not None else inp
        b, c, t = vq_feats.shape
        vq_feats = vq_feats.view(b, 2, c // 2, t).permute(0, 2, 3, 1).flatten(2)
        dec_out = self.out_conv(self.decoder(x=vq_feats))
        # ChatTTS: torch.mul(dec_out, self.coef, out=dec_out); the out= form breaks TorchScript export.
        return dec_out * self.coef


def _istft_kernel(n_fft: int, window: torch.Tensor) -> torch.Tensor:
    """ConvTranspose1d weight [2K, 1, n_fft]: windowed inverse real DFT (irfft, norm="backward").

    Input channels are the K = n_fft/2 + 1 real parts followed by the K imaginary parts. Like
    irfft (C2R), the imaginary parts of the DC and Nyquist bins are ignored (their sine is 0).
    Built in float64 and rounded once.
    """
    k_bins = n_fft // 2 + 1
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(k_bins, dtype=torch.float64)
    angle = 2.0 * math.pi * torch.outer(k, n) / n_fft  # [K, N]
    scale = torch.full((k_bins, 1), 2.0, dtype=torch.float64)
    scale[0] = 1.0
    if n_fft % 2 == 0:
        scale[-1] = 1.0
    cos_part = scale * torch.cos(angle) / n_fft
    sin_part = -scale * torch.sin(angle) / n_fft
    sin_part[0] = 0.0
    if n_fft % 2 == 0:
        sin_part[-1] = 0.0
    w = window.to(torch.float64).unsqueeze(0)
    kernel = torch.cat([cos_part * w, sin_part * w], 0)  # [2K, N]
    return kernel.unsqueeze(1).float()


class VocosForExport(nn.Module):
    """mel [B, n_mels, F] -> waveform [B, hop * (F - 1)], equal to `vocos.decode` (center ISTFT)."""

    def __init__(self, vocos: nn.Module) -> None:
        super().__init__()
        head = vocos.head
        istft = head.istft
        if getattr(istft, "padding", "center") != "center":
            raise ValueError("only the center-padded ISTFT (ChatTTS's Vocos config) is supported")
        self.backbone = vocos.backbone
        self.out = head.out
        self.n_fft = int(istft.n_fft)
        self.hop_length = int(istft.hop_length)
        window = istft.window.detach().float()
        if window.shape[0] != self.n_fft:
            raise ValueError("win_length != n_fft is not supported")
        self.register_buffer("kernel", _istft_kernel(self.n_fft, window))
        self.register_buffer("window_sq", window.square().view(1, 1, -1).contiguous())

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.backbone(mel)
        x = self.out(x).transpose(1, 2)
        mag, phase = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        spec = torch.cat([mag * torch.cos(phase), mag * torch.sin(phase)], 1)  # [B, 2K, F]
        frames_sum = nn.functional.conv_transpose1d(spec, self.kernel, stride=self.hop_length)  # [B, 1, L]
        ones = torch.ones_like(spec[:, :1, :])
        envelope = nn.functional.conv_transpose1d(ones, self.window_sq, stride=self.hop_length)
        pad = self.n_fft // 2
        total = frames_sum.shape[-1]
        y = frames_sum[:, 0, pad : total - pad] / envelope[:, 0, pad : total - pad]
        return y


def _stft_kernel(n_fft: int, window: torch.Tensor) -> torch.Tensor:
    """Conv1d weight [2K, 1, n_fft]: windowed forward real DFT (K = n_fft/2 + 1 real rows, then K
    imaginary rows), as `torch.stft(..., onesided=True, normalized=False)`. Built in float64."""
    k_bins = n_fft // 2 + 1
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(k_bins, dtype=torch.float64)
    angle = 2.0 * math.pi * torch.outer(k, n) / n_fft  # [K, N]
    w = window.to(torch.float64).unsqueeze(0)
    kernel = torch.cat([torch.cos(angle) * w, -torch.sin(angle) * w], 0)
    return kernel.unsqueeze(1).float()


class LogMelForExport(nn.Module):
    """ChatTTS `MelSpectrogramFeatures` (torchaudio MelSpectrogram, center=True, power=1, then
    log(clip(mel, 1e-5))): wav [B, samples] -> log-mel [B, n_mels, samples // hop + 1]."""

    def __init__(self, features: nn.Module) -> None:
        super().__init__()
        spec = features.mel_spec.spectrogram
        if not spec.center or spec.pad_mode != "reflect" or spec.power != 1.0 or spec.normalized:
            raise ValueError("only ChatTTS's mel front end (center, reflect, power 1, unnormalized) is supported")
        self.n_fft = int(spec.n_fft)
        self.hop_length = int(spec.hop_length)
        window = spec.window.detach().float()
        if window.shape[0] != self.n_fft:
            raise ValueError("win_length != n_fft is not supported")
        self.register_buffer("kernel", _stft_kernel(self.n_fft, window))
        self.register_buffer("fb", features.mel_spec.mel_scale.fb.detach().float().clone())  # [K, n_mels]

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        pad = self.n_fft // 2
        x = nn.functional.pad(wav.unsqueeze(1), (pad, pad), mode="reflect")
        spec = nn.functional.conv1d(x, self.kernel, stride=self.hop_length)  # [B, 2K, F]
        re, im = spec.chunk(2, dim=1)
        mag = torch.sqrt(re * re + im * im)
        mel = torch.matmul(mag.transpose(1, 2), self.fb).transpose(1, 2)
        return torch.log(torch.clip(mel, min=1e-5))


class GfsqIndices(nn.Module):
    """ChatTTS `GFSQ.forward` (GroupedResidualFSQ -> indices): features [B, dim, T] -> codes
    [B, G*R, T] int64, code row g*R + r = group g, residual level r (ChatTTS's layout)."""

    def __init__(self, gfsq: nn.Module) -> None:
        super().__init__()
        self.groups = int(gfsq.G)
        self.rvqs = gfsq.quantizer.rvqs
        for rvq in self.rvqs:
            if any(getattr(layer, "orthogonal_rotation", False) for layer in rvq.layers):
                raise ValueError("FSQ with orthogonal rotation is not supported")

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = feats.transpose(1, 2)  # [B, T, dim]
        codes = []
        for g, chunk in enumerate(x.chunk(self.groups, dim=-1)):
            rvq = self.rvqs[g]
            z = rvq.project_in(chunk)
            if rvq.soft_clamp_input_value is not None:
                z = (z / rvq.soft_clamp_input_value).tanh() * rvq.soft_clamp_input_value
            residual = z
            for layer, scale in zip(rvq.layers, rvq.scales, strict=True):
                quantized = layer.quantize(layer.project_in(residual / scale))
                codes.append(layer.codes_to_indices(quantized).long())
                residual = residual - quantized * scale
        return torch.stack(codes, 1)  # [B, G*R, T]


class DvaeEncoderForExport(nn.Module):
    """ChatTTS `DVAE.forward(wav, "encode")`: wav [B, samples] float -> codes [B, num_vq, T] int64
    (T = (samples // hop + 1) // 2), plus the encoder's features [B, vq_dim, T] before the quantizer."""

    def __init__(self, dvae: nn.Module) -> None:
        super().__init__()
        if getattr(dvae, "encoder", None) is None or dvae.vq_layer is None:
            raise ValueError("this DVAE has no encoder/quantizer (ChatTTS's Chat.dvae has both)")
        self.mel = LogMelForExport(dvae.preprocessor_mel)
        self.downsample_conv = dvae.downsample_conv
        self.encoder = dvae.encoder
        self.quantizer = GfsqIndices(dvae.vq_layer)
        self.register_buffer("coef", dvae.coef.detach().clone())  # [1, n_mels, 1]

    def forward(self, wav: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mel = self.mel(wav)
        feats = self.encoder(self.downsample_conv(mel / self.coef))
        return self.quantizer(feats), feats
