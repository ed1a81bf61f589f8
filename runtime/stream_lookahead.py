"""The measured stream look-ahead of an artifact: artifact.json `streaming` (docs/artifact-format.md).

Where an artifact's Decoder/Vocos stack is made (convert for fp32/fp16, quantize for the quantized
variants), `measure_lookahead` generates the codes of a few fixed sentences once (seeded, a bounded
number of steps), decodes each whole, then streams the same hidden states through `StreamDecoder`
at each candidate look-ahead, with the chunk cadence of `Pipeline.stream` (a first chunk as soon as
audio is final, then every `stream_batch` steps), and takes the SNR of the streamed waveform against
the whole one. The recorded look-ahead is the shortest whose worst sentence clears the gate's stream
threshold plus a margin (the exact receptive field when none does): synth, serve and bench stream at
it by default. The sentences are fixed here, apart from the gate's held-out evaluation sentences, on
which evaluate checks the recorded value again (evaluate.seams).

Library::

    record = measure_lookahead(pipe, threshold_db=60.0)     # the `streaming` section
    meta.streaming = measure_artifact(folder, meta)         # an artifact being written (meta in memory)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge.log import get_logger
from chattts_forge.runtime.loaded_artifact import LoadedArtifact
from chattts_forge.runtime.params import InferCodeParams, SynthParams
from chattts_forge.runtime.pipeline import Pipeline
from chattts_forge.runtime.stream_decode import MIN_LOOKAHEAD_FRAMES, StreamDecoder

if TYPE_CHECKING:
    from chattts_forge.artifact import ArtifactMeta

log = get_logger(__name__)

SNR_CEILING_DB = 150.0  # float32 audio identical to rounding; stands for +inf (strict JSON has none)
# Mel frames tried, shortest first (capped at the exact receptive field, which is always tried last).
CANDIDATE_LOOKAHEADS = (8, 12, 16, 24, 32, 48, 64)
# dB above the gate's stream threshold the recorded look-ahead must reach on these sentences, so that it
# still clears the threshold on sentences it was not chosen on (the gate's held-out ones).
MARGIN_DB = 20.0
# The gate's `min_stream_snr_db` when the caller has no gate file at hand.
DEFAULT_THRESHOLD_DB = 60.0
# Fixed measuring sentences, Mandarin and English; not the gate's held-out evaluation sentences.
SENTENCES = (
    "今天下午我们去河边散步，看看新开的花。",
    "这台机器每天早上八点准时开始工作。",
    "The little boat drifted slowly across the quiet lake at sunset.",
    "Please read the next paragraph aloud before the meeting starts.",
)
MAX_NEW_TOKEN = 192  # code steps per sentence: long enough for several chunk edges
SEED = 7


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """SNR of `test` against `reference` (same length) in dB, capped at SNR_CEILING_DB (and at -SNR_CEILING_DB)."""
    ref = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum((ref - np.asarray(test, dtype=np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0:
        return SNR_CEILING_DB
    if signal <= 0:
        return -SNR_CEILING_DB
    return float(np.clip(10 * np.log10(signal / noise), -SNR_CEILING_DB, SNR_CEILING_DB))


def stream_codes(pipe: Pipeline, steps: np.ndarray, lookahead_frames: int | None, stream_batch: int,
                 use_decoder: bool = True) -> np.ndarray:
    """The waveform `Pipeline.stream` would emit for one row whose steps are `steps` (hidden states, or
    codes without the Decoder), pushed with its cadence, without generating again."""
    dec = StreamDecoder(pipe, use_decoder, lookahead_frames)
    chunks: list[np.ndarray] = []
    first_sent = False
    for n in range(1, len(steps) + 1):
        final = n == len(steps)
        due = n % stream_batch == 0 or final
        if not due and not first_sent:
            due = dec.ready_samples(n, final) > dec.emitted
        if not due:
            continue
        chunk = dec.push(steps[:n], final=final)
        first_sent = first_sent or len(chunk) > 0
        chunks.append(chunk)
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def choose_lookahead(curve: list[dict[str, Any]], exact: int, required_db: float) -> int:
    """The shortest look-ahead of `curve` whose worst SNR reaches `required_db`; `exact` when none does."""
    passing = [p["lookahead_frames"] for p in curve if p["snr_db_min"] is not None and p["snr_db_min"] >= required_db]
    return min(passing) if passing else exact


def measure_lookahead(
    pipe: Pipeline,
    *,
    threshold_db: float = DEFAULT_THRESHOLD_DB,
    margin_db: float = MARGIN_DB,
    sentences: tuple[str, ...] = SENTENCES,
    candidates: tuple[int, ...] = CANDIDATE_LOOKAHEADS,
    max_new_token: int = MAX_NEW_TOKEN,
    seed: int = SEED,
    stream_batch: int | None = None,
) -> dict[str, Any]:
    """artifact.json's `streaming` section for the artifact `pipe` runs (see the module docstring)."""
    exact = pipe.decoder_radius + pipe.vocos_radius
    tried = sorted({c for c in candidates if MIN_LOOKAHEAD_FRAMES <= c < exact} | {exact})
    worst: dict[int, float | None] = dict.fromkeys(tried)
    measured = 0
    every = stream_batch
    for i, text in enumerate(sentences):
        params = SynthParams(code=InferCodeParams(spk_emb=pipe.random_speaker(seed + i), seed=seed + i,
                                                  max_new_token=max_new_token))
        every = every or params.code.stream_batch
        norm, _ = pipe.prepare_texts([text], params)
        for row in pipe.synthesize_rows(norm, params):
            if len(row.hiddens) < 2:  # no audio to compare (the row ended at once)
                continue
            measured += 1
            for frames in tried:
                streamed = stream_codes(pipe, row.hiddens, frames, every)
                n = min(len(row.wav), len(streamed))
                snr = snr_db(row.wav[:n], streamed[:n])
                low = worst[frames]
                worst[frames] = snr if low is None else min(low, snr)
    curve = [{"lookahead_frames": f, "snr_db_min": None if s is None else round(s, 2)} for f, s in worst.items()]
    chosen = choose_lookahead(curve, exact, threshold_db + margin_db)
    record = {"lookahead_frames": chosen, "exact_frames": exact, "threshold_db": threshold_db, "margin_db": margin_db,
              "curve": curve, "sentences": measured, "stream_batch": every, "max_new_token": max_new_token,
              "seed": seed}
    log.info("stream look-ahead: %d mel frames (exact %d; worst SNR must reach %.0f + %.0f dB on %d sentences); "
             "curve %s", chosen, exact, threshold_db, margin_db, measured,
             ", ".join(f"{p['lookahead_frames']}: {p['snr_db_min']}" for p in curve))
    return record


def measure_artifact(folder: str | os.PathLike[str], meta: ArtifactMeta, *, threshold_db: float = DEFAULT_THRESHOLD_DB,
                     threads: int | None = 2) -> dict[str, Any]:
    """The `streaming` record of the artifact being written in `folder`, whose artifact.json is `meta`
    (in memory: the stage writes it once, with this record). Files are only checked to exist: the stage
    has just written them."""
    artifact = LoadedArtifact(folder, threads=threads, verify="none", meta=meta, saved_sessions=False)
    return measure_lookahead(Pipeline.from_artifact(artifact), threshold_db=threshold_db)
