"""Streaming decode: the audio of a row that can no longer change, as its code steps arrive.

The Decoder and Vocos are convolutional (non-causal), so a mel frame depends on `decoder_radius`
frames on each side and a sample on `vocos_radius` frames; a `StreamDecoder` decodes only a window
(the new part plus that much context) and holds back the last frames until their right context
exists, so the concatenated stream equals the non-streamed waveform (up to float rounding of
convolutions over different lengths, ~1e-6). That right context is what bounds first audio:
`decoder_radius + vocos_radius` mel frames (55 code steps at full size). `lookahead_frames` trades
exactness for latency: samples are emitted once that many mel frames of right context exist, so the
few frames before each chunk boundary are decoded with a truncated right edge (a low-latency mode,
like ChatTTS's own streaming, which is not exact either). An artifact records the shortest look-ahead
whose seams it measured clean (artifact.json `streaming`, runtime.stream_lookahead); synth, serve and
bench stream at it unless told `exact` (`resolve_lookahead`), while `Pipeline.stream` and
`StreamDecoder` take None as the exact stream.

`stream_rows` is the loop `Pipeline.stream` runs over a batch of rows: when a chunk is due, and its
rows' chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from chattts_forge.errors import BadInput

if TYPE_CHECKING:
    from chattts_forge.checkpoint.layout import Dims
    from chattts_forge.runtime.generation import Generation, StepState
    from chattts_forge.runtime.params import SynthParams
    from chattts_forge.runtime.pipeline import Pipeline

# Conv stacks of ChatTTS's DVAEDecoder (fixed in its code, not in the config).
_DVAE_KERNEL = 7
_DVAE_DILATION = 2
_VOCOS_KERNEL = 7
# Extra frames of context beyond the computed receptive fields (costs a little compute only).
_SAFETY_FRAMES = 2
# A requested look-ahead: this word for the exact (receptive-field) stream, a number of mel frames, or
# None for the artifact's recorded default (`resolve_lookahead`). At least one frame: the waveform of
# F mel frames has (F - 1) hops, so a sample is never final before the next frame exists.
MIN_LOOKAHEAD_FRAMES = 1
EXACT_LOOKAHEAD = "exact"
StreamLookahead = int | str | None


def parse_stream_lookahead(value: object, what: str = "stream lookahead") -> int | str:
    """A look-ahead as a user gives it ("exact" or a whole number of mel frames >= 1, as text or int);
    anything else is a one-line ForgeError naming `what`."""
    if isinstance(value, str) and value.strip().lower() == EXACT_LOOKAHEAD:
        return EXACT_LOOKAHEAD
    frames = value
    if isinstance(value, str):
        try:
            frames = int(value.strip())
        except ValueError:
            frames = None
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < MIN_LOOKAHEAD_FRAMES:
        raise BadInput(f"{what} must be '{EXACT_LOOKAHEAD}' or a whole number of mel frames >= "
                         f"{MIN_LOOKAHEAD_FRAMES}, got {value!r}")
    return frames


STREAM_LOOKAHEAD_HELP = ("Mel frames of right context to wait for before emitting audio: 'exact' (all the Decoder "
                         "and Vocos need, so the stream equals the whole waveform) or N (fewer start sooner, inexact "
                         "at chunk edges). Default: the look-ahead the artifact records (artifact.json `streaming`), "
                         "exact for artifacts without one.")


def resolve_lookahead(requested: StreamLookahead, default: int | None) -> int | None:
    """The `lookahead_frames` a StreamDecoder takes for a request: `default` (the artifact's recorded
    look-ahead; None when it has none) when nothing was asked, None (exact) for "exact", else the frames."""
    if requested is None:
        return default
    frames = parse_stream_lookahead(requested)
    return None if frames == EXACT_LOOKAHEAD else int(frames)


def decoder_radius(dims: Dims) -> int:
    """Mel frames on each side that one Decoder/DVAE output frame depends on."""
    layers = max(dims.decoder.n_layer, dims.dvae_decoder.n_layer)
    return 3 + layers * _DVAE_DILATION * (_DVAE_KERNEL // 2) + _SAFETY_FRAMES


def vocos_radius(dims: Dims, hop: int) -> int:
    """Mel frames on each side that one output sample of Vocos depends on (backbone + ISTFT)."""
    backbone = (_VOCOS_KERNEL // 2) * (1 + dims.vocos_num_layers)
    istft = math.ceil(dims.n_fft / (2 * hop))
    return backbone + istft + _SAFETY_FRAMES


class StreamDecoder:
    """Incremental audio of one row: `push(all steps so far)` returns the new, final samples.

    Only samples whose whole receptive field is known are emitted; each push decodes a window of
    the new frames plus `decoder_radius` / `vocos_radius` frames of context, never the whole prefix.
    """

    def __init__(self, pipe: Pipeline, use_decoder: bool = True, lookahead_frames: int | None = None) -> None:
        self.pipe = pipe
        self.use_decoder = use_decoder
        self.hop = pipe.hop
        self.rd = pipe.decoder_radius
        self.rv = pipe.vocos_radius
        exact = self.rd + self.rv  # mel frames of right context a sample's whole receptive field spans
        if lookahead_frames is not None and lookahead_frames < MIN_LOOKAHEAD_FRAMES:
            raise BadInput(f"stream lookahead must be >= {MIN_LOOKAHEAD_FRAMES} mel frame, got {lookahead_frames}")
        self.lookahead = exact if lookahead_frames is None else min(lookahead_frames, exact)
        self.emitted = 0  # samples already returned
        self.closed = False

    def ready_samples(self, n: int, final: bool = False) -> int:
        """Samples that can be emitted once `n` code steps exist (all of them when `final`)."""
        frames = 2 * n
        if final:
            return self.hop * (frames - 1) if n else 0
        return max(0, (frames - self.lookahead) * self.hop)

    def push(self, steps: np.ndarray, final: bool = False) -> np.ndarray:
        """`steps`: every step so far ([T, hidden] or [T, num_vq]); `final`: the row has ended."""
        if self.closed:
            return np.zeros(0, dtype=np.float32)
        n = len(steps)
        frames = 2 * n
        ready = self.ready_samples(n, final)
        self.closed = final
        if ready <= self.emitted:
            return np.zeros(0, dtype=np.float32)
        s0, s1 = self.emitted, ready
        # mel frames Vocos needs for samples [s0, s1)
        fa = max(0, s0 // self.hop - self.rv)
        fb = min(frames, -(-s1 // self.hop) + self.rv)
        # hidden steps the Decoder needs for mel frames [fa, fb)
        ta = max(0, (fa - self.rd) // 2)
        tb = min(n, -(-(fb + self.rd) // 2))
        mel = self.pipe.decode_mel(steps[ta:tb], self.use_decoder)[:, fa - 2 * ta : fb - 2 * ta]
        wav = self.pipe.vocos(mel)
        out = wav[s0 - fa * self.hop : s1 - fa * self.hop]
        if len(out) != s1 - s0:
            raise RuntimeError(f"stream window too short: {len(out)} != {s1 - s0} samples")
        self.emitted = s1
        return out.astype(np.float32, copy=False)


def stream_rows(pipe: Pipeline, norm: list[str], params: SynthParams, every: int,
                on_done: Callable[[Generation], None] | None, lookahead_frames: int | None,
                progress: Callable[[StepState], None] | None) -> Iterator[list[np.ndarray]]:
    """`Pipeline.stream`'s rows generated as one batch: one chunk per row (possibly empty) as soon as any
    row has final audio (checked every step until then), then every `every` steps and at the end;
    `on_done` gets the generation."""
    decoders = [StreamDecoder(pipe, params.use_decoder, lookahead_frames) for _ in norm]
    live_steps = 0
    first_sent = False  # no chunk with audio yet: check every step (arithmetic only)
    for state in pipe.iter_infer_code(norm, params.code):
        live_steps += 1
        if progress is not None:
            progress(state)
        due = live_steps % every == 0 or state.done
        if not due and not first_sent:
            due = any(
                d.ready_samples(int(state.end_idx[b]), bool(state.finish[b])) > d.emitted
                for b, d in enumerate(decoders)
            )
        if not due:
            continue
        chunk = []
        for b, dec in enumerate(decoders):
            n = int(state.end_idx[b])
            src = state.hiddens[b, :n] if params.use_decoder else state.tokens[b, :n]
            chunk.append(dec.push(src, final=bool(state.finish[b]) or state.done))
        first_sent = first_sent or any(len(c) for c in chunk)
        yield chunk
    if on_done is not None:
        on_done(state.result())
