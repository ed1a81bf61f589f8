"""What the server answers a failed request with: the refusals it decides itself (each a ForgeError type
with its status and its error body's `code`) and `error_body`, the OpenAI-style JSON error it sends.

The app installs one exception handler for ForgeError (serve.app `_Handlers.forge_error`): a raise
anywhere in an endpoint becomes `error_body(http_status_of(error, default), ...)`, so no endpoint
picks a status in an `except` clause. An untyped ForgeError takes its endpoint's default (`UNTYPED_STATUS`
by the request's phase): 400 for a speech request being checked, 500 once it is queued (the server's
own failure), 422 for an admin action (understood, but it cannot be done).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from chattts_forge.errors import BadInput, Busy, ForgeError, Unavailable, printable

# the status of an untyped ForgeError, by where the request is (`request.state.phase`)
UNTYPED_STATUS = {"checking": 400, "submitting": 400, "queued": 500, "admin": 422}
MESSAGE_CHARS = 300  # an error message is cut to this (bad values inside are quoted to ~100 already)


def error_body(
    status: int, message: str, code: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`, one line of message."""
    etype = "invalid_request_error" if 400 <= status < 500 and status != 429 else code
    line = printable(message.splitlines()[0]) if message.strip() else code
    if len(line) > MESSAGE_CHARS:
        line = line[:MESSAGE_CHARS] + "..."
    body = {
        "error": {
            "message": line,
            "type": etype,
            "param": None if param is None else printable(param),
            "code": code,
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


class Refusal(ForgeError):
    """A refusal the server decides itself: its type's `http_status` and `code` (the error body's), and
    the response `headers` it carries (Retry-After, Connection: close)."""

    code = "refused"

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers


class NotReady(Refusal, Unavailable):
    """Loading, draining, failed or mid-swap: retry later (with Retry-After)."""

    code = "not_ready"


class ShortOfMemory(Refusal, Unavailable):
    """The memory guard refused a miss: retry later (with Retry-After)."""

    code = "memory"


class QueueFull(Refusal, Busy):
    """The variant's queue is full: retry in about Retry-After seconds."""

    code = "queue_full"


class DeadlinePassed(Refusal):
    """The request's deadline passed before any audio was sent."""

    http_status = 504
    code = "deadline"


class CrossOrigin(Refusal):
    """A speech request from a web page whose Origin --cors-origin does not allow."""

    http_status = 403
    code = "cross_origin"


class NotJson(Refusal):
    """A speech request whose body is not declared JSON (a page may POST text/plain cross-site)."""

    http_status = 415
    code = "content_type"


class AdminRefused(Refusal):
    """An /admin/* request refused before its body is read: a foreign Host or Origin (403), no token
    (401, with WWW-Authenticate), a body not declared JSON (415)."""

    code = "admin"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": "Bearer"} if status == 401 else None)
        self.http_status = status


class BodyTooLarge(Refusal, BadInput):
    """More than `max_body_bytes` (413; the connection is closed, the rest of the body unread)."""

    http_status = 413
    code = "too_large"

    def __init__(self, message: str) -> None:
        super().__init__(message, {"Connection": "close"})
        self.param = None


class BodyTimeout(Refusal):
    """The body did not arrive within `body_timeout_s` (408; counted as a client disconnect)."""

    http_status = 408
    code = "disconnect"

    def __init__(self, message: str) -> None:
        super().__init__(message, {"Connection": "close"})


class ClientGone(Refusal):
    """The client went away: nobody to answer (499, no body; counted as a disconnect)."""

    http_status = 499
    code = "disconnect"


def param_of(error: ForgeError) -> Any:
    """The request field an error names (BadInput's `param`, InputError's `input`), else None."""
    return getattr(error, "param", None)
