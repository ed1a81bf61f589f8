"""The project's exceptions: one base the CLI turns into a one-line error and a non-zero exit, and a
small hierarchy under it whose type (never its message) tells the CLI and the server what to answer.

    ForgeError            a user-facing failure (one line: what is wrong and, where possible, what to do)
    ├── BadInput          an argument, option, request field or input file the command cannot take
    ├── IntegrityError    a file does not match its record (missing, other size, other sha256)
    │   └── ArtifactChanged   ... of an artifact already opened: the folder changed on disk
    ├── NotFound          a named thing (file, folder, model, voice) does not exist
    ├── Conflict          the request contradicts the state it acts on (a reload while one runs)
    ├── Busy              no capacity now (a full queue); the same request later may succeed
    └── Unavailable       the service cannot take it now (closing, not ready); retry elsewhere or later

Each class carries `exit_code` (what the CLI exits with: 2 for every refusal, the documented
contract, kept) and `http_status` (what the server answers; None: the endpoint's own default, e.g.
400 for a request it parses, 422 for an admin action it refuses).
"""


class ForgeError(Exception):
    """A user-facing failure: bad input, a broken file, a failed check.

    The message must be a single line that names what is wrong and, where possible, what to do.
    """

    exit_code: int = 2
    http_status: int | None = None


class BadInput(ForgeError):
    """An argument, option, request field or input file the command cannot take. `param`: the request
    field at fault (a server's error names it), None where no one field is."""

    http_status = 400

    def __init__(self, message: str = "", param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class IntegrityError(ForgeError):
    """A file does not match its record (missing, another size, another sha256): damaged or replaced.
    In a server, a file of the artifact it serves: its own failure, not the request's."""

    http_status = 500


class ArtifactChanged(IntegrityError):
    """A file of an opened artifact no longer matches its record (missing, other size, other sha256):
    the folder changed on disk after it was loaded, which a server reports as its own failure."""


class NotFound(ForgeError):
    """A named thing (a file, a folder, a model, a voice) does not exist."""

    http_status = 404


class Conflict(ForgeError):
    """The request contradicts the state it acts on (e.g. a reload while another one runs)."""

    http_status = 409


class Busy(ForgeError):
    """No capacity now (a full queue): the same request may succeed later."""

    http_status = 429


class Unavailable(ForgeError):
    """The service cannot take the request now (closing, not ready): retry later or elsewhere."""

    http_status = 503


def http_status_of(error: ForgeError, default: int) -> int:
    """The HTTP status a server answers `error` with: its type's, else the endpoint's `default` (the
    server's one ForgeError handler is its caller: runtime.serve.app)."""
    return error.http_status if error.http_status is not None else default


QUOTE_CHARS = 100  # how much of a bad value an error message or a log line shows


def _escaped(c: str) -> str:
    if 0xD800 <= ord(c) <= 0xDFFF:  # a lone surrogate (JSON allows "\ud800"; UTF-8 cannot encode it)
        return f"\\u{ord(c):04x}"
    return c.encode("unicode_escape").decode("ascii")


def printable(text: str) -> str:
    """`text` with control (and other unprintable) characters and lone surrogates escaped (`\\x1b`,
    `\\n`, `\\ud800`), so user text cannot forge log lines or break a UTF-8 encoder."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)`, cut to about `limit` characters (with how long it was), for error messages."""
    text = printable(repr(value))
    if len(text) <= limit:
        return text
    size = f"{len(value)} chars" if isinstance(value, str) else f"{len(text)} chars as written"
    return f"{text[:limit]}... ({size})"
