"""Score audio against transcripts with a real ASR: per-utterance and pooled WER/CER.

Library:

- `read_transcripts(path)` -> {id: sentence}; the file is ``NNN<TAB>sentence`` per line (UTF-8).
- `error_rates(references, hypotheses, lang)` -> per-utterance and pooled (corpus) WER/CER of
  texts already transcribed, after `textnorm.normalize` (jiwer 4: `process_words` /
  `process_characters`).
- `score_audio_dir(audio_dir, transcripts, asr="faster-whisper", asr_model=None, lang=None)`
  -> the result dict below; audio files are ``<id>.wav`` (any rate, mono or stereo).
- `score_waveforms({id: (audio, sample_rate)}, references, backend, lang)` for audio in memory
  (the evaluate stage scores runtime output without writing WAVs).

Result (also what ``chattts-forge score --json OUT`` writes)::

    {"schema": "chattts-forge/score/1",
     "corpus": {"wer", "cer", "n", "metric" ("wer" for en, "cer" for zh), "error_rate",
                "wer_raw", "cer_raw" (without number normalisation), "ref_words", "ref_chars",
                "substitutions", "deletions", "insertions"},
     "utterances": [{"id", "reference", "hypothesis", "reference_norm", "hypothesis_norm",
                     "wer", "cer", "asr_seconds", "audio_seconds"}, ...],
     "asr": {backend description}, "lang", "normalization", "timing": {...}}

Corpus figures are pooled: total edits over total reference units (what jiwer computes over
lists). For Chinese the words are characters, so WER equals CER.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate import textnorm
from chattts_forge.log import get_logger

log = get_logger(__name__)

SCORE_SCHEMA = "chattts-forge/score/1"


def read_transcripts(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse ``ID<TAB>sentence`` lines (blank lines and ``#`` comments skipped)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ForgeError(f"transcripts file {path} does not exist") from None
    except OSError as e:
        raise ForgeError(f"cannot read transcripts file {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ForgeError(f"transcripts file {path} is not UTF-8") from None
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "\t" not in line:
            raise ForgeError(f"{path}:{lineno}: expected 'ID<TAB>sentence', got {line[:60]!r}")
        utt_id, sentence = line.split("\t", 1)
        utt_id, sentence = utt_id.strip(), sentence.strip()
        if not utt_id or not sentence:
            raise ForgeError(f"{path}:{lineno}: empty id or sentence")
        if utt_id in out:
            raise ForgeError(f"{path}:{lineno}: duplicate id '{utt_id}'")
        out[utt_id] = sentence
    if not out:
        raise ForgeError(f"transcripts file {path} has no 'ID<TAB>sentence' lines")
    return out


def _edits(ref: list[str], hyp: list[str]) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, hits) between two token lists (jiwer 4)."""
    import jiwer

    if not ref:
        return 0, 0, len(hyp), 0
    if not hyp:
        return 0, len(ref), 0, 0
    # Tokens hold no whitespace, so jiwer's default split on spaces gives them back unchanged.
    out = jiwer.process_words(" ".join(ref), " ".join(hyp))
    return out.substitutions, out.deletions, out.insertions, out.hits


def _char_edits(ref: str, hyp: str) -> tuple[int, int]:
    """(edits, reference characters) at character level, spaces removed (CER)."""
    import jiwer

    ref_c, hyp_c = ref.replace(" ", ""), hyp.replace(" ", "")
    if not ref_c:
        return len(hyp_c), 0
    if not hyp_c:
        return len(ref_c), len(ref_c)
    out = jiwer.process_characters(ref_c, hyp_c)
    return out.substitutions + out.deletions + out.insertions, len(ref_c)


def _rate(edits: int, total: int) -> float:
    return float(edits) / total if total else float(edits > 0)


def error_rates(
    references: dict[str, str], hypotheses: dict[str, str], lang: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(corpus, utterances) WER/CER of `hypotheses` against `references` (same ids)."""
    missing = sorted(set(references) - set(hypotheses))
    if missing:
        raise ForgeError(f"no hypothesis for utterance(s) {', '.join(missing[:5])}")
    totals = {"sub": 0, "del": 0, "ins": 0, "words": 0, "char_edits": 0, "chars": 0}
    raw_totals = {"edits": 0, "words": 0, "char_edits": 0, "chars": 0}
    utterances = []
    for utt_id, reference in references.items():
        hypothesis = hypotheses[utt_id]
        ref_n, hyp_n = textnorm.normalize(reference, lang), textnorm.normalize(hypothesis, lang)
        ref_t, hyp_t = textnorm.tokens(ref_n, lang), textnorm.tokens(hyp_n, lang)
        sub, dele, ins, _hits = _edits(ref_t, hyp_t)
        char_edits, chars = _char_edits(ref_n, hyp_n)
        totals["sub"] += sub
        totals["del"] += dele
        totals["ins"] += ins
        totals["words"] += len(ref_t)
        totals["char_edits"] += char_edits
        totals["chars"] += chars
        # The same without number normalisation, for comparison with un-normalised figures.
        ref_r, hyp_r = textnorm.normalize(reference, lang, False), textnorm.normalize(hypothesis, lang, False)
        r_sub, r_del, r_ins, _ = _edits(textnorm.tokens(ref_r, lang), textnorm.tokens(hyp_r, lang))
        raw_totals["edits"] += r_sub + r_del + r_ins
        raw_totals["words"] += len(textnorm.tokens(ref_r, lang))
        rc_edits, rc_chars = _char_edits(ref_r, hyp_r)
        raw_totals["char_edits"] += rc_edits
        raw_totals["chars"] += rc_chars
        utterances.append(
            {
                "id": utt_id,
                "reference": reference,
                "hypothesis": hypothesis,
                "reference_norm": ref_n,
                "hypothesis_norm": hyp_n,
                "wer": _rate(sub + dele + ins, len(ref_t)),
                "cer": _rate(char_edits, chars),
            }
        )
    wer = _rate(totals["sub"] + totals["del"] + totals["ins"], totals["words"])
    cer = _rate(totals["char_edits"], totals["chars"])
    metric = "cer" if lang == "zh" else "wer"
    corpus = {
        "wer": wer,
        "cer": cer,
        "n": len(utterances),
        "metric": metric,
        "error_rate": cer if metric == "cer" else wer,
        "wer_raw": _rate(raw_totals["edits"], raw_totals["words"]),
        "cer_raw": _rate(raw_totals["char_edits"], raw_totals["chars"]),
        "ref_words": totals["words"],
        "ref_chars": totals["chars"],
        "substitutions": totals["sub"],
        "deletions": totals["del"],
        "insertions": totals["ins"],
    }
    return corpus, utterances


def transcribe_waveforms(
    waveforms: dict[str, tuple[np.ndarray, int]],
    ids: list[str],
    backend: Any,
    progress: bool = True,
    desc: str = "ASR",
) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """({id: hypothesis}, {id: asr/audio seconds}) of the utterances `ids` of in-memory audio."""
    from tqdm import tqdm

    from chattts_forge.evaluate.asr import ASR_SAMPLE_RATE, resample

    hypotheses: dict[str, str] = {}
    timing: dict[str, dict[str, float]] = {}
    for utt_id in tqdm(ids, desc=desc, unit="utt", disable=not progress, leave=False):
        if utt_id not in waveforms:
            raise ForgeError(f"no audio for utterance '{utt_id}'")
        audio, sr = waveforms[utt_id]
        audio16 = resample(np.asarray(audio, dtype=np.float32).reshape(-1), sr, ASR_SAMPLE_RATE)
        t0 = time.perf_counter()
        hypotheses[utt_id] = backend.transcribe(audio16)
        timing[utt_id] = {
            "asr_seconds": time.perf_counter() - t0,
            "audio_seconds": audio16.shape[-1] / ASR_SAMPLE_RATE,
        }
    return hypotheses, timing


def score_hypotheses(
    references: dict[str, str],
    hypotheses: dict[str, str],
    timing: dict[str, dict[str, float]],
    asr: dict[str, Any],
    lang: str,
    wall_seconds: float,
) -> dict[str, Any]:
    """The score record of transcribed utterances (`asr`: the backend's description); the corpus
    figures depend only on the references and hypotheses, not on where they were transcribed."""
    corpus, utterances = error_rates(references, hypotheses, lang)
    for u in utterances:
        u.update(timing[u["id"]])
    total_audio = sum(t["audio_seconds"] for t in timing.values())
    total_asr = sum(t["asr_seconds"] for t in timing.values())
    return {
        "schema": SCORE_SCHEMA,
        "corpus": corpus,
        "utterances": utterances,
        "asr": asr,
        "lang": lang,
        "normalization": "seed-tts-eval style: NFKC, zh-cn folding, numbers as words, no punctuation, "
        "lower case; zh scored per character",
        "timing": {
            "wall_seconds": wall_seconds,
            "asr_seconds": total_asr,
            "audio_seconds": total_audio,
            "asr_rtf": total_asr / total_audio if total_audio else None,
        },
    }


def score_waveforms(
    waveforms: dict[str, tuple[np.ndarray, int]],
    references: dict[str, str],
    backend: Any,
    lang: str,
    progress: bool = True,
    desc: str = "ASR",
) -> dict[str, Any]:
    """Transcribe in-memory audio {id: (waveform, sample_rate)} and score it against `references`."""
    t_all = time.perf_counter()
    hypotheses, timing = transcribe_waveforms(waveforms, list(references), backend, progress, desc)
    return score_hypotheses(references, hypotheses, timing, backend.describe(), lang, time.perf_counter() - t_all)


def score_audio_dir(
    audio_dir: str | os.PathLike[str],
    transcripts: str | os.PathLike[str] | dict[str, str],
    asr: str = "faster-whisper",
    asr_model: str | os.PathLike[str] | None = None,
    lang: str | None = None,
    threads: int | None = None,
    backend: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Transcribe ``<audio_dir>/<id>.wav`` for every transcript line and score it (see module doc).

    `lang` defaults to what the transcripts look like; `backend` may be a ready `AsrBackend`
    (reused across calls, e.g. in tests) instead of `asr`/`asr_model`.
    """
    from chattts_forge.evaluate.asr import get_backend, load_audio

    audio_dir = Path(audio_dir)
    if not audio_dir.is_dir():
        raise ForgeError(f"audio folder {audio_dir} does not exist")
    references = transcripts if isinstance(transcripts, dict) else read_transcripts(transcripts)
    lang = lang or textnorm.detect_lang(list(references.values()))
    if lang not in ("en", "zh"):
        raise ForgeError(f"unsupported language '{lang}' (expected en or zh)")
    paths = {utt_id: audio_dir / f"{utt_id}.wav" for utt_id in references}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ForgeError(f"{len(missing)} audio file(s) missing, e.g. {missing[0]}")
    if backend is None:
        t0 = time.perf_counter()
        backend = get_backend(asr, lang, asr_model, threads)
        load_seconds = time.perf_counter() - t0
    else:
        load_seconds = 0.0
    log.info("scoring %d utterances in %s with %s (%s)", len(paths), audio_dir, backend.name, lang)
    waveforms = {utt_id: (load_audio(p), 16000) for utt_id, p in paths.items()}
    result = score_waveforms(waveforms, references, backend, lang, progress=progress)
    result["audio_dir"] = str(audio_dir)
    result["timing"]["asr_load_seconds"] = load_seconds
    return result
