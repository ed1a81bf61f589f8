"""Voice cloning on an artifact: a recording checked as ChatTTS takes it, encoded into audio codes by
the artifact's `dvae_encoder.onnx` (ChatTTS's `DVAE.sample_audio`), and a `spk_smp` string's codes
checked against the model. `Pipeline` answers with these (`pipe.check_recording`, `pipe.encode_audio`,
`pipe.sample_audio_speaker`, `pipe.speaker_sample_codes`).
"""

from __future__ import annotations

import numpy as np

from chattts_forge.artifact import DVAE_ENCODER
from chattts_forge.checkpoint.layout import Dims
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.runtime.chattts_speaker import decode_prompt
from chattts_forge.runtime.loaded_artifact import LoadedArtifact


def max_recording_samples(dims: Dims) -> int:
    """The longest voice-clone recording accepted: its codes (one per 2 hops) must fit the positions."""
    return 2 * dims.hop_length * dims.max_position_embeddings


def check_recording(wav: object, dims: Dims, what: str = "wav") -> np.ndarray:
    """A recording as ChatTTS's `sample_audio_speaker` takes it: 1-D float samples at the model's
    rate (24 kHz), at least n_fft/2 + 1 long. float64/float16 are cast to float32 (ChatTTS needs
    float32); anything else is a one-line ForgeError naming `what`."""
    try:
        arr = np.asarray(wav)
    except Exception as e:  # e.g. a CUDA tensor: numpy cannot read it
        raise BadInput(f"{what} must be a numpy array (or CPU tensor) of samples: {e}") from None
    if arr.ndim != 1:
        raise BadInput(
            f"{what} must be 1-D [samples] (one mono {dims.sample_rate} Hz recording), got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.floating):
        hint = " (divide int16 PCM by 32768)" if np.issubdtype(arr.dtype, np.integer) else ""
        raise ForgeError(f"{what} must hold float samples in [-1, 1], got dtype {arr.dtype}{hint}")
    if arr.size == 0:
        raise BadInput(f"{what} is empty")
    longest = max_recording_samples(dims)
    if arr.size > longest:
        raise BadInput(f"{what} has {arr.size} samples ({arr.size / dims.sample_rate:.1f} s); its codes would "
                       f"not fit the model's {dims.max_position_embeddings} positions (at most {longest})")
    shortest = dims.n_fft // 2 + 1
    if arr.size < shortest:
        raise BadInput(f"{what} has {arr.size} samples; the encoder needs at least {shortest}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(arr)):
        raise ForgeError(f"{what} holds NaN or infinite samples")
    return arr


def encode_audio(artifact: LoadedArtifact, wav: object) -> np.ndarray:
    """ChatTTS's `DVAE.sample_audio`: a recording [samples] -> audio codes int64 [num_vq, T]."""
    arr = check_recording(wav, artifact.dims)
    if not artifact.has_component(DVAE_ENCODER):
        raise ForgeError(
            f"artifact {artifact.path} has no {DVAE_ENCODER}.onnx (converted before voice "
            "cloning existed): convert the checkpoint again to make speakers from recordings"
        )
    return artifact.session(DVAE_ENCODER).run(["codes"], {"wav": arr[None]})[0][0]


def speaker_sample_codes(spk_smp: str, dims: Dims) -> np.ndarray:
    """A `spk_smp` string -> codes [num_vq, T], checked against the model (ForgeError naming spk_smp)."""
    num_vq, eos_code = dims.num_vq, dims.num_audio_tokens - 1
    try:  # a prompt longer than the model's positions could never be fed: the decode stops there
        codes = decode_prompt(spk_smp, max_codes=num_vq * dims.max_position_embeddings)
    except ForgeError as e:
        raise ForgeError(f"spk_smp: {e}") from None
    if codes.shape[0] != num_vq or codes.shape[1] == 0:
        raise BadInput(
            f"spk_smp holds codes of shape {codes.shape}, this model takes [{num_vq}, T > 0] "
            "(a sample string from another model?)"
        )
    if codes.max() >= eos_code:
        raise ForgeError(
            f"spk_smp holds code {int(codes.max())}, this model's codes are < {eos_code} "
            "(a sample string from another model?)"
        )
    return codes
