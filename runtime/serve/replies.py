"""The parts of a speech reply: a queued miss being answered (`Job`), waiting on its scheduler handle
from asyncio (`Waiter`), the usage an SSE reply reports, its headers and SSE events, and the pause
between a long input's segments (serve.app answers with them)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import queue
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chattts_forge.runtime.request_handle import Handle
from chattts_forge.runtime.segments import SEGMENT_PAUSE_SECONDS
from chattts_forge.runtime.serve.engine import Prepared, ServedVersion
from chattts_forge.runtime.serve.guard import Reservation
from chattts_forge.runtime.serve.requests import SpeechRequest

_WAKE_S = 0.25  # a waiting handler wakes at least this often to check its deadline and its client


class Deadline(Exception):
    """A request's deadline passed while its handler waited."""


class Disconnected(Exception):
    """The client went away while its handler waited."""


@dataclass
class Job:
    """A queued miss being answered (its stream or its whole response)."""

    endpoint: str
    req: SpeechRequest
    prep: Prepared
    version: ServedVersion
    handle: Handle
    waiter: Waiter
    t0: float
    deadline: float
    reservation: Reservation | None = None  # its bytes in the memory guard's ledger, released at the end
    usage: Usage = field(default_factory=lambda: Usage(0, 0))

    def spoken(self, seg: Prepared, result: Any) -> None:
        """Count a finished segment (or the whole request) in the usage: its text tokens, its code steps."""
        self.usage.input_tokens += self.version.text_tokens(seg)
        self.usage.output_tokens += len(result.codes)


@dataclass
class Usage:
    """What a reply's SSE `speech.audio.done` event reports: `input_tokens`, the tokens of the input
    text as spoken (normalised, before refinement; ChatTTS's tokenizer); `output_tokens`, the audio
    tokens generated (code steps, each 2 mel frames) that the reply holds."""

    input_tokens: int
    output_tokens: int

    def event(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens}


class Waiter:
    """Waits for a handle's next chunk from asyncio: woken by the handle's listener, not by polling."""

    def __init__(self, handle: Handle, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = handle
        self.loop = loop
        self.event = asyncio.Event()
        handle.add_listener(self._wake)

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self.loop.call_soon_threadsafe(self.event.set)

    async def next(self, deadline: float, request: Any | None) -> np.ndarray | None:
        """The next chunk (None at the end); raises the request's ForgeError, Deadline, Disconnected."""
        while True:
            self.event.clear()
            try:
                return self.handle.next_chunk(0)
            except queue.Empty:
                pass
            await self._sleep(deadline, request)

    async def until_done(self, deadline: float, request: Any | None) -> None:
        while not self.handle.done():
            self.event.clear()
            if self.handle.done():
                return
            await self._sleep(deadline, request)

    async def _sleep(self, deadline: float, request: Any | None) -> None:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise Deadline()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout=min(left, _WAKE_S))
        if request is not None and await request.is_disconnected():
            raise Disconnected()


def reply_headers(version: ServedVersion, prep: Prepared, cached: bool) -> dict[str, str]:
    """Which version and variant answered, whether from a phrase cache, how many segments were spoken
    and which characters of the input could not be spoken (percent-encoded UTF-8, when any)."""
    headers = {"X-Forge-Model": version.model_id, "X-Forge-Variant": prep.served_by or prep.variant,
               "X-Forge-Cached": str(cached).lower(), "X-Forge-Segments": str(1 + len(prep.rest))}
    if prep.removed:
        headers["X-Forge-Removed"] = urllib.parse.quote(prep.removed, safe="")
    return headers


def queue_segment(job: Job, seg: Prepared) -> Waiter:
    """Queue a long input's next segment (or half of one) as `job`'s current request; its waiter."""
    job.handle = job.version.submit(seg)
    job.waiter = Waiter(job.handle, asyncio.get_running_loop())
    return job.waiter


def segment_pause(version: ServedVersion, prep: Prepared) -> np.ndarray:
    """The silence between two segments of a long input (runtime.segments.SEGMENT_PAUSE_SECONDS)."""
    return np.zeros(int(SEGMENT_PAUSE_SECONDS * version.pipes[prep.variant].sample_rate), dtype=np.float32)


def sse_delta(data: bytes) -> bytes:
    event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}
    return f"data: {json.dumps(event)}\n\n".encode()


def sse_done(usage: Usage) -> bytes:
    return f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage.event()})}\n\n".encode()


def sse_error(message: str) -> bytes:
    return f"data: {json.dumps({'type': 'error', 'error': {'message': message.splitlines()[0]}})}\n\n".encode()
