"""uvicorn's HTTP/1.1 protocol (h11) with what a server facing a network needs before its app runs.

- **Header timeout.** A connection must finish a request's headers within `header_timeout_s` of its
  first byte (or of its opening): uvicorn times out only idle keep-alive connections, so a client
  that never ends its headers (slowloris), or trickles them, held its socket and file descriptor for
  as long as it liked. Closed past the limit: silently when nothing came, with a 408 when some did.
- **Connection bound.** Beyond `max_connections` open connections a new one gets a 503 JSON error
  (`Retry-After`, `Connection: close`) at once and is closed, instead of exhausting the process's
  file descriptors.
- **Malformed requests** (a non-numeric Content-Length, a broken request line or header) get the
  server's JSON error body, not uvicorn's plain text.

Settings come from `uvicorn.Config` attributes set by `server.make_server` (`forge_header_timeout_s`,
`forge_max_connections`, `forge_on_refusal`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def json_error_bytes(status: int, reason: str, message: str, code: str, extra: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response carrying the server's JSON error, with `Connection: close`."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else code,
                                 "param": None, "code": code}}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close", *(f"{k}: {v}" for k, v in (extra or {}).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


class ForgeH11Protocol(H11Protocol):
    """H11Protocol with a header timeout, a connection bound and JSON errors (module docstring)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout_s: float = getattr(config, "forge_header_timeout_s", 5.0)
        self.max_connections: int | None = getattr(config, "forge_max_connections", None)
        self.on_refusal: Callable[[str], None] | None = getattr(config, "forge_on_refusal", None)
        self.header_timer: asyncio.TimerHandle | None = None
        self.header_bytes = 0  # bytes of the request being received while its headers are incomplete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            self._refuse_connection()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting_for_headers = self.conn.their_state is h11.IDLE
        if waiting_for_headers:
            self.header_bytes += len(data)
            if self.header_timer is None:  # a keep-alive connection's next request begins
                self._arm_header_timer()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are complete: the body timeout takes over
            self._disarm_header_timer()
            self.header_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timeout for the idle connection
        self.header_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as the server's JSON error."""
        self._disarm_header_timer()
        if self.on_refusal is not None:
            self.on_refusal("bad_http")
        self.transport.write(json_error_bytes(
            400, "Bad Request", "the request is not valid HTTP/1.1 (a malformed request line or header, e.g. a "
            "non-numeric Content-Length)", "bad_request"))
        self.transport.close()

    def _refuse_connection(self) -> None:
        if self.on_refusal is not None:
            self.on_refusal("too_many_connections")
        self.transport.write(json_error_bytes(
            503, "Service Unavailable", f"the server holds its limit of {self.max_connections} open connections; "
            "retry shortly", "too_many_connections", {"retry-after": "1"}))
        self.transport.close()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self.header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_timed_out(self) -> None:
        self.header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response still being sent (pipelining): its own course
        if self.on_refusal is not None:
            self.on_refusal("header_timeout")
        if self.header_bytes:
            self.transport.write(json_error_bytes(
                408, "Request Timeout", f"the request headers did not arrive within {self.header_timeout_s:g} s",
                "header_timeout"))
        self.transport.close()
