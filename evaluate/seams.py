"""Stream seams: what streaming does to a variant's audio, against the same variant's whole-text audio.

ChatTTS-style streaming decodes while the codes are generated and cuts the waveform into chunks;
a chunk decoded without enough right context differs from the whole-text waveform near its edge,
which listeners hear as a click or a burst of noise at a fixed cadence. `measure_seams` synthesizes
each held-out sentence whole (`Pipeline.synthesize`) and streamed (`Pipeline.stream`, same text,
speaker and seed, so the same codes) in two modes:

- ``default``: the runtime's default chunking (`stream_batch` steps per chunk, the exact right
  context: the concatenated stream should equal the whole waveform up to float rounding);
- ``lookahead``: the same with `lookahead_frames` mel frames of right context (`synth
  --stream-lookahead N`: starts sooner, inexact at the chunk edges by design): the artifact's recorded
  look-ahead (artifact.json `streaming`, what synth, serve and bench stream at by default) when it has
  one, else `DEFAULT_LOOKAHEAD_FRAMES`; `evaluate --seam-lookahead N` overrides it, and the recorded one
  is then measured too, as mode ``recorded``, so the gate still judges what users get.

Per sentence and mode it records the maximum absolute difference, the SNR of the streamed audio
against the whole-text audio (capped at `SNR_CEILING_DB`: identical audio would be +inf, which
strict JSON cannot hold), and a click detector: the energy of the high-passed difference in a
`CLICK_WINDOW_MS` window around each chunk edge, in dB relative to the high-passed whole-text
signal's mean energy (``click_db``; `FLOOR_DB` when there is no difference), and relative to the
high-passed difference away from the edges (``edge_over_rest_db``: > 0 means the error sits at the
seams). The gate reads ``stream_snr_db``: the worst sentence's SNR at the default chunking, and
``stream_recorded_lookahead_snr_db``: the worst at the recorded look-ahead (`recorded_lookahead_snr_db`).

Report section ``streaming``::

    {"measured": true, "stream_batch", "definition", "recorded_lookahead_frames" (null: none recorded),
     "recorded" (artifact.json's `streaming` record with its curve, or null),
     "modes": {"default"|"lookahead"|"recorded" (only with an override):
        {"lookahead_frames", "source" ("exact"|"recorded"|"option"|"fixed"),
         "sentences": [{"id", "text", "samples", "length_difference", "chunks",
         "edges", "max_abs_diff", "snr_db", "click_db", "edge_over_rest_db"}],
         "snr_db_min", "snr_db_mean", "max_abs_diff", "click_db_max"}}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.log import get_logger
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.stream_lookahead import SNR_CEILING_DB, snr_db

__all__ = ["SNR_CEILING_DB", "snr_db", "measure_seams", "compare_stream", "recorded_lookahead_snr_db"]

log = get_logger(__name__)

FLOOR_DB = -150.0  # no difference at all at the edges
CLICK_WINDOW_MS = 5.0  # each side of a chunk edge
DEFAULT_LOOKAHEAD_FRAMES = 2  # mel frames of right context in the low-latency mode
DEFINITION = (
    "streamed audio (Pipeline.stream, same text/speaker/seed) against the same variant's whole-text audio; "
    f"SNR capped at {SNR_CEILING_DB:g} dB; click_db: energy of the first-difference high-passed (streamed - whole) "
    f"within {CLICK_WINDOW_MS:g} ms of each chunk edge, relative to the high-passed whole-text audio's mean energy"
)


def _db(num: float, den: float, lo: float = FLOOR_DB, hi: float = SNR_CEILING_DB) -> float:
    if num <= 0:
        return lo
    if den <= 0:
        return hi
    return float(np.clip(10 * np.log10(num / den), lo, hi))


def high_pass(x: np.ndarray) -> np.ndarray:
    """First difference: a click is a step, broadband; speech energy sits low."""
    x = np.asarray(x, dtype=np.float64)
    return np.diff(x, prepend=x[:1]) if x.size else x


def click_figures(whole: np.ndarray, streamed: np.ndarray, edges: list[int], sample_rate: int) -> dict[str, float]:
    """``click_db`` and ``edge_over_rest_db`` of a streamed waveform (see module docstring)."""
    n = min(len(whole), len(streamed))
    diff_hp = high_pass(np.asarray(streamed[:n], np.float64) - np.asarray(whole[:n], np.float64)) ** 2
    whole_hp = high_pass(whole[:n]) ** 2
    half = max(1, int(sample_rate * CLICK_WINDOW_MS / 1000))
    near = np.zeros(n, dtype=bool)
    for e in edges:
        near[max(0, e - half): min(n, e + half)] = True
    if not near.any() or n == 0:
        return {"click_db": FLOOR_DB, "edge_over_rest_db": 0.0}
    edge_energy = float(diff_hp[near].mean())
    rest_energy = float(diff_hp[~near].mean()) if (~near).any() else 0.0
    return {"click_db": _db(edge_energy, float(whole_hp.mean())),
            "edge_over_rest_db": 0.0 if edge_energy == rest_energy == 0 else _db(edge_energy, rest_energy)}


def compare_stream(whole: np.ndarray, chunks: list[np.ndarray], sample_rate: int) -> dict[str, Any]:
    """The figures of one streamed sentence: `chunks` concatenated against `whole`."""
    lengths = [len(c) for c in chunks if len(c)]
    streamed = np.concatenate([c for c in chunks if len(c)]) if lengths else np.zeros(0, np.float32)
    edges = [int(e) for e in np.cumsum(lengths)[:-1]]
    n = min(len(whole), len(streamed))
    diff = np.abs(streamed[:n].astype(np.float64) - whole[:n].astype(np.float64))
    return {"samples": int(len(whole)), "length_difference": int(len(streamed) - len(whole)), "chunks": len(lengths),
            "edges": edges, "max_abs_diff": float(diff.max()) if n else 0.0,
            "snr_db": snr_db(whole[:n], streamed[:n]) if n else FLOOR_DB,
            **click_figures(whole, streamed, edges, sample_rate)}


def measure_seams(
    artifact: str | Path,
    sentences: list[str],
    *,
    max_new_token: int = 96,
    seed: int = 0,
    threads: int | None = 2,
    provider: str = "cpu",
    stream_batch: int = 24,
    lookahead_frames: int | None = None,
) -> dict[str, Any]:
    """The report's ``streaming`` section for `artifact` on `sentences` (see module docstring).
    `lookahead_frames`: the lookahead mode's frames (None: the recorded look-ahead, else the fixed one)."""
    pipe = Pipeline(Path(artifact), threads=threads, provider=provider)
    exact = pipe.decoder_radius + pipe.vocos_radius
    recorded = pipe.default_lookahead
    if lookahead_frames is not None:
        chosen, source = lookahead_frames, "option"
    elif recorded is not None:
        chosen, source = recorded, "recorded"
    else:
        chosen, source = DEFAULT_LOOKAHEAD_FRAMES, "fixed"
    modes: dict[str, int | None] = {"default": None, "lookahead": min(chosen, exact)}
    sources = {"default": "exact", "lookahead": source}
    if source == "option" and recorded is not None:  # the gate judges the recorded one, as users get it
        modes["recorded"], sources["recorded"] = min(recorded, exact), "recorded"
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for i, text in enumerate(sentences):
        params = SynthParams(code=InferCodeParams(spk_emb=pipe.random_speaker(seed + i), seed=seed + i,
                                                  max_new_token=max_new_token))
        [whole] = pipe.synthesize(text, params)
        for mode, lookahead in modes.items():
            chunks = [c[0] for c in pipe.stream([text], params, stream_batch=stream_batch, lookahead_frames=lookahead)]
            rows[mode].append({"id": f"{i + 1:03d}", "text": text,
                               **compare_stream(whole.wav, chunks, whole.sample_rate)})
    out: dict[str, Any] = {"measured": True, "stream_batch": stream_batch, "definition": DEFINITION,
                           "recorded_lookahead_frames": recorded, "recorded": pipe.artifact.meta.streaming,
                           "modes": {}}
    for mode, lookahead in modes.items():
        r = rows[mode]
        snrs = [x["snr_db"] for x in r]
        out["modes"][mode] = {
            "lookahead_frames": exact if lookahead is None else lookahead,
            "source": sources[mode],
            "sentences": r,
            "snr_db_min": min(snrs) if snrs else None,
            "snr_db_mean": float(np.mean(snrs)) if snrs else None,
            "max_abs_diff": max((x["max_abs_diff"] for x in r), default=None),
            "click_db_max": max((x["click_db"] for x in r), default=None),
        }
        log.info("stream seams (%s, lookahead %s frames): worst SNR %.1f dB, max |diff| %.3g", mode,
                 out["modes"][mode]["lookahead_frames"], out["modes"][mode]["snr_db_min"] or 0.0,
                 out["modes"][mode]["max_abs_diff"] or 0.0)
    return out


def recorded_lookahead_snr_db(streaming: dict[str, Any] | None) -> tuple[float | None, str | None]:
    """The worst SNR at the artifact's recorded look-ahead in a ``streaming`` section, or (None, why)
    when it records none (it streams exactly: ``stream_snr_db`` judges that) or seams were not measured."""
    streaming = streaming or {}
    if not streaming.get("measured"):
        return None, streaming.get("reason") or "stream seams were not measured"
    if streaming.get("recorded_lookahead_frames") is None:
        return None, NO_RECORDED_LOOKAHEAD
    for rec in (streaming.get("modes") or {}).values():
        if rec.get("source") == "recorded":
            return rec.get("snr_db_min"), None
    return None, "the recorded look-ahead was not streamed"


NO_RECORDED_LOOKAHEAD = ("the artifact records no stream look-ahead (artifact.json `streaming`): it streams exactly "
                         "by default, which stream_snr_db judges")
