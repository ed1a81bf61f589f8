"""Building a warm phrase cache (`chattts-forge warm`): each phrase of a list synthesized on an
artifact or a routed version, exactly as a miss would be, and its mel written into a cache file
(runtime.phrase_cache: the file format, reading and serving it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.progress import Progress
from chattts_forge.runtime.phrase_cache import (
    CachedPhrase,
    cache_knobs,
    check_cacheable,
    payload_sha256,
    write_cache,
)
from chattts_forge.runtime.pipeline import Pipeline, SynthParams
from chattts_forge.runtime.router import ROUTING_NAME, Router

log = get_logger(__name__)


def read_phrase_list(path: str | os.PathLike[str], normalize: Callable[[str], str]) -> list[tuple[int, str]]:
    """(line number, normalised text) of each phrase of a UTF-8 file, one phrase per line.

    Skipped with a warning naming the line: blank lines, and duplicates (a line whose normalised text
    an earlier line already has). Refused (ForgeError naming the line): a line that normalises to
    nothing speakable (only punctuation or characters ChatTTS cannot say); a file that is missing,
    not UTF-8 or holds no phrase.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"phrase list {path} does not exist") from None
    except OSError as e:
        raise BadInput(f"phrase list {path} is unreadable: {e.strerror}") from None
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ForgeError(f"phrase list {path} is not UTF-8 (line {line})") from None
    out: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        phrase = line.strip()
        if not phrase:
            log.warning("phrase list %s line %d is empty: skipped", path, n)
            continue
        try:
            norm = normalize(phrase)
        except ForgeError as e:
            raise BadInput(f"phrase list {path} line {n} ({phrase!r}) cannot be spoken: {e}") from None
        if norm in first_line:
            log.warning("phrase list %s line %d repeats line %d (%r): skipped", path, n, first_line[norm], norm)
            continue
        first_line[norm] = n
        out.append((n, norm))
    if not out:
        raise BadInput(f"phrase list {path} holds no phrase")
    return out


def cached_phrase(pipe: Pipeline, norm: str, spoken: str, codes: np.ndarray, hiddens: np.ndarray,
                  use_decoder: bool) -> CachedPhrase:
    """A phrase's cache entry from its code stage's output (`codes`, `hiddens` of one row, as
    `infer_code` or a miss's `Result` gives them): the mel the Decoder (or DVAE) makes of it."""
    src = hiddens if use_decoder else codes
    if len(src) == 0:
        log.warning("phrase %r ended at its first step (no audio); cached as empty", norm)
        mel = np.zeros((pipe.dims.n_mels, 0), dtype=np.float32)
    else:
        mel = pipe.decode_mel(src, use_decoder)
    return CachedPhrase(mel=np.asarray(mel, np.float32), codes=codes, spoken=spoken)


def build_phrase_cache(
    target: str | os.PathLike[str],
    phrases: str | os.PathLike[str],
    out: str | os.PathLike[str],
    params: SynthParams,
    pipeline: Pipeline | None = None,
    progress: bool | None = None,
    **pipeline_kwargs: Any,
) -> dict[str, Any]:
    """Pre-synthesize every phrase of the list on `target` and write the cache file `out`.

    `target`: an artifact folder, or a published version folder with a routing.json (each phrase is
    then synthesized by the variant its length bucket routes to in the build's ranking, as `Router`
    serves it with autotune off; a host whose autotune routes elsewhere serves those texts uncached). Each
    phrase is refined (when `params` refine) and synthesized alone, exactly as a miss of
    `synthesize([phrase])` would be; the whole request is recorded (`cache_knobs`). `pipeline`: an
    open Pipeline of the artifact folder `target` to synthesize with (no second copy of its sessions).
    `progress`: phrases done / total, rate and ETA (a bar on a terminal, log lines elsewhere; None
    decides by the terminal, False shows nothing). Returns a summary.
    """
    check_cacheable(params)
    target = Path(target)
    # The build's routing, never a host ranking: the published cache's bytes must not depend on a clock.
    router = Router(target, autotune=False, **pipeline_kwargs) if (target / ROUTING_NAME).is_file() else None
    if router is None and pipeline is not None:
        if Path(pipeline.artifact.path).resolve() != target.resolve():
            raise ForgeError(f"the pipeline given runs {pipeline.artifact.path}, not {target}")
        single = pipeline
    elif router is None:
        single = Pipeline(target, **pipeline_kwargs)
    front = router.front if router is not None else single
    listed = read_phrase_list(phrases, lambda t: front.normalize(t, params))
    knobs = cache_knobs(params, front.num_vq)
    artifacts: dict[str, str] = {}
    entries: list[tuple[str, str, str, CachedPhrase]] = []
    unfinished = 0
    with Progress(len(listed), "warm", "phrase", enabled=progress) as bar:
        for _, norm in listed:
            if router is not None:
                variant = router.route(norm, params)[0]
                pipe = router.pipeline(variant)
            else:
                pipe, variant = single, single.artifact.variant
            payload = artifacts.setdefault(variant, payload_sha256(pipe.artifact.path))
            with quiet_logger("chattts_forge.runtime.pipeline"):  # one summary line below instead of one per phrase
                try:
                    spoken = pipe.refine_texts([norm], params)[0]  # as synthesize refines it (unchanged when off)
                except ForgeError as e:
                    raise ForgeError(f"phrase {norm!r}: {e}") from None
                gen = pipe.infer_code([spoken], params.code)
            unfinished += int(not bool(gen.finished[0]))
            entries.append((norm, variant, payload,
                            cached_phrase(pipe, norm, spoken, gen.ids[0], gen.hiddens[0], params.use_decoder)))
            bar.update(1)
    if unfinished:
        log.warning("%d of %d phrases hit max_new_token %d before EOS (cached as generated)", unfinished, len(entries),
                    params.code.max_new_token)
    path = write_cache(out, knobs, artifacts, entries)
    per_variant = {v: sum(1 for e in entries if e[1] == v) for v in sorted(artifacts)}
    return {"path": str(path), "phrases": len(entries), "bytes": path.stat().st_size, "variants": per_variant}
