"""Logging set-up shared by every command: one format, to stderr, level from --verbose."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from chattts_forge.errors import printable

_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class EscapingFormatter(logging.Formatter):
    """One line per record: control characters of the message (user text a server logs, say) are
    escaped (`\\n`, `\\x1b`), so no input can forge log lines or drive a terminal; tracebacks stay."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)


def setup_logging(verbose: int = 0) -> None:
    level = logging.WARNING if verbose < 0 else logging.INFO if verbose == 0 else logging.DEBUG
    logging.basicConfig(level=level, format=_FORMAT, datefmt="%H:%M:%S", force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(EscapingFormatter(_FORMAT, datefmt="%H:%M:%S"))
    # Third-party libraries are chatty at INFO; keep them at WARNING unless debugging.
    for noisy in ("ChatTTS", "transformers", "onnxruntime", "faster_whisper", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose > 1 else logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


@contextlib.contextmanager
def quiet_logger(name: str = "chattts_forge.runtime", enabled: bool = True) -> Iterator[None]:
    """Raise logger `name` to ERROR for the duration (when `enabled`), then restore its level.

    Used where the runtime's per-sentence warnings are expected noise: random-weight checkpoints
    rarely emit EOS, and benchmarks run every row to max_new_token on purpose.
    """
    logger = logging.getLogger(name)
    old = logger.level
    if enabled:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)
