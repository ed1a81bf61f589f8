"""wetext's WeTextProcessing grammars for runtime.spoken: loaded lazily, per language and per
grammar file, and run only on the pieces of a span that hold something to verbalize.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger

log = get_logger(__name__)

# Something a grammar may change: a digit, a symbol, or an English abbreviation with its period.
NEEDS_GRAMMAR = re.compile(r"[0-9$€£¥￥₹¢₩%‰°℃℉+−×÷=<>@#&*/\\^~|π²³]|\b[A-Za-z]{1,4}\.(?=\s|$)"
                           r"|\b[A-Za-z0-9-]+\.(?:com|org|net|edu|gov|io|cn|co|uk|de|jp)\b")


class _LazyFst:
    """A kaldifst.TextNormalizer read from its file on first call (see `_import_wetext`)."""

    def __init__(self, path: str, read: Callable[[str], Any]) -> None:
        self._path, self._read = path, read
        self._fst: Any = None
        self._lock = threading.Lock()

    def __call__(self, text: str) -> str:
        fst = self._fst
        if fst is None:
            with self._lock:
                if self._fst is None:
                    self._fst = self._read(self._path)
                fst = self._fst
        return fst(text)


def _import_wetext() -> Any:
    """`import wetext`, its grammars read on first use. wetext reads every grammar it ships at import
    (zh, en, ja; TN and ITN: ~0.4 s of a cold start); we use two or four of them. Its module of
    grammars is built while kaldifst.TextNormalizer is `_LazyFst`, so only what a text needs is read."""
    if "wetext" in sys.modules:
        return sys.modules["wetext"]
    # kaldifst/wetext: on the first text to normalise; wetext 0.55 s to import
    import kaldifst

    read = kaldifst.TextNormalizer
    kaldifst.TextNormalizer = lambda path: _LazyFst(path, read)
    try:
        import wetext
    finally:
        kaldifst.TextNormalizer = read
    return wetext


class _Grammars:
    """wetext's TN tagger + verbalizer per language, loaded on first use (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._normalizers: dict[str, Any] = {}
        self._preloading = False

    def get(self, lang: str) -> Any:
        n = self._normalizers.get(lang)
        if n is None:
            with self._lock:
                n = self._normalizers.get(lang)
                if n is None:
                    if importlib.util.find_spec("wetext") is None:
                        raise ForgeError("text normalization needs the 'wetext' package (pip install wetext); "
                                         "or turn it off (--no-text-normalization, \"normalize\": false)")
                    n = _import_wetext().Normalizer(lang=lang, operator="tn")
                    self._normalizers[lang] = n
        return n

    def preload(self, langs: tuple[str, ...] = ("zh", "en")) -> None:
        """Read the grammars of `langs` in a background thread, once per process: while a model's
        sessions are built (onnxruntime lets go of the GIL meanwhile) the first text with a number
        stops waiting for them. A text that needs a grammar before then waits on its lock."""
        with self._lock:
            if self._preloading:
                return
            self._preloading = True
        threading.Thread(target=self._read_all, args=(langs,), name="spoken-grammars", daemon=True).start()

    def _read_all(self, langs: tuple[str, ...]) -> None:
        for lang in langs:
            try:
                self.get(lang).normalize("0")
            except Exception as e:  # reported when a text needs it; a preload only saves time
                log.debug("grammar %s not preloaded: %s", lang, e)
                return

    def verbalize(self, text: str, lang: str) -> str:
        """One span through its language's grammar; a span the grammar rejects is verbalized word by word."""
        try:
            return self.get(lang).normalize(text)
        except ForgeError:
            raise
        except Exception:  # wetext asserts on some inputs (e.g. '#1' in English)
            pass
        out = []
        for word in re.split(r"(\s+)", text):
            if not word.strip() or not NEEDS_GRAMMAR.search(word):
                out.append(word)
                continue
            try:
                out.append(self.get(lang).normalize(word))
            except Exception:
                out.append(word)
        return "".join(out)


GRAMMARS = _Grammars()


_MAGNITUDES = frozenset("hundred thousand million billion trillion percent".split())


def _context_word(word: str) -> bool:
    """A word next to a number that can change its reading: a name or month (`Dec 8`, `Baker St.`), a short
    unit or mark (`pm`, `kg`, `of`), a magnitude (`1.5 million`); not `plus`, `times`, `divided`."""
    core = word.strip(".,;:!?\"'()")
    return core[:1].isupper() or len(core) <= 3 or core.lower() in _MAGNITUDES


def verbalize_chunks(text: str, lang: str) -> str:
    """Only the pieces of a span that hold something to verbalize go through the grammar: an FST pass
    costs more than linearly in its length. English: each word that needs the grammar with one word of
    context either side (`Dec 8, 2026`, `3:30 pm`, `Baker St.`); Chinese: each clause that needs it."""
    if lang == "zh":
        pieces = re.split(r"(?<=[，。；！？、,;])", text)
        return "".join(GRAMMARS.verbalize(p, lang) if NEEDS_GRAMMAR.search(p) else p for p in pieces)
    parts = re.split(r"(\s+)", text)
    words = parts[0::2]
    need = [bool(NEEDS_GRAMMAR.search(w)) for w in words]
    near = [need[i] or (_context_word(words[i]) and ((i > 0 and need[i - 1]) or (i + 1 < len(words) and need[i + 1])))
            for i in range(len(words))]
    out: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j + 1 < len(words) and near[j + 1] == near[i]:
            j += 1
        piece = "".join(parts[2 * i: 2 * j + 1])
        out.append(GRAMMARS.verbalize(piece, lang) if near[i] else piece)
        if j + 1 < len(words):
            out.append(parts[2 * j + 1])
        i = j + 1
    return "".join(out)
