"""Which corpus sentences a `calibrate` run synthesizes: the stratified seeded draw
(`select_sentences`), the per-sentence seed, the corpus checks, and the plan that sets aside what the
front end refuses and what an earlier (merged) run saw, before any synthesis."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chattts_forge.calibration_data.corpus import Corpus
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.errors import BadInput
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.runtime.chattts_text import Normalizer, is_speakable

log = get_logger(__name__)


def sentence_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

def file_stems(corp: Corpus) -> list[str]:
    """The corpus file of each sentence (its stem; the corpus name when origins are unknown)."""
    if len(corp.origins) == len(corp.sentences) and corp.files:
        return [corp.files[i].stem for i in corp.origins]
    return [corp.name] * len(corp.sentences)


def select_sentences(stems: Sequence[str], count: int | None, seed: int) -> list[int]:
    """Indices of `count` sentences (all when None) stratified by file: each file gets its share by
    largest remainder, at least one while `count` allows, the sentences within a file a seeded draw.
    Returned in corpus order."""
    by_file: dict[str, list[int]] = {}
    for i, stem in enumerate(stems):
        by_file.setdefault(stem, []).append(i)
    total = len(stems)
    if count is None or count >= total:
        return list(range(total))
    files = sorted(by_file)
    quota = dict.fromkeys(files, 0)
    if count >= len(files):  # one each first, then the rest by share
        for f in files:
            quota[f] = 1
    rest = count - sum(quota.values())
    exact = {f: (len(by_file[f]) - quota[f]) * rest / max(total - sum(quota.values()), 1) for f in files}
    for f in files:
        quota[f] += math.floor(exact[f])
    by_remainder = sorted(files, key=lambda f: (-(exact[f] - math.floor(exact[f])), f))
    for f in by_remainder[: count - sum(quota.values())]:
        quota[f] += 1
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for f in files:
        members = by_file[f]
        chosen.extend(members[j] for j in rng.permutation(len(members))[: min(quota[f], len(members))])
    return sorted(chosen)


def corpus_languages(sentences: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in sentences:
        lang = Normalizer.detect_language(s)
        counts[lang] = counts.get(lang, 0) + 1
    return counts


def sentence_seed(seed: int, sha: str) -> int:
    """The speaker/sampling seed of one sentence: depends on the run seed and the text only."""
    return (seed + int(sha[:8], 16)) % (2**31 - 1)

def check_corpus(corp: Corpus, allow_one_language: bool) -> None:
    if not corp.sentences:
        raise BadInput(f"corpus '{corp.name}' has no sentences")
    languages = corpus_languages(corp.sentences)
    if len(languages) < 2 and not allow_one_language:
        raise BadInput(f"corpus '{corp.name}' holds only {next(iter(languages))} sentences: static ranges would "
                         "miss the other language (pass --allow-one-language to calibrate on it anyway)")


@dataclass
class SentencePlan:
    """Which corpus sentences this run synthesizes, and what was set aside before any synthesis."""

    stems: list[str]  # the corpus file of every sentence
    picked: list[int]
    skipped: list[dict[str, str]]
    already: int  # sentences an earlier (merged) run saw
    seen: set[str]


def plan_sentences(pipe: Any, corp: Corpus, earlier: list[CalibrationStore], count: int | None,
                    seed: int) -> SentencePlan:
    """Lines the front end refuses, and sentences an earlier (merged) run saw, are set aside first."""
    seen = {sha for s in earlier for sha in s.manifest.get("sentence_sha256", [])}
    stems = file_stems(corp)
    usable: list[int] = []
    skipped: list[dict[str, str]] = []
    already = 0
    with quiet_logger():
        for i, text in enumerate(corp.sentences):
            if sentence_sha256(text) in seen:
                already += 1
            elif not is_speakable(pipe.normalizer(text)):
                skipped.append({"sentence": text, "file": stems[i], "reason": "normalises to nothing speakable"})
            else:
                usable.append(i)
    if not usable and not earlier:
        raise BadInput(f"no sentence of corpus '{corp.name}' is speakable ({len(skipped)} refused by the front end)")
    if skipped:
        log.warning("calibrate: %d corpus line(s) the front end refuses are skipped", len(skipped))
    picked = [usable[j] for j in select_sentences([stems[i] for i in usable], count, seed)]
    return SentencePlan(stems, picked, skipped, already, seen)
