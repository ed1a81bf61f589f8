"""The ASGI app (Starlette): OpenAI-compatible speech, the ChatTTS-native endpoint, health, metrics, admin.

Endpoints (docs/serving.md "The server"):

- `POST /v1/audio/speech` (OpenAI), `POST /v1/chattts/speech` (ChatTTS's knobs; serve.requests);
- `GET /v1/models`, `GET /v1/voices`, `GET /healthz` (the process answers), `GET /readyz` (200 only
  once the version is loaded, verified and warmed, and not draining), `GET /metrics` (serve.metrics);
- `POST /admin/reload {"artifact": DIR}`, `POST /admin/promote {}`, `POST /admin/rollback {}`: with
  `Authorization: Bearer TOKEN` (`admin_token`, or the one generated at start into a 0600 file whose
  path is logged; loopback clients without one only with `admin_loopback`), `Content-Type:
  application/json` and a JSON object body, and no foreign `Host` or `Origin` (what a web page in a
  browser on the serving host would send).

Bodies: at most `max_body_bytes` (413), received within `body_timeout_s` (else 408, counted as a
client disconnect), valid JSON however deep (400). A file of the served version that changed on disk
(found when a session or variant is opened) is a 500 `artifact_changed` naming it, and /readyz turns
503 until a reload succeeds. Error messages are one line of at most `refusals.MESSAGE_CHARS` characters.

A request: checked (400, one JSON line), prepared on a worker thread (normalise, route, refine,
phrase-cache look-ups: a hit is answered whole at once), queued on its variant's scheduler (429 with
Retry-After when the queue is full), then answered from its first final chunk on (chunked; `stream:
false` waits and decodes the whole waveform, as `synth`). The handler waits on the scheduler through
a listener (no polling, no thread per request); a client that disconnects cancels its request, whose
row is freed before the next GPT step; past its deadline a request is cancelled too (504 before any
audio was sent, a cut stream after). No lock is held across requests: only text refinement, which
runs on the variant's one GPT step, is serialised per variant.

Versions, reloads and the memory guard's actions are the server's state (serve.state, `ServerState`);
who may call what is serve.access; a reply's parts (waiting on the scheduler, usage, headers, SSE
events) are serve.replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from chattts_forge.errors import ArtifactChanged, ForgeError, http_status_of, quote
from chattts_forge.log import get_logger
from chattts_forge.runtime.request_handle import QueueFullError, SchedulerClosedError
from chattts_forge.runtime.segments import halve
from chattts_forge.runtime.serve.access import check_admin, check_cross_site, reload_path
from chattts_forge.runtime.serve.engine import Prepared, ServedVersion
from chattts_forge.runtime.serve.formats import StreamEncoder, content_type, encode_whole
from chattts_forge.runtime.serve.guard import Reservation
from chattts_forge.runtime.serve.refusals import (
    UNTYPED_STATUS,
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    DeadlinePassed,
    NotReady,
    QueueFull,
    Refusal,
    ShortOfMemory,
    error_body,
    param_of,
)
from chattts_forge.runtime.serve.replies import (
    Deadline,
    Disconnected,
    Job,
    Usage,
    Waiter,
    queue_segment,
    reply_headers,
    segment_pause,
    sse_delta,
    sse_done,
    sse_error,
)
from chattts_forge.runtime.serve.requests import BadRequest, SpeechRequest, parse_native, parse_openai
from chattts_forge.runtime.serve.state import ServerState
from chattts_forge.runtime.tempo import Stretcher, stretch
from chattts_forge.runtime.textfront import InputError

log = get_logger(__name__)

# the response headers a web page allowed by --cors-origin may read
EXPOSED_HEADERS = ("X-Forge-Model", "X-Forge-Variant", "X-Forge-Cached", "X-Forge-Segments", "X-Forge-Removed",
                   "Retry-After")



class _Handlers:
    """The app's endpoints over one ServerState (bound methods are the routes)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.cfg = state.cfg
        self.metrics = state.metrics

    def routes(self) -> list[Any]:
        return [
            Route("/v1/audio/speech", self.speech_openai, methods=["POST"]),
            Route("/v1/chattts/speech", self.speech_native, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/voices", self.voices, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/admin/reload", self.admin_reload, methods=["POST"]),
            Route("/admin/promote", self.admin_promote, methods=["POST"]),
            Route("/admin/rollback", self.admin_rollback, methods=["POST"]),
        ]

    def exception_handlers(self) -> dict[Any, Any]:
        return {404: self.not_found, 405: self.method_not_allowed, ForgeError: self.forge_error,
                Exception: self.internal}

    # ---- helpers ----------------------------------------------------------------------------

    def count(self, endpoint: str, status: int) -> None:
        self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.cfg.retry_after_s)}

    async def read_body(self, request: Any) -> bytes:
        """The request body: at most `max_body_bytes` (413), in `body_timeout_s` (408: a body shorter
        than its Content-Length, or a client that went away, is a disconnect, not a server error)."""
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"the body has {int(declared)} bytes; at most {limit} are accepted")
        chunks: list[bytes] = []
        size = 0

        async def receive() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(f"the body has more than {limit} bytes")
                chunks.append(chunk)

        try:
            await asyncio.wait_for(receive(), timeout=self.cfg.body_timeout_s)
        except asyncio.TimeoutError:
            log.info("%s: %d of %s body bytes came in %.1f s; treated as a disconnect", request.url.path, size,
                     declared or "?", self.cfg.body_timeout_s)
            raise BodyTimeout(f"the body did not arrive within {self.cfg.body_timeout_s:g} s "
                              f"({size} of {declared or 'unknown'} bytes)") from None
        except ClientDisconnect:
            raise ClientGone("the client disconnected while sending the body") from None
        return b"".join(chunks)

    async def read_json(self, request: Any) -> Any:
        raw = await self.read_body(request)
        try:
            return json.loads(raw)
        except RecursionError:
            raise BadRequest("the body nests too deeply to be read") from None
        except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, and ints past the digit limit
            raise BadRequest(f"the body is not valid JSON ({str(e)[:100]})") from None

    # ---- speech -----------------------------------------------------------------------------

    async def speech_openai(self, request: Any) -> Any:
        return await self.speech(request, "openai")

    async def speech_native(self, request: Any) -> Any:
        return await self.speech(request, "native")

    async def speech(self, request: Any, kind: str) -> Any:
        """Check, prepare and queue one request; answer a hit whole, a miss streamed or whole. A refusal
        is raised: the one ForgeError handler (`forge_error`) answers it."""
        state = self.state
        t0 = time.perf_counter()
        request.state.phase = "checking"
        check_cross_site(request, self.cfg)
        if not state.ready or state.draining or state.current is None:
            why = ("the server is draining" if state.draining
                   else state.fault or state.load_error or "the model is still loading")
            raise NotReady(why, self.retry_after())
        version = state.acquire()
        request.state.version = version  # the handler reports an ArtifactChanged of this version
        streaming = False
        try:
            req = await self._parse(request, kind, version)
            endpoint = request.url.path
            response = await self._answer(request, endpoint, req, version, t0)
            streaming = isinstance(response, _StreamStarted)
            return response.response if streaming else response
        finally:
            if not streaming:  # a started stream ends the request itself
                version.end()

    async def _parse(self, request: Any, kind: str, version: ServedVersion) -> SpeechRequest:
        body = await self.read_json(request)
        if kind == "openai":
            req = parse_openai(body, version.default_params, self.cfg.max_input_chars)
        else:
            req = parse_native(body, self.cfg.max_input_chars, version.default_params.code.seed)
        if req.params.code.spk_emb is None:
            spk = version.speaker_for(req.voice)
            req.params = replace(req.params, code=replace(req.params.code, spk_emb=spk))
        return req

    async def _answer(self, request: Any, endpoint: str, req: SpeechRequest, version: ServedVersion,
                      t0: float) -> Any:
        """The response of a parsed request (a `_StreamStarted` once a stream owns the request's end)."""
        loop = asyncio.get_running_loop()
        prep = await loop.run_in_executor(self.state.work, version.prepare, req.text, req.params, req.model)
        prep.lookahead = req.stream_lookahead
        if prep.pending is not None and not req.stream:  # a whole reply: every segment known and checked first
            await loop.run_in_executor(self.state.work, version.finish_segments, prep)
        deadline = t0 + (req.deadline_s if req.deadline_s is not None else self.cfg.deadline_s)
        if prep.wav is not None:  # a phrase-cache hit: the whole waveform at once
            self._count_text(prep)
            self.metrics.cache_hits.labels(tier=prep.cache_tier or "file").inc()
            usage = Usage(version.text_tokens(prep), version.code_steps_of(prep, prep.wav))
            return self._whole(endpoint, req, prep, prep.wav, version, t0, usage, cached=True)
        self.metrics.cache_misses.labels(tier="file" if version.file_cache is not None else "none").inc()
        guard = self.state.guard
        reservation: Reservation | None = None
        if guard is not None:
            need = version.request_memory(prep)
            whole_decode = not req.stream or version.redis is not None  # a stream decodes windows only
            reservation = guard.admits(len(prep.text), self.state.misses_in_flight(), self.state.batch_limit(),
                                       need.held, need.decode if whole_decode else 0)
            if reservation is None:
                sched = version.schedulers[prep.variant]
                wait_s = self.state.retry_after(prep.variant, sched.waiting + sched.running)
                raise ShortOfMemory(f"the server is short of memory (RSS {guard.last_rss >> 20} MiB, "
                                    f"limit {guard.limit >> 20} MiB): retry in about {wait_s} s",
                                    {"Retry-After": str(wait_s)})
        streaming = False
        try:
            response = await self._miss(request, endpoint, req, prep, version, t0, deadline, reservation)
            streaming = isinstance(response, _StreamStarted)
            return response
        finally:
            if reservation is not None and not streaming:  # a started stream releases it at its end
                reservation.release()

    async def _miss(self, request: Any, endpoint: str, req: SpeechRequest, prep: Prepared, version: ServedVersion,
                    t0: float, deadline: float, reservation: Reservation | None) -> Any:
        """Queue an admitted miss and answer it (a `_StreamStarted` once its stream owns the request's end)."""
        loop = asyncio.get_running_loop()
        request.state.phase = "submitting"
        try:
            handle = version.submit(prep)
        except QueueFullError as e:  # the Retry-After of this variant's measured drain rate
            waiting = version.schedulers[prep.variant].waiting
            wait_s = self.state.retry_after(prep.variant, waiting)
            raise QueueFull(f"{e} (the queue drains in about {wait_s} s at the measured rate)",
                            {"Retry-After": str(wait_s)}) from None
        except SchedulerClosedError as e:  # a swap raced this request
            raise NotReady(str(e), self.retry_after()) from None
        request.state.phase = "queued"
        job = Job(endpoint, req, prep, version, handle, Waiter(handle, loop), t0, deadline, reservation)
        started = False
        try:
            if not req.stream:
                await job.waiter.until_done(deadline, request)
                wav = await self._spoken_whole(job, prep, handle.result(), request)
                if prep.rest:
                    wav = await self._later_segments(job, wav, request)
                self._count_text(prep)
                return self._whole(endpoint, req, prep, wav, version, t0, job.usage, cached=False)
            rest = (loop.run_in_executor(self.state.work, version.finish_segments, prep)
                    if prep.pending is not None else None)  # the rest of a long input, beside its first segment
            first = await job.waiter.next(deadline, request)
            if rest is not None:
                request.state.phase = "checking"  # the later segments' text is still the request's to fix
                await rest
            started = True
        except Deadline:
            raise DeadlinePassed(f"request deadline of {deadline - t0:.1f} s passed before any audio") from None
        except Disconnected:
            raise ClientGone("the client disconnected") from None
        finally:
            if not started and not job.handle.done():  # refused or failed before a stream took it over
                job.handle.cancel()
        self._count_text(prep)
        media = "text/event-stream" if req.stream_format == "sse" else content_type(req.response_format)
        return _StreamStarted(StreamingResponse(self._stream(job, first), media_type=media,
                                                headers=reply_headers(version, prep, cached=False)))

    def _count_text(self, prep: Prepared) -> None:
        """/metrics: the characters of a request's text that could not be spoken, the segments spoken."""
        if prep.removed:
            self.metrics.removed_chars.inc(len(prep.removed))
        self.metrics.segments.inc(1 + len(prep.rest))

    async def _later_segments(self, job: Job, wav: np.ndarray, request: Any) -> np.ndarray:
        """A long input's whole waveform: its later segments generated in turn after the first (`wav`),
        a pause between each two."""
        loop = asyncio.get_running_loop()
        parts = [wav]
        for k in range(len(job.prep.rest)):
            seg = await loop.run_in_executor(self.state.work, job.version.segment, job.prep, k)
            await queue_segment(job, seg).until_done(job.deadline, request)
            parts += [segment_pause(job.version, job.prep), await self._spoken_whole(job, seg, job.handle.result(), request)]
        return np.concatenate(parts).astype(np.float32)

    async def _spoken_whole(self, job: Job, seg: Prepared, result: Any, request: Any, depth: int = 2) -> np.ndarray:
        """One segment's whole waveform. A segment that reached the default code-step cap (a real
        checkpoint's row that never ended) is cut in two and generated again, up to `depth` times;
        one that still cannot be spoken is an InputError (400, `param: input`), never a cut reply."""
        loop = asyncio.get_running_loop()
        if not job.version.hit_cap(seg, result):
            job.spoken(seg, result)
            return await loop.run_in_executor(self.state.work, job.version.whole_wav, seg, result)
        halves = halve(seg.text)
        if depth == 0 or len(halves) < 2:
            raise InputError(f"the segment {seg.text[:40]!r} cannot be spoken within {seg.params.code.max_new_token} "
                             "code steps; shorten it or add punctuation")
        log.info("request %d: a segment hit the code-step cap: cut in two and generated again", job.handle.id)
        parts: list[np.ndarray] = []
        for half in halves:
            sub = Prepared(seg.variant, half, seg.params, key_text=half, lookahead=seg.lookahead)
            await queue_segment(job, sub).until_done(job.deadline, request)
            if parts:
                parts.append(segment_pause(job.version, seg))
            parts.append(await self._spoken_whole(job, sub, job.handle.result(), request, depth - 1))
        return np.concatenate(parts).astype(np.float32)

    def _whole(self, endpoint: str, req: SpeechRequest, prep: Prepared, wav: np.ndarray, version: ServedVersion,
               t0: float, usage: Usage, cached: bool) -> Any:
        sr = version.pipes[prep.variant].sample_rate
        wav = stretch(wav, req.speed, sr)  # a cached waveform too: it is the speed-1 synthesis
        data = encode_whole(wav, sr, req.response_format)
        took = time.perf_counter() - t0
        if not cached:
            self.state.drain_rate(prep.variant).completed()
        self.metrics.first_audio.observe(took)
        self.metrics.served(took, len(wav) / sr, cached)
        self.count(endpoint, 200)
        headers = reply_headers(version, prep, cached)
        if req.stream_format == "sse":
            events = sse_delta(data) + sse_done(usage)
            return Response(events, media_type="text/event-stream", headers=headers)
        return Response(data, media_type=content_type(req.response_format), headers=headers)

    async def _stream(self, job: Job, first: np.ndarray | None) -> AsyncIterator[bytes]:
        """The response body of a streamed miss, from its first final chunk; the request ends here."""
        req, handle, metrics = job.req, job.handle, self.metrics
        later = 0  # a long input's later segments already submitted
        sr = job.version.pipes[job.prep.variant].sample_rate
        enc = StreamEncoder(req.response_format, sr)
        sse = req.stream_format == "sse"
        samples = 0
        finished = False
        first_sent = False
        current = job.prep  # the segment being spoken
        try:
            stretcher = Stretcher(req.speed, sr)  # in the try: a failure still releases the request
            chunk = first
            while chunk is not None:
                out = stretcher.push(chunk)
                data = enc.write(out)
                samples += len(out)
                if data:
                    if not first_sent and len(out):
                        metrics.first_audio.observe(time.perf_counter() - job.t0)
                        first_sent = True
                    yield sse_delta(data) if sse else data
                # headers (200) are sent: a failure from here on can only cut the stream (an SSE stream
                # ends with an error event), never change the status, so it is answered here
                try:
                    chunk = await job.waiter.next(job.deadline, None)
                    if chunk is None:
                        job.spoken(current, handle.result())
                    if chunk is None and later < len(job.prep.rest):  # the next segment, after a pause
                        current = await asyncio.get_running_loop().run_in_executor(
                            self.state.work, job.version.segment, job.prep, later)
                        later += 1
                        handle = queue_segment(job, current).handle
                        chunk = segment_pause(job.version, job.prep)
                except (QueueFullError, SchedulerClosedError) as e:
                    metrics.errors.labels(kind="queue_full").inc()
                    log.warning("request %d: its next segment was refused (%s); stream cut", handle.id, e)
                    if sse:
                        yield sse_error(f"the next segment could not be queued: {e}")
                    return
                except Deadline:
                    handle.cancel()
                    metrics.errors.labels(kind="deadline").inc()
                    log.warning("request %d: deadline passed mid-stream; stream cut", handle.id)
                    if sse:
                        yield sse_error("deadline passed mid-stream")
                    return
                except ForgeError as e:
                    if isinstance(e, ArtifactChanged) and job.version in (self.state.current, self.state.canary):
                        self.state.artifact_changed(e)
                    metrics.errors.labels(kind="artifact_changed" if isinstance(e, ArtifactChanged)
                                          else "internal").inc()
                    log.error("request %d failed mid-stream: %s", handle.id, e)
                    if sse:
                        yield sse_error(str(e))
                    return
            rest = stretcher.flush()
            samples += len(rest)
            tail = enc.write(rest) + enc.close() if len(rest) else enc.close()
            if tail:
                if not first_sent and samples:  # a buffered format (flac, mp3) sends its audio only now
                    metrics.first_audio.observe(time.perf_counter() - job.t0)
                yield sse_delta(tail) if sse else tail
            if sse:
                yield sse_done(job.usage)
            finished = True
            self.state.drain_rate(job.prep.variant).completed()
            took = time.perf_counter() - job.t0
            metrics.served(took, samples / sr, False)
            self.count(job.endpoint, 200)
            if job.version.redis is not None and not job.prep.rest:  # fill the shared cache from the finished request
                asyncio.get_running_loop().run_in_executor(self.state.work, job.version.whole_wav, job.prep,
                                                           handle.result())
        finally:
            if not finished and not handle.done():
                handle.cancel()  # the client went away: its row is freed before the next GPT step
                metrics.errors.labels(kind="disconnect").inc()
                log.info("request %d: client disconnected; cancelled", handle.id)
            if job.reservation is not None:
                job.reservation.release()
            job.version.end()

    # ---- models, health, metrics ------------------------------------------------------------

    async def models(self, request: Any) -> Any:
        current = self.state.current
        if current is None:
            raise NotReady(self.state.load_error or "the model is still loading")
        created = int(Path(current.path).stat().st_mtime)
        data = [{"id": m, "object": "model", "created": created, "owned_by": "chattts-forge"}
                for m in current.model_names()]
        self.count("/v1/models", 200)
        return JSONResponse({"object": "list", "data": data})

    async def voices(self, request: Any) -> Any:
        if self.state.current is None:
            raise NotReady(self.state.load_error or "the model is still loading")
        return JSONResponse({"voices": self.state.current.voices})

    async def healthz(self, request: Any) -> Any:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Any) -> Any:
        state = self.state
        if state.ready and not state.draining and state.current is not None:
            body = {"status": "ready", "model": state.current.model_id,
                    "canary": state.canary.model_id if state.canary else None}
            return JSONResponse(body)
        failure = state.fault or state.load_error
        why = "draining" if state.draining else f"failed: {failure}" if failure else "loading"
        return JSONResponse({"status": why}, status_code=503)

    async def metrics_endpoint(self, request: Any) -> Any:
        data, ctype = self.metrics.render()
        return Response(data, media_type=ctype.split(";")[0], headers={"Content-Type": ctype})

    # ---- admin ------------------------------------------------------------------------------

    async def admin(self, request: Any, action: str) -> Any:
        endpoint = f"/admin/{action}"
        request.state.phase = "admin"
        check_admin(request, self.cfg)
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object ({\"artifact\": DIR} for reload, {} otherwise)")
        if action == "reload":
            path = reload_path(body)
            result = await asyncio.get_running_loop().run_in_executor(None, self.state.reload, path)
        elif body:
            raise BadRequest(f"/admin/{action} takes an empty object {{}}, got field {quote(next(iter(body)))}")
        elif action == "promote":
            result = self.state.promote()
        else:
            result = self.state.rollback()
        self.count(endpoint, 200)
        return JSONResponse(result)

    async def admin_reload(self, request: Any) -> Any:
        return await self.admin(request, "reload")

    async def admin_promote(self, request: Any) -> Any:
        return await self.admin(request, "promote")

    async def admin_rollback(self, request: Any) -> Any:
        return await self.admin(request, "rollback")

    # ---- errors -----------------------------------------------------------------------------

    async def not_found(self, request: Any, exc: Exception) -> Any:
        return error_body(404, f"no route {request.url.path}", "not_found")

    async def method_not_allowed(self, request: Any, exc: Exception) -> Any:
        return error_body(405, f"method {request.method} not allowed on {request.url.path}", "method_not_allowed")

    async def forge_error(self, request: Request, exc: Exception) -> Response:
        """The one answer to a ForgeError raised by an endpoint: its type's status (an untyped one: its
        phase's default, refusals.UNTYPED_STATUS), counted in /metrics by its code."""
        assert isinstance(exc, ForgeError)
        phase = getattr(request.state, "phase", "checking")
        status = http_status_of(exc, UNTYPED_STATUS[phase])
        message, param, headers = str(exc), param_of(exc), None
        if isinstance(exc, Refusal):
            code, headers = exc.code, exc.headers
        elif phase == "admin" and not isinstance(exc, BadRequest):  # the action failed, not its request
            code, param = "reload_failed" if request.url.path == "/admin/reload" else "admin", None
        elif isinstance(exc, ArtifactChanged):
            version = getattr(request.state, "version", None)
            if version is not None and (version is self.state.current or version is self.state.canary):
                self.state.artifact_changed(exc)
            code, message, param = "artifact_changed", f"the served artifact changed on disk: {exc}", None
        elif status >= 500:
            code, param = "internal", None
        else:
            code = "bad_request"
            if param is None and phase == "submitting":  # what the scheduler refuses is the input's
                param = "input"
        self.metrics.errors.labels(kind=code).inc()
        self.count(request.url.path, status)
        if status == 499:  # nobody to answer
            return Response(status_code=499)
        return error_body(status, message, code, param, headers)

    async def internal(self, request: Any, exc: Exception) -> Any:
        log.error("internal error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
        self.metrics.errors.labels(kind="internal").inc()
        return error_body(500, f"internal error ({type(exc).__name__})", "internal")


@dataclass
class _StreamStarted:
    """A streaming response that now owns its request's end (`version.end()` when the body ends)."""

    response: Any


def create_app(state: ServerState, load_in_background: bool = True) -> Any:
    """The Starlette app serving `state` (loading its version at startup unless already loaded)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if state.current is None and load_in_background:
            threading.Thread(target=state.load_initial, name="forge-load", daemon=True).start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.shutdown)

    handlers = _Handlers(state)
    middleware = []
    if state.cfg.cors_origins:  # browsers may read answers (and send preflights) from these origins only
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(state.cfg.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"],
                                     expose_headers=list(EXPOSED_HEADERS), max_age=600))
    app = Starlette(routes=handlers.routes(), lifespan=lifespan, exception_handlers=handlers.exception_handlers(),
                    middleware=middleware)
    app.state.forge = state
    return app
