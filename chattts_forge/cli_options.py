"""Help texts shared by several commands' declared options: the provider, --speaker and
--decoder/--dvae (declared on the configs of `reference`, `synth`, `warm` and `serve`).

The commands expose the knobs ChatTTS users know with ChatTTS's InferCodeParams defaults, declared
once on `chattts_defaults.CodeKnobs` (the base of their configs); one definition keeps their names
and defaults identical, which the parity checks between them rely on.
"""

from __future__ import annotations

PROVIDER_HELP = "onnxruntime provider: cpu, cuda (an error when no usable GPU) or auto (CUDA if usable, else CPU)."
SPEAKER_HELP = "ChatTTS speaker string, a file holding one, or 'random' (sampled with --seed). Default: none."
DECODER_HELP = "Mel from GPT hidden states (Decoder) or from the codes (DVAE)."
