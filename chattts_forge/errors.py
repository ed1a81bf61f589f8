"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class ForgeError(Exception):
    """A user-facing failure: bad input, a broken file, a failed check.

    The message must be a single line that names what is wrong and, where possible, what to do.
    """


class ArtifactChanged(ForgeError):
    """A file of an opened artifact no longer matches its record (missing, other size, other sha256):
    the folder changed on disk after it was loaded, which a server reports as its own failure."""


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
