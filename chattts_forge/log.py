"""Logging set-up shared by every command: one format, to stderr, level from --verbose."""

from __future__ import annotations

import logging

_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(verbose: int = 0) -> None:
    level = logging.WARNING if verbose < 0 else logging.INFO if verbose == 0 else logging.DEBUG
    logging.basicConfig(level=level, format=_FORMAT, datefmt="%H:%M:%S", force=True)
    # Third-party libraries are chatty at INFO; keep them at WARNING unless debugging.
    for noisy in ("ChatTTS", "transformers", "onnxruntime", "faster_whisper", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose > 1 else logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
