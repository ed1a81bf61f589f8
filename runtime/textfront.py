"""A variant's text front end without a model session: normalisation, the input bounds, the speakers.

Normalising a text, measuring its routing length and drawing a random speaker read only an artifact's
small support files (the homophone map, the speaker statistics) and its `dims`; no onnxruntime
session. `TextFront.open(folder, verify)` checks just those files against their recorded sha256 (the
verified-hash cache makes that one stat each on a host that has seen them), so a `Router` measures
lengths and a server draws its voices before any variant is opened: a variant's graphs are hashed
and loaded on its first text, and a variant no bucket routes to is never loaded. A `Pipeline` holds
the same object over its own (fully checked) artifact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.checkpoint.layout import Dims
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.integrity import CheckReport, check_files, check_verify_mode, expected_files
from chattts_forge.runtime.chattts_speaker import sample_random_speaker
from chattts_forge.runtime.chattts_text import Normalizer, is_speakable
from chattts_forge.runtime.segments import split_segments, written_chunks
from chattts_forge.runtime.spoken import SPOKEN, SpokenText

if TYPE_CHECKING:
    from chattts_forge.runtime.pipeline import SynthParams

# The support files the front end reads (artifact.json `files` keys).
FRONT_FILES = ("homophones", "speaker_stats")
# Input text bounds (checked before normalisation, which costs time per character): a token spans at
# least one character of normalised text and normalisation only ever shortens a text by dropping
# characters, so 8 characters per position leaves room for dropped punctuation and spaces.
TEXT_CHARS_PER_POSITION = 8
SPLIT_TEXT_FACTOR = 16
# The longest input with text normalization on (OpenAI's speech API limit): it is cut into segments.
MAX_INPUT_CHARS = 4096


class InputError(BadInput):
    """The request's text itself cannot be spoken (HTTP: 400 naming the field `input`)."""

    def __init__(self, message: str = "", param: str | None = "input") -> None:
        super().__init__(message, param)


def check_text_length(text: str, limit: int) -> None:
    """InputError when an input text is longer than `limit` characters (before anything else runs)."""
    if len(text) > limit:
        raise InputError(f"text is {len(text)} characters long, more than the {limit} this model takes "
                         "in one request; send it in several requests")


def short_repr(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def load_speaker_stats(path: Path, hidden_size: int) -> np.ndarray:
    """The speaker statistics [2, hidden] (std, mean) as float16; a one-line ForgeError otherwise."""
    try:
        stats = np.load(path)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path} is unreadable: {e}") from None
    if stats.shape != (2, hidden_size):
        raise ForgeError(f"{path} has shape {stats.shape}, expected (2, {hidden_size})")
    return stats.astype(np.float16)


class TextFront:
    """Normalisation, input bounds and speaker statistics of one artifact folder (no session)."""

    def __init__(self, path: Path, meta: ArtifactMeta, verification: CheckReport | None = None) -> None:
        """Over files already checked (a Pipeline's artifact); `TextFront.open` checks them itself."""
        self.path = path
        self.meta = meta
        self.dims: Dims = meta.require_dims()
        self.num_vq = self.dims.num_vq
        self.normalizer = Normalizer(meta.support_path(path, "homophones"))
        self.verification = verification
        SPOKEN.preload()  # read beside the model's sessions, not on the first text with a number

    @classmethod
    def open(cls, folder: str | os.PathLike[str], verify: str = "sha256") -> TextFront:
        """The front end of `folder`, its FRONT_FILES checked against their records (`verify` mode,
        as `LoadedArtifact`'s) and nothing else read: no graph is hashed or loaded."""
        path = Path(folder).expanduser()
        meta = ArtifactMeta.load(path)
        verify = check_verify_mode(verify)
        wanted = set()
        for key in FRONT_FILES:
            p = meta.support_path(path, key)
            if not p.is_file():
                raise ForgeError(f"artifact file {p} is missing")
            wanted.add(Path(os.path.relpath(p, path)).as_posix())
        expected = {rel: e for rel, e in expected_files(path, meta).items() if rel in wanted}
        return cls(path, meta, check_files(path, expected, verify))

    @classmethod
    def without_artifact(cls) -> TextFront:
        """The text front end alone (no homophone map, no speakers): what `normalize` prints without
        --artifact. Its bound is MAX_INPUT_CHARS with text normalization on, as any model's."""
        front = cls.__new__(cls)
        front.path, front.meta, front.dims, front.verification = None, None, None, None  # type: ignore[assignment]
        front.normalizer = Normalizer({})
        SPOKEN.preload()
        return front

    @cached_property
    def speaker_stats(self) -> np.ndarray:
        return load_speaker_stats(self.meta.support_path(self.path, "speaker_stats"), self.dims.hidden_size)

    def max_text_chars(self, split_sentences: bool = False, segmented: bool = False) -> int:
        """The longest input text accepted (checked before normalising): a text that needs more
        characters than TEXT_CHARS_PER_POSITION per model position could not fit even once normalised;
        split into sentences, each sentence must fit, and the whole may be SPLIT_TEXT_FACTOR times longer;
        cut into segments (text normalization on), MAX_INPUT_CHARS whatever the model."""
        if self.dims is None:  # no model: the bound of every model with text normalization on
            return MAX_INPUT_CHARS
        one = TEXT_CHARS_PER_POSITION * self.dims.max_position_embeddings
        if split_sentences:
            return one * SPLIT_TEXT_FACTOR
        return MAX_INPUT_CHARS if segmented else one

    def _checked(self, text: object, params: SynthParams, limit: int) -> str:
        if not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}")
        check_text_length(text, limit)
        if not text.strip():
            raise InputError("empty text")
        if params.lang not in (None, "zh", "en"):
            raise BadInput(f"unknown language '{params.lang}' (zh, en or None to detect)")
        return text

    def spoken(self, text: str, params: SynthParams | None = None) -> SpokenText:
        """What the model receives for `text` and what was removed from it: the spoken form
        (`params.text_normalization`, runtime.spoken) then ChatTTS's own normalisation and filter.
        InputError for empty or unspeakable text."""
        params = _params(params)
        text = self._checked(text, params, self.max_text_chars(params.split_sentences, params.text_normalization))
        written = SPOKEN.normalize(text, params.lang) if params.text_normalization else text
        # The invalid-character filter always runs, as in ChatTTS; the flags gate the rest.
        out, removed = self.normalizer.filtered(written, params.normalize, params.homophones, params.lang)
        if not out.strip() or not is_speakable(out):
            raise InputError(f"text {short_repr(text)} normalises to nothing speakable{_removed_note(removed)}")
        return SpokenText(out, removed)

    def normalize(self, text: str, params: SynthParams | None = None) -> str:
        """The text the model receives for `text` (`spoken`, without what was removed)."""
        return self.spoken(text, params).text

    def segments(self, text: str, params: SynthParams | None = None) -> tuple[list[str], str]:
        """(the segments the model speaks for `text`, in order; what was removed). With text
        normalization on, a long text is cut into segments of bounded duration (runtime.segments);
        off, it is one segment, as ChatTTS takes it."""
        parts: list[str] = []
        removed: set[str] = set()
        for segment, gone in self.iter_segments(text, params):
            if segment:
                parts.append(segment)
            removed.update(gone)
        return parts, "".join(sorted(removed))

    def iter_segments(self, text: str, params: SynthParams | None = None) -> Iterator[tuple[str, str]]:
        """(segment, what its written chunk lost) in order, normalising the written text a chunk at a
        time (`written_chunks`): a stream speaks its first segment before the rest is normalised. A
        chunk with nothing speakable yields ("", what it lost). InputError up front for a bad text,
        and at the end when nothing in it could be spoken."""
        params = _params(params)
        if not params.text_normalization:  # ChatTTS's front end: the whole text is one prompt
            spoken = self.spoken(text, params)
            yield spoken.text, spoken.removed
            return
        text = self._checked(text, params, self.max_text_chars(params.split_sentences, params.text_normalization))
        lang = params.lang or Normalizer.detect_language(text)  # the whole text's, for every chunk
        any_spoken = False
        lost: set[str] = set()
        for chunk in written_chunks(text):
            written = SPOKEN.normalize(chunk, lang)
            out, removed = self.normalizer.filtered(written, params.normalize, params.homophones, lang)
            parts = [p for p in split_segments(out) if is_speakable(p)]
            if not parts:  # nothing here can be spoken: what it lost is still reported
                lost.update(removed)
                yield "", removed
                continue
            for k, part in enumerate(parts):
                yield part, removed if k == 0 else ""
            any_spoken = True
        if not any_spoken:
            note = _removed_note("".join(sorted(lost)))
            raise InputError(f"text {short_repr(text)} normalises to nothing speakable{note}")

    def random_speaker(self, seed: int | None = None) -> str:
        """A random speaker string from the speaker statistics (`Chat.sample_random_speaker`)."""
        return sample_random_speaker(self.speaker_stats, np.random.default_rng(seed))


def _removed_note(removed: str) -> str:
    """What a refusal says of the characters that could not be spoken (the client sees it in the error)."""
    return f" (removed, cannot be spoken: {' '.join(removed)})" if removed else ""


def _params(params: SynthParams | None) -> SynthParams:
    if params is None:
        # a cycle at the top: runtime.pipeline leads back to this module
        from chattts_forge.runtime.pipeline import SynthParams

        return SynthParams()
    return params
