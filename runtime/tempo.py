"""Tempo: OpenAI's `speed` as a time-scale change of the speed-1 waveform, pitch and voice kept.

OpenAI's `speed` divides the duration by `speed`; ChatTTS's own `[speed_N]` prompt tag only nudges
the model's pacing (no duration guarantee), so the server synthesises at speed 1 and stretches the
waveform here. The stretch is ffmpeg's `atempo` filter (WSOLA) run in process through PyAV (the
`serve` extra). The filter is deterministic and is fed fixed blocks whatever the callers' chunks,
so a streamed reply (`Stretcher`) equals the whole one (`stretch`) sample for sample. The candidates
compared are in docs/measurements/2026-12-06-tempo/README.md.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError

__all__ = ["MIN_SPEED", "MAX_SPEED", "Stretcher", "check_speed", "stretch"]

MIN_SPEED = 0.25
MAX_SPEED = 4.0
# One atempo instance blends overlapping windows within 0.5..2; beyond, it skips or repeats input,
# so a larger change is a chain of instances each within this range.
STAGE_MIN = 0.5
STAGE_MAX = 2.0
# atempo's output depends on how its input is cut into frames, so the input goes to it in blocks of
# this many samples whatever the callers' chunks: that makes a stream equal the whole waveform.
BLOCK = 1024

_EMPTY = np.zeros(0, np.float32)


def check_speed(speed: float) -> float:
    """`speed` as a float, or a ForgeError when it is not a number in [MIN_SPEED, MAX_SPEED]."""
    if isinstance(speed, (bool, np.bool_)) or not isinstance(speed, numbers.Real) or not math.isfinite(speed) \
            or not MIN_SPEED <= speed <= MAX_SPEED:
        raise BadInput(f"speed must be a number in [{MIN_SPEED}, {MAX_SPEED}], got {speed!r}")
    return float(speed)


def stage_factors(speed: float) -> list[float]:
    """`speed` as a product of atempo factors, each within [STAGE_MIN, STAGE_MAX]."""
    factors = []
    rest = speed
    while rest > STAGE_MAX:
        factors.append(STAGE_MAX)
        rest /= STAGE_MAX
    while rest < STAGE_MIN:
        factors.append(STAGE_MIN)
        rest /= STAGE_MIN
    return [*factors, rest]


def _import_av() -> Any:
    try:
        # av (PyAV): only for a speed change; 88 ms to import
        import av
        import av.filter
    except ModuleNotFoundError:
        raise ForgeError("a speed other than 1 needs PyAV, in the serve extra: "
                         "pip install 'chattts-forge[serve]'") from None
    return av


class Stretcher:
    """A stream's time-scale change: `push(chunk)` returns the output ready so far, `flush()` the rest.

    The outputs of every `push` and the `flush`, concatenated, equal `stretch(whole input)` exactly,
    whatever the chunk sizes; their total is round(input samples / speed). speed 1 passes the chunks
    through unchanged."""

    def __init__(self, speed: float, sample_rate: int) -> None:
        self.speed = check_speed(speed)
        self.sample_rate = int(sample_rate)
        self.samples_in = 0
        self.samples_out = 0
        self.samples_fed = 0  # input given to the filter
        self._held: list[np.ndarray] = []  # filter output beyond what the input so far allows
        self._pending = _EMPTY  # input not yet a whole BLOCK
        self._flushed = False
        self._graph: Any = None
        if self.speed != 1.0:
            self._av = _import_av()
            self._graph = self._build()

    def _build(self) -> Any:
        av = self._av
        graph = av.filter.Graph()
        node = graph.add_abuffer(format="flt", sample_rate=self.sample_rate, layout="mono",
                                 time_base=f"1/{self.sample_rate}")
        for factor in stage_factors(self.speed):
            stage = graph.add("atempo", f"{factor:.17g}")
            node.link_to(stage)
            node = stage
        sink = graph.add("abuffersink")
        node.link_to(sink)
        graph.configure()
        return graph

    def _drain(self) -> None:
        av = self._av
        while True:
            try:
                frame = self._graph.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                return
            self._held.append(frame.to_ndarray().reshape(-1).astype(np.float32, copy=False))

    def _feed(self, block: np.ndarray) -> None:
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(block).reshape(1, -1), format="flt",
                                                 layout="mono")
        frame.sample_rate = self.sample_rate
        frame.time_base = Fraction(1, self.sample_rate)
        frame.pts = self.samples_fed
        self.samples_fed += len(block)
        self._graph.push(frame)
        self._drain()

    def _release(self, limit: int) -> np.ndarray:
        """Held output up to `limit` samples in all (the rest stays held)."""
        held = np.concatenate(self._held) if self._held else _EMPTY
        n = max(0, min(len(held), limit - self.samples_out))
        out, rest = held[:n], held[n:]
        self._held = [rest] if len(rest) else []
        self.samples_out += n
        return out

    def push(self, chunk: np.ndarray) -> np.ndarray:
        if self._flushed:
            raise ForgeError("Stretcher.push after flush")
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self._graph is None:
            self.samples_in += len(chunk)
            self.samples_out += len(chunk)
            return chunk
        self.samples_in += len(chunk)
        pending = np.concatenate([self._pending, chunk]) if len(self._pending) else chunk
        whole = len(pending) - len(pending) % BLOCK
        for start in range(0, whole, BLOCK):
            self._feed(pending[start:start + BLOCK])
        self._pending = pending[whole:].copy()
        # never past the final length, so the flush can always cut the total to it exactly
        return self._release(round(self.samples_in / self.speed))

    def flush(self) -> np.ndarray:
        """The rest of the output; the total is then round(input samples / speed), the filter's tail
        cut or padded with silence by the few samples it is off."""
        if self._flushed:
            return _EMPTY
        self._flushed = True
        if self._graph is None:
            return _EMPTY
        if len(self._pending):
            self._feed(self._pending)
            self._pending = _EMPTY
        if self.samples_in:
            self._graph.push(None)
            self._drain()
        total = round(self.samples_in / self.speed)
        out = self._release(total)
        if self.samples_out < total:
            out = np.concatenate([out, np.zeros(total - self.samples_out, np.float32)])
            self.samples_out = total
        self._held = []
        return out


def stretch(wav: np.ndarray, speed: float, sample_rate: int) -> np.ndarray:
    """`wav` (mono) played at `speed` with its pitch kept: round(len / speed) float32 samples; speed 1
    returns `wav` itself."""
    if check_speed(speed) == 1.0:
        return wav
    stretcher = Stretcher(speed, sample_rate)
    head = stretcher.push(wav)
    return np.concatenate([head, stretcher.flush()])
