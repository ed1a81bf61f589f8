"""The C heap under the runtime: glibc's malloc arenas capped, free heap pages and a long-lived
buffer's freed rows given back to the kernel (no-ops where this is not glibc / Linux).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np


def _glibc(name: str) -> Any:
    """glibc's function `name` through ctypes, or None where this is not glibc (or it lacks it)."""
    if os.name != "posix":
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _glibc("malloc_trim")
_MADVISE = _glibc("madvise") if sys.platform.startswith("linux") else None
if _MADVISE is not None:
    _MADVISE.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_DONTNEED = 4  # Linux: the pages go back to the kernel; private anonymous memory reads as zeros after
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def cap_malloc_arenas(count: int) -> bool:
    """Cap glibc's malloc arenas at `count` (mallopt M_ARENA_MAX) unless MALLOC_ARENA_MAX is set in the
    environment (the operator's choice stands); False where this is not glibc.

    glibc gives threads that allocate at once arenas of their own, up to eight per core, and each
    arena keeps the buffers freed into it: a server's request, decode and onnxruntime threads spread
    one working set over many arenas. Call it before those threads start. Figures:
    docs/measurements/2026-12-05-xeon/heap/README.md.
    """
    mallopt = _glibc("mallopt")
    if mallopt is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(mallopt(_M_ARENA_MAX, max(1, count)))


def release_free_heap() -> None:
    """Give the C heap's free pages back to the kernel (glibc `malloc_trim`; a no-op elsewhere).

    Loading an .onnx file parses the whole protobuf; once the session holds its own copies the
    parse is freed, but glibc keeps those pages (they came from the heap). Figures:
    docs/measurements/2026-12-01/code-comment-figures.md.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def discard_pages(buf: np.ndarray) -> int:
    """Give the whole pages inside a C-contiguous array back to the kernel and zero the array; the bytes
    given back (0 where `madvise` is missing: there the array is only zeroed).

    Freed rows of a long-lived buffer (the scheduler's key/value rows) otherwise stay resident at the
    largest batch served; `madvise(MADV_DONTNEED)` on private anonymous memory drops the pages, and
    the next write maps fresh zero pages. The partial pages at either end are zeroed by hand."""
    if not buf.flags.c_contiguous:
        raise ValueError("discard_pages needs a C-contiguous array")
    start, size = buf.ctypes.data, buf.nbytes
    first = -(-start // _PAGE) * _PAGE
    last = (start + size) // _PAGE * _PAGE
    if _MADVISE is None or last <= first:
        buf.fill(0)
        return 0
    flat = buf.reshape(-1).view(np.uint8)
    flat[: first - start] = 0
    flat[last - start :] = 0
    if _MADVISE(first, last - first, _MADV_DONTNEED) != 0:
        buf.fill(0)
        return 0
    return last - first
