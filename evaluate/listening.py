"""What listeners hear, per held-out sentence: the voice (SIM), naturalness (DNSMOS), and the audio itself.

The evaluate stage synthesizes every held-out sentence with the artifact and with its FP32
reference (same text, speaker and seed: the latency run's audio), then here:

- ``speaker`` (`speaker_section`): per sentence the cosine similarity (SIM) of the GE2E speaker
  embedding of the artifact's audio to that of the reference's audio (`evaluate.speaker`); the gate
  reads the mean (``similarity``) and the worst sentence (``similarity_worst``). With a cloning
  recording, also SIM of each cloned output to the recording (``clone_similarity``, mean);
- ``naturalness`` (`naturalness_section`): DNSMOS SIG/BAK/OVRL and P.808 per utterance of both
  (`evaluate.naturalness`); the gate reads ``ovrl_drop``, the mean over sentences of the
  reference's OVRL minus the artifact's (positive: the artifact sounds worse);
- ``listen`` (`listen_files`): for the first few sentences, the artifact's and the reference's
  audio as MP3 (libsndfile through soundfile: its MP3 bytes are reproducible, its Ogg/Opus ones
  are not, a random stream serial number) and a PNG of both mel spectrograms and their difference,
  written beside report.json under ``listen/`` and listed with their sha256 in the report (the
  version page embeds them, `version_page`).

On a synthetic checkpoint (random weights) both models hear noise: the figures are computed and
shown, marked ``synthetic_only`` with `SYNTHETIC_REASON`, and the gate waives their rules, as it
waives WER (evaluate.evaluate). A scorer whose weights are missing leaves its section
``{"measured": false, "reason"}`` (a real checkpoint then fails the gate on it: never a silent pass).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError, IntegrityError
from chattts_forge.evaluate.report_record import ListenFile
from chattts_forge.log import get_logger

log = get_logger(__name__)

Waves = Mapping[str, tuple[np.ndarray, int]]

SYNTHETIC_REASON = (
    "synthetic checkpoint: random weights make noise, so speaker similarity and DNSMOS describe noise, not a "
    "voice; shown as synthetic-only, not gated"
)
# Gate metrics of this module (waived on synthetic checkpoints).
HEARING_METRICS = ("similarity", "similarity_worst", "clone_similarity", "ovrl_drop")
LISTEN_DIR = "listen"
SYNTHETIC_MOS_SENTENCES = 1
AUDIO_FORMAT = ("MP3", "MPEG_LAYER_III", "mp3", "audio/mpeg")
# Spectrogram settings of the listen PNGs (24 kHz audio: 42.7 ms window, 10.7 ms hop).
MEL_FFT, MEL_HOP, MEL_BANDS = 1024, 256, 80


def _not_measured(e: Exception) -> dict[str, Any]:
    return {"measured": False, "reason": f"scorer unavailable: {e}"}


def speaker_section(
    art: Waves,
    ref: Waves,
    texts: Mapping[str, str],
    *,
    synthetic: bool,
    clone: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's ``speaker`` section. `clone`: {"recording": (wav, sr), "path", "waves": {id: (wav, sr)}}
    (the artifact's outputs synthesized with the recording as its speaker sample) or None."""
    try:
        from chattts_forge.evaluate.speaker import SpeakerEncoder, similarity

        encoder = SpeakerEncoder.load()
    except (ImportError, ForgeError, OSError) as e:
        return _not_measured(e)
    ids = [i for i in art if i in ref]
    a = encoder.embed_many([art[i] for i in ids])
    r = encoder.embed_many([ref[i] for i in ids])
    rows = [{"id": i, "text": texts.get(i, ""), "similarity": similarity(x, y)} for i, x, y in zip(ids, a, r, strict=True)]
    sims = [row["similarity"] for row in rows]
    out: dict[str, Any] = {
        "measured": True, "synthetic_only": synthetic, "reason": SYNTHETIC_REASON if synthetic else None,
        "encoder": encoder.describe(),
        "definition": "cosine of GE2E embeddings: artifact audio vs the FP32 reference's audio of the same sentence "
                      "(same text, speaker and seed)",
        "sentences": rows, "mean": float(np.mean(sims)) if sims else None, "min": min(sims) if sims else None,
        "clone": None,
    }
    if clone is not None:
        rec = encoder.embed(*clone["recording"])
        cloned = [{"id": i, "text": texts.get(i, ""), "similarity": similarity(encoder.embed(*w), rec)}
                  for i, w in clone["waves"].items()]
        vals = [c["similarity"] for c in cloned]
        out["clone"] = {"recording": clone["path"], "sentences": cloned, "mean": float(np.mean(vals)) if vals else None,
                        "min": min(vals) if vals else None}
    return out


def naturalness_section(art: Waves, ref: Waves, texts: Mapping[str, str], *, synthetic: bool,
                        sentences: int | None = None, threads: int | None = None) -> dict[str, Any]:
    """The report's ``naturalness`` section: DNSMOS of both variants per sentence and the OVRL drop, on
    the first `sentences` sentences (None: all; on a synthetic checkpoint `SYNTHETIC_MOS_SENTENCES`:
    DNSMOS costs seconds per utterance and describes noise there)."""
    try:
        from chattts_forge.evaluate.naturalness import Dnsmos

        dnsmos = Dnsmos.load(threads=threads)
    except (ImportError, ForgeError, OSError) as e:
        return _not_measured(e)
    if sentences is None:
        sentences = SYNTHETIC_MOS_SENTENCES if synthetic else len(art)
    rows = []
    for i in [i for i in art if i in ref][:sentences]:
        a, r = dnsmos.score(*art[i]), dnsmos.score(*ref[i])
        rows.append({"id": i, "text": texts.get(i, ""), "artifact": {k: float(v) for k, v in a.items()},
                     "reference": {k: float(v) for k, v in r.items()}, "ovrl_drop": float(r["ovrl"] - a["ovrl"])})

    def mean(key: str, who: str) -> float | None:
        return float(np.mean([row[who][key] for row in rows])) if rows else None

    describe = getattr(dnsmos, "describe", None)
    return {
        "measured": True, "synthetic_only": synthetic, "reason": SYNTHETIC_REASON if synthetic else None,
        "model": describe() if callable(describe) else "DNSMOS P.835 + P.808 (speechmos 0.0.1.1)",
        "sentences": rows,
        "artifact": {k: mean(k, "artifact") for k in ("sig", "bak", "ovrl", "p808")},
        "reference": {k: mean(k, "reference") for k in ("sig", "bak", "ovrl", "p808")},
        "ovrl_drop": float(np.mean([row["ovrl_drop"] for row in rows])) if rows else None,
    }


# ---------------------------------------------------------------- the audio beside the report


def encode_audio(wav: np.ndarray, sample_rate: int) -> bytes:
    """MP3 bytes of a mono waveform (reproducible: the same samples give the same bytes)."""
    import soundfile as sf

    buf = io.BytesIO()
    audio = np.clip(np.asarray(wav, dtype=np.float32).reshape(-1), -1.0, 1.0)
    if audio.size == 0:
        audio = np.zeros(sample_rate // 10, dtype=np.float32)  # an empty row still gets a (silent) player
    sf.write(buf, audio, sample_rate, format=AUDIO_FORMAT[0], subtype=AUDIO_FORMAT[1])
    return buf.getvalue()


def mel_db(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    from chattts_forge.evaluate.melspec import mel_power

    power = mel_power(np.asarray(wav, dtype=np.float32).reshape(-1), sample_rate, MEL_FFT, MEL_HOP, MEL_BANDS)
    return 10.0 * np.log10(np.maximum(power, 1e-10))


def spectrogram_png(art: tuple[np.ndarray, int], ref: tuple[np.ndarray, int], variant: str) -> bytes:
    """PNG: the reference's and the artifact's mel spectrograms (dB) and their difference."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    r, a = mel_db(*ref), mel_db(*art)
    n = min(r.shape[1], a.shape[1])
    top = max(float(r.max()) if r.size else 0.0, float(a.max()) if a.size else 0.0)
    fig, axes = plt.subplots(1, 3, figsize=(7.5, 1.9), sharey=True)
    for ax, m, title in ((axes[0], r, "fp32"), (axes[1], a, variant)):
        ax.imshow(m, origin="lower", aspect="auto", vmin=top - 80, vmax=top, cmap="magma")
        ax.set_title(f"{title} mel (dB)", fontsize=8)
    diff = a[:, :n] - r[:, :n]
    im = axes[2].imshow(diff, origin="lower", aspect="auto", vmin=-20, vmax=20, cmap="coolwarm")
    axes[2].set_title(f"{variant} - fp32 (dB)", fontsize=8)
    fig.colorbar(im, ax=axes[2], fraction=0.05)
    for ax in axes:
        ax.tick_params(labelsize=6)
        ax.set_xlabel("frame", fontsize=7)
    axes[0].set_ylabel("mel band", fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def listen_files(art: Waves, ref: Waves, texts: Mapping[str, str], variant: str, count: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(the report's ``listen`` section, {relative path: bytes}) for the first `count` sentences."""
    files: dict[str, bytes] = {}
    rows = []
    for i in [i for i in art if i in ref][:count]:
        row: dict[str, Any] = {"id": i, "text": texts.get(i, "")}
        for who, (wav, sr) in (("artifact", art[i]), ("reference", ref[i])):
            name = f"{LISTEN_DIR}/{i}-{who}.{AUDIO_FORMAT[2]}"
            files[name] = encode_audio(wav, sr)
            row[who] = {"file": name, "sha256": hashlib.sha256(files[name]).hexdigest(),
                        "seconds": float(np.asarray(wav).size / sr)}
        name = f"{LISTEN_DIR}/{i}-mel.png"
        files[name] = spectrogram_png(art[i], ref[i], variant)
        row["spectrogram"] = {"file": name, "sha256": hashlib.sha256(files[name]).hexdigest()}
        rows.append(row)
    section = {"format": AUDIO_FORMAT[2], "mime": AUDIO_FORMAT[3], "sentences": rows,
               "spectrogram": {"n_fft": MEL_FFT, "hop": MEL_HOP, "bands": MEL_BANDS}}
    return section, files


def read_listen_file(report_dir: Path, entry: ListenFile) -> bytes:
    """A listen file of a report folder, checked against the sha256 its report records."""
    path = Path(report_dir) / entry.file
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: unreadable ({e})") from None
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise IntegrityError(f"{path}: differs from the sha256 its report.json records")
    return data


def clone_waves(
    artifact: Path,
    sentences: list[str],
    recording: str | Path,
    transcript: str | None,
    *,
    max_new_token: int,
    seed: int,
    threads: int | None,
    provider: str,
) -> dict[str, Any]:
    """Voice cloning with the artifact: every sentence synthesized with `recording` as the speaker sample
    (`Pipeline.sample_audio_speaker`, `transcript` as its text sample) -> `speaker_section`'s `clone`."""
    import soundfile as sf

    from chattts_forge.evaluate.asr import resample
    from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams

    path = Path(recording)
    try:
        wav, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError) as e:
        raise BadInput(f"cloning recording {path}: unreadable ({e})") from None
    mono = wav.mean(axis=1)
    pipe = Pipeline(Path(artifact), threads=threads, provider=provider)
    rec24 = mono if sr == pipe.sample_rate else resample(mono, int(sr), pipe.sample_rate)
    spk_smp = pipe.sample_audio_speaker(np.asarray(rec24, dtype=np.float32))
    waves = {}
    for i, text in enumerate(sentences):
        params = SynthParams(code=InferCodeParams(spk_smp=spk_smp, txt_smp=transcript, seed=seed + i,
                                                  max_new_token=max_new_token))
        [res] = pipe.synthesize(text, params)
        waves[f"{i + 1:03d}"] = (res.wav, res.sample_rate)
    return {"recording": (mono, int(sr)), "path": str(path), "waves": waves}
