"""Deliberate audio damage (numpy only), to show that the ASR scores track intelligibility.

- `white_noise(audio, snr_db, seed)`: additive Gaussian white noise at a given SNR;
- `bit_crush(audio, bits)`: requantize to `bits` bits (a uniform mid-tread quantizer);
- `time_stretch(audio, rate)`: phase-vocoder tempo change (pitch kept); rate > 1 is faster.

`DEGRADATIONS` maps a name to a one-argument function with a harsh default setting (no hard
clipping: see there).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from chattts_forge.errors import BadInput


def white_noise(audio: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    power = float(np.mean(audio.astype(np.float64) ** 2)) or 1e-12
    noise = np.random.default_rng(seed).standard_normal(audio.shape) * np.sqrt(power / 10 ** (snr_db / 10))
    return (audio + noise).astype(np.float32)


def bit_crush(audio: np.ndarray, bits: int) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    peak = float(np.max(np.abs(audio))) or 1.0
    levels = 2 ** (bits - 1) - 0.5
    return (np.round(audio / peak * levels) / levels * peak).astype(np.float32)


def time_stretch(audio: np.ndarray, rate: float, n_fft: int = 512, hop: int = 128) -> np.ndarray:
    """Phase-vocoder time stretch: output is about len(audio) / rate samples long."""
    audio = np.asarray(audio, dtype=np.float64)
    window = np.hanning(n_fft)
    padded = np.pad(audio, (n_fft, n_fft))
    n_frames = 1 + (len(padded) - n_fft) // hop
    frames = np.stack([padded[i * hop : i * hop + n_fft] * window for i in range(n_frames)])
    spec = np.fft.rfft(frames, axis=1)
    steps = np.arange(0, n_frames - 1, rate)
    expected = 2 * np.pi * hop * np.arange(spec.shape[1]) / n_fft
    phase = np.angle(spec[0])
    out_len = n_fft + hop * len(steps)
    out = np.zeros(out_len)
    norm = np.zeros(out_len)
    for k, t in enumerate(steps):
        i = int(t)
        frac = t - i
        mag = (1 - frac) * np.abs(spec[i]) + frac * np.abs(spec[i + 1])
        frame = np.fft.irfft(mag * np.exp(1j * phase), n=n_fft) * window
        out[k * hop : k * hop + n_fft] += frame
        norm[k * hop : k * hop + n_fft] += window**2
        # Advance the phase by the measured instantaneous frequency between the two source frames.
        delta = np.angle(spec[i + 1]) - np.angle(spec[i]) - expected
        delta -= 2 * np.pi * np.round(delta / (2 * np.pi))
        phase = phase + expected + delta
    out /= np.maximum(norm, 1e-8)
    trim = int(n_fft / rate)
    return out[trim : trim + int(len(audio) / rate)].astype(np.float32)


# Hard clipping is not among them: even infinitely clipped speech stays largely intelligible
# (Licklider and Pollack, 1948), and Whisper base read the Mandarin set clipped at 0.5% of the peak
# at CER 0.083 on one CPU (AVX-512 VNNI) and above 0.1 on another: not a harsh damage.
DEGRADATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "noise": lambda a: white_noise(a, snr_db=-5.0),
    "bitcrush": lambda a: bit_crush(a, bits=2),
    "stretch": lambda a: time_stretch(a, rate=2.5),
}


def damage_quantization_scales(src_dir: str | Path, out_dir: str | Path, factor: float = 3.0) -> list[str]:
    """Copy of a quantized artifact whose weight-quantization scales are multiplied by `factor`.

    Every constant float initializer named ``*_scale``/``*_scales`` (onnxruntime's names for
    dynamic-INT8 weight scales, QDQ scales and MatMulNBits block scales) in every ONNX file is
    scaled; artifact.json's per-component sha256/bytes are updated so the copy is a consistent
    (but badly built) artifact, which only the quality gate can catch. Returns the damaged files.
    """
    import onnx
    from onnx import numpy_helper

    from chattts_forge.artifact import ArtifactMeta
    from chattts_forge.fsutil import atomic_output_dir
    from chattts_forge.graph_storage import write_component

    src, out = Path(src_dir), Path(out_dir)
    damaged: list[str] = []
    with atomic_output_dir(out) as tmp:
        for f in sorted(src.iterdir()):
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        meta = ArtifactMeta.load(tmp)
        for name, comp in sorted(meta.components.items(), key=lambda item: str(item[1].get("file", ""))):
            path = meta.component_path(tmp, name)
            if not path.is_file():
                continue
            model = onnx.load(str(path))
            changed = 0
            for init in model.graph.initializer:
                if (init.name.endswith("_scale") or init.name.endswith("_scales")) and init.data_type in (
                    onnx.TensorProto.FLOAT,
                    onnx.TensorProto.FLOAT16,
                ):
                    arr = numpy_helper.to_array(init)
                    init.CopyFrom(numpy_helper.from_array((arr * factor).astype(arr.dtype), init.name))
                    changed += 1
            if changed:  # stored, hashed and recorded as every stage writes a graph
                meta.components[name] = write_component(model, tmp, name, comp)
                damaged.append(path.name)
        if not damaged:
            raise BadInput(f"{src} has no quantization scales to damage (is it a quantized artifact?)")
        meta.variant = f"{meta.variant}-damaged-x{factor:g}"
        meta.write(tmp)
    return damaged
