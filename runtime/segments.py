"""Long text cut into segments the model speaks whole: at sentence ends, then clause marks, then spaces.

ChatTTS generates one utterance per prompt and stops at `max_new_token` code steps (2,048, 43.7 s)
whatever is left of the text; its maintainers advise 15-30 s per call. A segment here is bounded by
an estimate of its spoken duration (`SEGMENT_SECONDS`): CJK characters at ~4 a second, other letters
and digits at ~14 a second, tags at none. Segments are slices of the normalised text in order; joined
with a space they give it back (whitespace at the cuts collapses). A cut never falls inside a
`[tag]`.
"""

from __future__ import annotations

import math
import re

from chattts_forge.runtime.spoken import CJK, CONTROL_TAG

# The duration one segment may reach (estimated), well inside 2,048 code steps and the maintainers'
# 15-30 s advice; a segment that still hits the step cap is split again (Pipeline).
SEGMENT_SECONDS = 20.0
CJK_SECONDS = 0.25
OTHER_SECONDS = 0.07
# The pause put between segments when their audio is joined (a sentence break's length).
SEGMENT_PAUSE_SECONDS = 0.25

_ALNUM = re.compile(r"[A-Za-z0-9]")
# Cut points, strongest first: after a sentence end, after a clause mark, at a space.
_SENTENCE_END = re.compile(r"(?<=[。.!?！？；;…])\s*|\n+")
_CLAUSE = re.compile(r"(?<=[，,、：:])\s*")
_SPACE = re.compile(r"\s+")


def spoken_seconds(text: str) -> float:
    """The estimated spoken duration of a normalised text (tags count nothing)."""
    plain = CONTROL_TAG.sub("", text)
    return CJK_SECONDS * len(CJK.findall(plain)) + OTHER_SECONDS * len(_ALNUM.findall(plain))


def _pieces(text: str, pattern: re.Pattern[str]) -> list[str]:
    """`text` cut after each match of `pattern`, never inside a tag; each piece stripped, empty ones dropped."""
    return [p.strip() for p in _cut_outside_tags(text, pattern) if p.strip()]


def _hard_cut(text: str, limit: float) -> list[str]:
    """A run with no punctuation or space longer than the bound: cut by characters (tags kept whole)."""
    out, cur = [], ""
    for tok in re.findall(CONTROL_TAG.pattern + "|.", text, flags=re.S):
        if cur and spoken_seconds(cur + tok) > limit:
            out.append(cur)
            cur = ""
        cur += tok
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out if p.strip()]


def _fit(piece: str, limit: float, level: int) -> list[str]:
    """`piece` as parts each within `limit`, cut at the strongest mark that makes them fit."""
    if spoken_seconds(piece) <= limit:
        return [piece]
    patterns = (_CLAUSE, _SPACE)
    if level >= len(patterns):
        return _hard_cut(piece, limit)
    parts = _pieces(piece, patterns[level])
    if len(parts) <= 1:
        return _fit(piece, limit, level + 1)
    return _pack([q for p in parts for q in _fit(p, limit, level + 1)], limit, " " if level == 1 else "")


def _pack(parts: list[str], limit: float, joiner: str = "") -> list[str]:
    """Neighbouring parts merged while they stay within `limit` (fewer, fuller segments)."""
    out: list[str] = []
    for p in parts:
        if out and spoken_seconds(out[-1] + p) <= limit:
            sep = " " if (joiner or _needs_space(out[-1], p)) else ""
            out[-1] = out[-1] + sep + p
        else:
            out.append(p)
    return out


def _needs_space(left: str, right: str) -> bool:
    return bool(left) and bool(right) and (left[-1].isascii() or right[0].isascii())


# A long written text is normalised in chunks of about this many characters, cut where a sentence
# surely ends, so a stream's first segment is spoken before the rest of the text is normalised.
WRITTEN_CHUNK_CHARS = 240
_WRITTEN_END = re.compile(r"(?<=[。！？!?])|\n+")


def written_chunks(text: str, size: int = WRITTEN_CHUNK_CHARS) -> list[str]:
    """A written (not yet normalised) text cut after `。！？!?` and at newlines, never inside a tag, the
    pieces packed into chunks of about `size` characters. Joined, the chunks are the text (newlines
    aside). A period is not a cut: `3.5`, `Dr.` and `e.g.` read differently alone."""
    pieces = [p for p in _cut_outside_tags(text, _WRITTEN_END) if p.strip()]
    out: list[str] = []
    for p in pieces:
        if out and len(out[-1]) + len(p) <= size:
            out[-1] += p
        else:
            out.append(p)
    return out or [text]


def _cut_outside_tags(text: str, pattern: re.Pattern[str]) -> list[str]:
    tags = [(m.start(), m.end()) for m in CONTROL_TAG.finditer(text)]
    out, start = [], 0
    for m in pattern.finditer(text):
        if m.end() <= start or any(a < m.start() < b for a, b in tags):
            continue
        out.append(text[start: m.start()])
        start = m.end()
    out.append(text[start:])
    return out


def split_segments(text: str, limit_seconds: float = SEGMENT_SECONDS) -> list[str]:
    """`text` (normalised) as segments of at most `limit_seconds` estimated speech each, in order."""
    if limit_seconds <= 0:
        raise ValueError(f"limit_seconds must be > 0, got {limit_seconds}")
    sentences = _pieces(text, _SENTENCE_END)
    fitted = [q for s in sentences for q in _fit(s, limit_seconds, 0)]
    return _pack(fitted, limit_seconds)


def halve(segment: str) -> list[str]:
    """A segment that hit the code-step cap, cut in two near its middle at the strongest mark; [segment]
    when it cannot be cut (a single word or character)."""
    target = spoken_seconds(segment) / 2
    for limit in (target * 1.3, target * 1.1):
        parts = split_segments(segment, max(limit, 1e-6))
        if len(parts) >= 2:
            half = max(1, len(parts) // 2)
            left, right = parts[:half], parts[half:]
            return [_pack(left, math.inf)[0], _pack(right, math.inf)[0]]
    return [segment]
