"""Speaker similarity (SIM): a GE2E speaker encoder run in numpy, and cosine similarity of its embeddings.

The weights are resemblyzer 0.1.4's ``pretrained.pt`` (Apache-2.0, from its PyPI wheel; install it
with ``pip install --no-deps resemblyzer==0.1.4``: its declared dependencies include torch and a
``typing`` backport that breaks Python 3.11, and only the weights file is used). The file is a legacy
(pre-zip) ``torch.save`` pickle; `read_torch_legacy_state` reads it without torch, so evaluate stays
torch-free.

The model (GE2E, Wan et al. 2018): 40-band mel power spectrogram at 16 kHz (25 ms window, 10 ms
hop), a 3-layer LSTM of 256 units over 160-frame (1.6 s) partial utterances, the last hidden state
through a 256x256 linear layer and a ReLU, L2-normalised. An utterance's embedding is the
L2-normalised mean of its partials' embeddings, partials starting every 77 frames (resemblyzer's
``rate=1.3`` per second) and the last one kept if it covers at least 75% of its frames.

Preprocessing follows resemblyzer's ``preprocess_wav`` with one documented deviation: volume is
raised (never lowered) to -30 dBFS, then long silences are cut with the same window/smoothing/
dilation scheme (30 ms windows, moving average of 8, dilation of 7 windows), but the per-window
speech decision is an energy threshold instead of webrtcvad's classifier (a C extension we do not
take on for this). docs/measurements/2026-12-01-xeon/scorers.md compares the two.

Library: `SpeakerEncoder.load()`, `.embed(audio, sample_rate)` -> float32 (256,),
`.embed_many([(audio, sample_rate), ...])` -> (n, 256); `similarity(a, b)` (cosine);
`pooled_reference(embeddings)` (mean, re-normalised: resemblyzer's ``embed_speaker``).
"""

from __future__ import annotations

import functools
import os
import pickle
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.evaluate.asr import mono_at
from chattts_forge.evaluate.melspec import mel_power
from chattts_forge.fsutil import installed_file, recorded_installed_file
from chattts_forge.integrity import sha256_file

__all__ = [
    "SpeakerEncoder",
    "similarity",
    "pooled_reference",
    "preprocess",
    "find_weights",
    "read_torch_legacy_state",
    "EMBEDDING_SIZE",
]

WEIGHTS_DISTRIBUTION = "resemblyzer"
WEIGHTS_PATH_IN_WHEEL = "resemblyzer/pretrained.pt"
INSTALL_HINT = "pip install --no-deps resemblyzer==0.1.4"

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
PARTIAL_FRAMES = 160  # 1.6 s
PARTIAL_RATE = 1.3  # partials per second: one every round(16000 / 1.3 / 160) = 77 frames
MIN_COVERAGE = 0.75
HIDDEN = 256
LAYERS = 3
EMBEDDING_SIZE = 256
TARGET_DBFS = -30.0
VAD_WINDOW = 480  # 30 ms
VAD_AVERAGE_WIDTH = 8
VAD_MAX_SILENCE = 6
# A window is speech when its energy is within this many dB of the loudest window and above an
# absolute floor (after volume normalisation): what stands in for webrtcvad's decision.
VAD_RELATIVE_DB = 40.0
VAD_FLOOR_DBFS = -70.0


# ---------------------------------------------------------------- torch-free reader of the weights


class _StorageType:
    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype


class _LazyTensor:
    """A tensor whose storage bytes come after the pickle that describes it (legacy format)."""

    def __init__(self, storage: dict[str, Any], offset: int, size: tuple[int, ...], stride: tuple[int, ...]):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def materialise(self) -> np.ndarray:
        data = self.storage["data"]
        if data is None:
            raise BadInput("torch checkpoint: a tensor's storage was never written")
        item = data.itemsize
        view = np.lib.stride_tricks.as_strided(
            data[self.offset :], shape=self.size, strides=tuple(s * item for s in self.stride)
        )
        return np.array(view)  # own, contiguous copy


_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, *_):
    return _LazyTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *_):
    return data


class _LegacyUnpickler(pickle.Unpickler):
    """Resolves only what a torch state dict needs; any other global is refused (no code runs)."""

    def __init__(self, file, storages: dict[str, dict[str, Any]]) -> None:
        super().__init__(file)
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(np.dtype(_STORAGE_DTYPES[name]))
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a weights file")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
        _, storage_type, key, _location, numel = pid[:5]
        if key not in self.storages:
            self.storages[key] = {"dtype": storage_type.dtype, "numel": int(numel), "data": None}
        return self.storages[key]


def read_torch_legacy_state(path: str | os.PathLike[str], key: str = "model_state") -> dict[str, np.ndarray]:
    """The tensors of ``checkpoint[key]`` in a legacy (non-zip) ``torch.save`` file, as numpy arrays.

    Layout: five pickles (magic number, protocol version, system info, the object with storages as
    persistent ids, the list of storage keys), then each storage as an int64 element count and raw
    little-endian bytes, in the order of that list.
    """
    path = Path(path)
    storages: dict[str, dict[str, Any]] = {}
    try:
        with path.open("rb") as f:
            magic = pickle.load(f)
            if magic != 0x1950A86A20F9469CFC6C:
                raise BadInput(f"{path} is not a legacy torch checkpoint (bad magic number)")
            pickle.load(f)  # protocol version
            sys_info = pickle.load(f)
            if not sys_info.get("little_endian", True):
                raise BadInput(f"{path}: big-endian torch checkpoints are not supported")
            obj = _LegacyUnpickler(f, storages).load()
            keys = pickle.load(f)
            for storage_key in keys:
                storage = storages[storage_key]
                count = int(np.frombuffer(f.read(8), dtype="<i8")[0])
                raw = f.read(count * storage["dtype"].itemsize)
                if len(raw) != count * storage["dtype"].itemsize:
                    raise BadInput(f"{path} is truncated (storage {storage_key})")
                storage["data"] = np.frombuffer(raw, dtype=storage["dtype"].newbyteorder("<"))
    except FileNotFoundError:
        raise ForgeError(f"speaker encoder weights {path} do not exist") from None
    except (pickle.UnpicklingError, EOFError, KeyError, IndexError, ValueError, AttributeError) as e:
        raise BadInput(f"{path} is not a readable torch checkpoint: {e}") from None
    if not isinstance(obj, dict) or key not in obj:
        raise BadInput(f"{path} has no '{key}' entry")
    return {
        name: t.materialise() if isinstance(t, _LazyTensor) else np.asarray(t) for name, t in obj[key].items()
    }


def find_weights() -> Path:
    """resemblyzer's pretrained.pt inside the installed resemblyzer distribution."""
    path = installed_file(WEIGHTS_DISTRIBUTION, WEIGHTS_PATH_IN_WHEEL)
    if path is not None:
        return path
    raise ForgeError(
        f"the speaker encoder weights ({WEIGHTS_PATH_IN_WHEEL} of the resemblyzer wheel) are not installed; "
        f"run: {INSTALL_HINT}"
    )


@functools.lru_cache(maxsize=4)
def _load_weights(path: str) -> dict[str, np.ndarray]:
    state = read_torch_legacy_state(path)
    expected = {
        **{f"lstm.weight_ih_l{k}": (4 * HIDDEN, N_MELS if k == 0 else HIDDEN) for k in range(LAYERS)},
        **{f"lstm.weight_hh_l{k}": (4 * HIDDEN, HIDDEN) for k in range(LAYERS)},
        **{f"lstm.bias_ih_l{k}": (4 * HIDDEN,) for k in range(LAYERS)},
        **{f"lstm.bias_hh_l{k}": (4 * HIDDEN,) for k in range(LAYERS)},
        "linear.weight": (EMBEDDING_SIZE, HIDDEN),
        "linear.bias": (EMBEDDING_SIZE,),
    }
    for name, shape in expected.items():
        if name not in state or state[name].shape != shape:
            got = state[name].shape if name in state else "missing"
            raise BadInput(f"{path} is not a GE2E speaker encoder ({name}: {got}, expected {shape})")
    return {name: state[name].astype(np.float32) for name in expected}


# ---------------------------------------------------------------- preprocessing


def _normalise_volume(wav: np.ndarray) -> np.ndarray:
    rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2))) if wav.size else 0.0
    if rms <= 0.0:
        return wav
    change_db = TARGET_DBFS - 20.0 * np.log10(rms)
    return wav * np.float32(10.0 ** (change_db / 20.0)) if change_db > 0 else wav


def _moving_average(flags: np.ndarray, width: int) -> np.ndarray:
    padded = np.concatenate((np.zeros((width - 1) // 2), flags, np.zeros(width // 2)))
    csum = np.cumsum(padded, dtype=float)
    csum[width:] = csum[width:] - csum[:-width]
    return csum[width - 1 :] / width


def _dilate(mask: np.ndarray, width: int) -> np.ndarray:
    """Binary dilation with a centred structuring element of `width` ones (scipy.ndimage's)."""
    if not mask.any():
        return mask
    kernel = np.ones(width)
    # scipy centres an even-width element one step right of the middle; the width here is odd (7).
    # The centred slice of the full convolution keeps the mask's length: numpy's mode="same" returns
    # max(len, width) values, so a clip of fewer windows than the element grew a longer mask.
    start = (width - 1) // 2
    return np.convolve(mask.astype(float), kernel, mode="full")[start : start + mask.size] > 0


def _trim_long_silences(wav: np.ndarray) -> np.ndarray:
    wav = wav[: wav.shape[0] - wav.shape[0] % VAD_WINDOW]
    if wav.size == 0:
        return wav
    windows = wav.reshape(-1, VAD_WINDOW).astype(np.float64)
    window_db = 10.0 * np.log10(np.mean(windows**2, axis=1) + 1e-20)
    speech = (window_db > window_db.max() - VAD_RELATIVE_DB) & (window_db > VAD_FLOOR_DBFS)
    mask = np.round(_moving_average(speech.astype(float), VAD_AVERAGE_WIDTH)).astype(bool)
    mask = _dilate(mask, VAD_MAX_SILENCE + 1)
    kept = wav[np.repeat(mask, VAD_WINDOW)]
    # Nothing judged speech (silence, or a signal too short for the smoothing): keep it all.
    return kept if kept.size else wav


def preprocess(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 at 16 kHz, volume raised to -30 dBFS, long silences cut (see the module doc)."""
    wav = mono_at(audio, sample_rate, SAMPLE_RATE, "embed")
    return _trim_long_silences(_normalise_volume(wav))


def partial_slices(n_samples: int) -> list[slice]:
    """Mel-frame slices of the partial utterances (resemblyzer's compute_partial_slices)."""
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    frame_step = int(np.round((SAMPLE_RATE / PARTIAL_RATE) / HOP))
    steps = max(1, n_frames - PARTIAL_FRAMES + frame_step + 1)
    slices = [slice(i, i + PARTIAL_FRAMES) for i in range(0, steps, frame_step)]
    last = slices[-1]
    coverage = (n_samples - last.start * HOP) / (PARTIAL_FRAMES * HOP)
    if coverage < MIN_COVERAGE and len(slices) > 1:
        slices = slices[:-1]
    return slices


def partial_mels(wav: np.ndarray) -> np.ndarray:
    """(partials, 160, 40) mel power spectrograms of a preprocessed waveform's partial utterances,
    the waveform zero-padded to cover the last one."""
    slices = partial_slices(wav.shape[0])
    needed = slices[-1].stop * HOP
    if needed >= wav.shape[0]:
        wav = np.pad(wav, (0, needed - wav.shape[0]))
    mel = mel_power(wav, SAMPLE_RATE, N_FFT, HOP, N_MELS).T  # (frames, 40)
    return np.stack([mel[s] for s in slices])


# ---------------------------------------------------------------- the encoder


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # overflow-free logistic


class SpeakerEncoder:
    """GE2E speaker encoder (resemblyzer's weights) in numpy; `load()` finds the installed weights."""

    def __init__(self, weights: dict[str, np.ndarray], path: Path) -> None:
        self.weights = weights
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> SpeakerEncoder:
        path = Path(path) if path is not None else find_weights()
        return cls(_load_weights(str(path)), path)

    def describe(self) -> dict[str, Any]:
        digest = sha256_file(self.path)
        return {
            "model": "GE2E speaker encoder (resemblyzer 0.1.4 pretrained.pt), numpy",
            "weights": recorded_installed_file(self.path, WEIGHTS_DISTRIBUTION, WEIGHTS_PATH_IN_WHEEL),
            "weights_sha256": digest,
            "embedding": EMBEDDING_SIZE,
            "vad": "energy threshold (webrtcvad's decision replaced; see evaluate/speaker.py)",
        }

    def embed_mels(self, mels: np.ndarray) -> np.ndarray:
        """(batch, frames, 40) mel power spectrograms -> (batch, 256) L2-normalised embeddings."""
        x = np.asarray(mels, dtype=np.float32)
        w = self.weights
        batch, frames = x.shape[0], x.shape[1]
        for layer in range(LAYERS):
            w_hh_t = w[f"lstm.weight_hh_l{layer}"].T
            # Inputs of every step at once; the recurrence adds the hidden state's part.
            x_proj = x @ w[f"lstm.weight_ih_l{layer}"].T + (w[f"lstm.bias_ih_l{layer}"] + w[f"lstm.bias_hh_l{layer}"])
            h = np.zeros((batch, HIDDEN), dtype=np.float32)
            c = np.zeros((batch, HIDDEN), dtype=np.float32)
            outputs = np.empty((batch, frames, HIDDEN), dtype=np.float32)
            for t in range(frames):
                gates = x_proj[:, t] + h @ w_hh_t
                i, f, g, o = np.split(gates, 4, axis=1)  # torch's gate order
                c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
                h = _sigmoid(o) * np.tanh(c)
                outputs[:, t] = h
            x = outputs
        raw = np.maximum(h @ w["linear.weight"].T + w["linear.bias"], 0.0)
        norms = np.linalg.norm(raw, axis=1, keepdims=True)
        return (raw / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    def embed_preprocessed_many(self, wavs: Sequence[np.ndarray]) -> np.ndarray:
        """(n, 256) embeddings of waveforms already at 16 kHz and preprocessed (resemblyzer's
        embed_utterance each); the partials of all of them go through the LSTM as one batch."""
        partials, owners = [], []
        for k, wav in enumerate(wavs):
            mels = partial_mels(wav)
            partials.append(mels)
            owners += [k] * mels.shape[0]
        embeds = self.embed_mels(np.concatenate(partials))
        owner = np.asarray(owners)
        return np.stack([_normalised(embeds[owner == k].mean(axis=0)) for k in range(len(wavs))])

    def embed_preprocessed(self, wav: np.ndarray) -> np.ndarray:
        return self.embed_preprocessed_many([wav])[0]

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """float32 (256,) L2-normalised utterance embedding of a mono waveform at any rate."""
        return self.embed_preprocessed(preprocess(audio, sample_rate))

    def embed_many(self, items: Sequence[tuple[np.ndarray, int]], batch: int = 16) -> np.ndarray:
        """(n, 256) embeddings of [(audio, sample_rate), ...], `batch` utterances per LSTM pass
        (each embedding is what `embed` gives for that utterance alone)."""
        if not items:
            return np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)
        wavs = [preprocess(audio, sr) for audio, sr in items]
        return np.concatenate([self.embed_preprocessed_many(wavs[i : i + batch]) for i in range(0, len(wavs), batch)])


def _normalised(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float32)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings (0.0 when either is all zeros)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise BadInput(f"embeddings of different sizes: {a.shape[0]} and {b.shape[0]}")
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom > 0 else 0.0


def pooled_reference(embeddings: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """One reference embedding of several utterances: their mean, re-normalised."""
    stacked = np.asarray(embeddings, dtype=np.float32)
    if stacked.ndim != 2 or stacked.shape[0] == 0:
        raise BadInput("a pooled reference needs at least one embedding")
    return _normalised(stacked.mean(axis=0))
