"""Score audio: WER/CER against transcripts with a real ASR, speaker similarity, DNSMOS naturalness.

Library:

- `read_transcripts(path)` -> {id: sentence}; the file is ``NNN<TAB>sentence`` per line (UTF-8).
- `error_rates(references, hypotheses, lang, spoken=True)` -> per-utterance and pooled (corpus)
  WER/CER of texts already transcribed, after `textnorm.normalize` (jiwer 4: `process_words` /
  `process_characters`). With `spoken` (the default) both sides are first put in their spoken form
  (`runtime.spoken.SPOKEN`, wetext), so "$199" and "one hundred and ninety-nine dollars" are the same
  words; `spoken=False` scores as before (the project's own number rules only).
- `seed_tts_eval_rates(references, hypotheses, lang)` -> the same texts scored exactly as
  Seed-TTS-eval's ``run_wer.py`` + ``average_wer.py`` do (see there), for comparison with
  published tables.
- `score_audio_dir(audio_dir, transcripts=None, ScoreSettings(asr="faster-whisper", asr_model=None,
  lang=None, speaker_reference=None, mos=False))` (or those as keywords) -> the result dict below; audio files are ``<id>.wav`` (any
  rate, mono or stereo). Without transcripts no ASR runs: every ``*.wav`` of the folder is scored
  for SIM and/or DNSMOS only.
- `score_waveforms({id: (audio, sample_rate)}, references, backend, lang)` for audio in memory
  (the evaluate stage scores runtime output without writing WAVs).
- `speaker_section(waveforms, reference_embedding, encoder)`, `naturalness_section(waveforms,
  dnsmos)`, `load_speaker_reference(path, encoder)`: the SIM and DNSMOS parts on their own.

Result (also what ``chattts-forge score --json OUT`` writes)::

    {"schema": "chattts-forge/score/1",
     "corpus": {"wer", "cer", "n", "metric" ("wer" for en, "cer" for zh), "error_rate",
                "wer_interval", "cer_interval" (95% bootstrap over utterances), "wer_raw", "cer_raw"
                (without number normalisation), "wer_unspoken", "cer_unspoken" (number rules without
                the spoken form; only when scored spoken), "normalizer" (what made the spoken form,
                e.g. "wetext-0.1.8-r1"; "off"), "ref_words", "ref_chars", "substitutions",
                "deletions", "insertions"},                                   # with transcripts
     "seed_tts_eval": {"wer", "wer_interval", "substitutions", "deletions", "insertions", "n",
                       "n_above_50", "wer_below_50", "rules"},               # with transcripts
     "speaker": {"reference", "reference_files", "encoder", "sim_mean", "sim_interval",
                 "sim_pooled", "sim_min", "n"},                              # --speaker-reference
     "naturalness": {"model", "n", "sig"|"bak"|"ovrl"|"p808": {"mean", "interval"}},  # --mos
     "utterances": [{"id", "reference", "hypothesis", "reference_norm", "hypothesis_norm",
                     "wer", "cer", "substitutions", "deletions", "insertions", "ref_words",
                     "char_edits", "ref_chars", "seed_tts_eval": {...}, "asr_seconds",
                     "audio_seconds", "sim", "dnsmos": {"sig", "bak", "ovrl", "p808"}}, ...],
     "asr": {backend description}, "lang", "normalization", "normalizer": {runtime.spoken's
     normalizer_identity(), null when not spoken}, "timing": {...}}

Corpus figures of this project are pooled: total edits over total reference units (what jiwer
computes over lists). For Chinese the words are characters, so WER equals CER. Seed-TTS-eval's are
means of per-utterance rates. SIM figures: ``sim_mean`` is the mean over utterances of the cosine
of each utterance's embedding to the reference (Seed-TTS-eval's SIM); ``sim_pooled`` the cosine of
the utterances' pooled embedding to it. A reference folder is pooled the same way (every ``*.wav``).
"""

from __future__ import annotations

import dataclasses
import os
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.evaluate import textnorm
from chattts_forge.evaluate.stats import bootstrap_interval, bootstrap_ratio_interval
from chattts_forge.log import get_logger
from chattts_forge.options import option
from chattts_forge.progress import track

log = get_logger(__name__)

SCORE_SCHEMA = "chattts-forge/score/1"


def read_transcripts(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse ``ID<TAB>sentence`` lines (blank lines and ``#`` comments skipped)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"transcripts file {path} does not exist") from None
    except OSError as e:
        raise ForgeError(f"cannot read transcripts file {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadInput(f"transcripts file {path} is not UTF-8") from None
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "\t" not in line:
            raise BadInput(f"{path}:{lineno}: expected 'ID<TAB>sentence', got {line[:60]!r}")
        utt_id, sentence = line.split("\t", 1)
        utt_id, sentence = utt_id.strip(), sentence.strip()
        if not utt_id or not sentence:
            raise BadInput(f"{path}:{lineno}: empty id or sentence")
        if utt_id in out:
            raise BadInput(f"{path}:{lineno}: duplicate id '{utt_id}'")
        out[utt_id] = sentence
    if not out:
        raise BadInput(f"transcripts file {path} has no 'ID<TAB>sentence' lines")
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


def _pooled_interval(edits: list[int], units: list[int]) -> list[float] | None:
    """95% bootstrap interval of a pooled rate over utterances (None without reference units)."""
    if not units or sum(units) <= 0:
        return None
    return list(bootstrap_ratio_interval(edits, units))


def _pooled_edits(pairs: list[tuple[str, str]], lang: str, totals: dict[str, int]) -> None:
    """Add the word edits, reference words, character edits and characters of normalised pairs to `totals`."""
    for ref_n, hyp_n in pairs:
        ref_t, hyp_t = textnorm.tokens(ref_n, lang), textnorm.tokens(hyp_n, lang)
        sub, dele, ins, _ = _edits(ref_t, hyp_t)
        totals["edits"] += sub + dele + ins
        totals["words"] += len(ref_t)
        char_edits, chars = _char_edits(ref_n, hyp_n)
        totals["char_edits"] += char_edits
        totals["chars"] += chars


def error_rates(
    references: dict[str, str], hypotheses: dict[str, str], lang: str, spoken: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(corpus, utterances) WER/CER of `hypotheses` against `references` (same ids); `spoken`: both
    sides in their spoken form first (see the module doc), False: the project's number rules only."""
    missing = sorted(set(references) - set(hypotheses))
    if missing:
        raise BadInput(f"no hypothesis for utterance(s) {', '.join(missing[:5])}")
    totals = {"sub": 0, "del": 0, "ins": 0, "words": 0, "char_edits": 0, "chars": 0}
    raw_totals = {"edits": 0, "words": 0, "char_edits": 0, "chars": 0}
    unspoken_pairs: list[tuple[str, str]] = []
    utterances = []
    for utt_id, reference in references.items():
        hypothesis = hypotheses[utt_id]
        ref_n = textnorm.normalize(reference, lang, spoken=spoken)
        hyp_n = textnorm.normalize(hypothesis, lang, spoken=spoken)
        if spoken:
            unspoken_pairs.append((textnorm.normalize(reference, lang), textnorm.normalize(hypothesis, lang)))
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
        _pooled_edits([(textnorm.normalize(reference, lang, False), textnorm.normalize(hypothesis, lang, False))],
                      lang, raw_totals)
        utterances.append(
            {
                "id": utt_id,
                "reference": reference,
                "hypothesis": hypothesis,
                "reference_norm": ref_n,
                "hypothesis_norm": hyp_n,
                "wer": _rate(sub + dele + ins, len(ref_t)),
                "cer": _rate(char_edits, chars),
                "substitutions": sub,
                "deletions": dele,
                "insertions": ins,
                "ref_words": len(ref_t),
                "char_edits": char_edits,
                "ref_chars": chars,
            }
        )
    wer = _rate(totals["sub"] + totals["del"] + totals["ins"], totals["words"])
    cer = _rate(totals["char_edits"], totals["chars"])
    metric = "cer" if lang == "zh" else "wer"
    corpus = {
        "wer": wer,
        "cer": cer,
        "wer_interval": _pooled_interval([u["substitutions"] + u["deletions"] + u["insertions"] for u in utterances],
                                         [u["ref_words"] for u in utterances]),
        "cer_interval": _pooled_interval([u["char_edits"] for u in utterances], [u["ref_chars"] for u in utterances]),
        "n": len(utterances),
        "metric": metric,
        "error_rate": cer if metric == "cer" else wer,
        "wer_raw": _rate(raw_totals["edits"], raw_totals["words"]),
        "cer_raw": _rate(raw_totals["char_edits"], raw_totals["chars"]),
        **_unspoken_figures(unspoken_pairs, lang, spoken),
        "ref_words": totals["words"],
        "ref_chars": totals["chars"],
        "substitutions": totals["sub"],
        "deletions": totals["del"],
        "insertions": totals["ins"],
    }
    return corpus, utterances


def _unspoken_figures(pairs: list[tuple[str, str]], lang: str, spoken: bool) -> dict[str, Any]:
    """The corpus' "wer_unspoken"/"cer_unspoken" (only when scored spoken) and "normalizer"."""
    if not spoken:
        return {"normalizer": "off"}
    t = {"edits": 0, "words": 0, "char_edits": 0, "chars": 0}
    _pooled_edits(pairs, lang, t)
    return {"wer_unspoken": _rate(t["edits"], t["words"]), "cer_unspoken": _rate(t["char_edits"], t["chars"]),
            "normalizer": textnorm.normalizer_key()}


# ---------------------------------------------------------------- Seed-TTS-eval's own rules

# Seed-TTS-eval deletes these (zhon.hanzi.punctuation + string.punctuation) except the ASCII
# apostrophe; nothing is replaced by a space, and numbers are not normalised.
def _seed_punctuation() -> str:
    from zhon.hanzi import punctuation

    return punctuation + string.punctuation


SEED_TTS_EVAL_RULES = (
    "Seed-TTS-eval run_wer.py: zhon.hanzi.punctuation + string.punctuation deleted (ASCII apostrophe kept), "
    "double spaces once made single; en lower-cased, words; zh hypothesis converted to simplified (zhconv "
    "zh-cn), scored per character; per-utterance WER from jiwer, S/D/I as fractions of len(reference.split(' ')); "
    "pooled figures (average_wer.py) are means over utterances; no number normalisation"
)


def seed_tts_eval_process(reference: str, hypothesis: str, lang: str) -> dict[str, Any]:
    """One utterance as run_wer.py's process_one scores it (`hypothesis` is the raw ASR text)."""
    import jiwer

    if lang not in ("en", "zh"):
        raise BadInput(f"unsupported language '{lang}' (expected en or zh)")
    if lang == "zh":
        import zhconv

        hypothesis = zhconv.convert(hypothesis, "zh-cn")
    truth, hypo = reference, hypothesis
    for ch in _seed_punctuation():
        if ch == "'":
            continue
        truth = truth.replace(ch, "")
        hypo = hypo.replace(ch, "")
    truth, hypo = truth.replace("  ", " "), hypo.replace("  ", " ")
    if lang == "zh":
        truth, hypo = " ".join(truth), " ".join(hypo)
    else:
        truth, hypo = truth.lower(), hypo.lower()
    # run_wer.py divides S/D/I by this length, empty strings between double spaces included.
    ref_len = len(truth.split(" "))
    if truth.strip() and hypo.strip():
        out = jiwer.process_words(truth, hypo)
        sub, dele, ins, hits, ref_words = out.substitutions, out.deletions, out.insertions, out.hits, len(out.references[0])
        wer = float(out.wer)
    else:  # jiwer refuses empty texts; the rates are what they would be
        ref_words = len(truth.split())
        sub, hits = 0, 0
        dele = ref_words if not hypo.strip() else 0
        ins = len(hypo.split()) if not truth.strip() else 0
        wer = _rate(sub + dele + ins, ref_words)
    return {
        "wer": wer,
        "substitutions": sub / ref_len,
        "deletions": dele / ref_len,
        "insertions": ins / ref_len,
        "counts": {"substitutions": sub, "deletions": dele, "insertions": ins, "hits": hits, "ref_words": ref_words},
        "reference_processed": truth,
        "hypothesis_processed": hypo,
    }


def seed_tts_eval_rates(
    references: dict[str, str], hypotheses: dict[str, str], lang: str
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(corpus, {id: utterance}) as Seed-TTS-eval's run_wer.py + average_wer.py compute them."""
    missing = sorted(set(references) - set(hypotheses))
    if missing:
        raise BadInput(f"no hypothesis for utterance(s) {', '.join(missing[:5])}")
    if not references:
        raise BadInput("no utterances to score")
    rows = {utt_id: seed_tts_eval_process(ref, hypotheses[utt_id], lang) for utt_id, ref in references.items()}
    wers = [r["wer"] for r in rows.values()]
    below = [w for w in wers if w <= 0.5]
    corpus = {
        "wer": float(np.mean(wers)),
        "wer_interval": list(bootstrap_interval(wers)),
        "substitutions": float(np.mean([r["substitutions"] for r in rows.values()])),
        "deletions": float(np.mean([r["deletions"] for r in rows.values()])),
        "insertions": float(np.mean([r["insertions"] for r in rows.values()])),
        "n": len(rows),
        "n_above_50": len(wers) - len(below),
        "wer_below_50": float(np.mean(below)) if below else None,
        "rules": SEED_TTS_EVAL_RULES,
    }
    return corpus, rows


def transcribe_waveforms(
    waveforms: dict[str, tuple[np.ndarray, int]],
    ids: list[str],
    backend: Any,
    progress: bool = True,
    desc: str = "ASR",
) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """({id: hypothesis}, {id: asr/audio seconds}) of the utterances `ids` of in-memory audio."""

    from chattts_forge.evaluate.asr import ASR_SAMPLE_RATE, resample

    hypotheses: dict[str, str] = {}
    timing: dict[str, dict[str, float]] = {}
    for utt_id in track(ids, desc, "utt", enabled=progress, leave=False):
        if utt_id not in waveforms:
            raise BadInput(f"no audio for utterance '{utt_id}'")
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
    spoken: bool = True,
) -> dict[str, Any]:
    """The score record of transcribed utterances (`asr`: the backend's description); the corpus
    figures depend only on the references and hypotheses, not on where they were transcribed.
    `spoken`: `error_rates`' (the Seed-TTS-eval figures never use the spoken form)."""
    from chattts_forge.runtime.spoken import normalizer_identity

    corpus, utterances = error_rates(references, hypotheses, lang, spoken=spoken)
    seed_corpus, seed_rows = seed_tts_eval_rates(references, hypotheses, lang)
    for u in utterances:
        u.update(timing[u["id"]])
        u["seed_tts_eval"] = seed_rows[u["id"]]
    total_audio = sum(t["audio_seconds"] for t in timing.values())
    total_asr = sum(t["asr_seconds"] for t in timing.values())
    return {
        "schema": SCORE_SCHEMA,
        "corpus": corpus,
        "seed_tts_eval": seed_corpus,
        "utterances": utterances,
        "asr": asr,
        "lang": lang,
        "normalization": ("spoken form (runtime.spoken, wetext), then " if spoken else "")
        + "seed-tts-eval style: NFKC, zh-cn folding, numbers as words, no punctuation, "
        "lower case; zh scored per character",
        "normalizer": normalizer_identity() if spoken else None,
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


# ---------------------------------------------------------------- speaker similarity and DNSMOS


def _wav_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() == ".wav" and p.is_file())


def load_speaker_reference(path: str | os.PathLike[str], encoder: Any) -> tuple[np.ndarray, list[str]]:
    """(reference embedding, files): one WAV's embedding, or the pooled embedding of a folder's WAVs."""
    from chattts_forge.evaluate.asr import load_audio
    from chattts_forge.evaluate.speaker import SAMPLE_RATE, pooled_reference

    path = Path(path)
    if path.is_dir():
        files = _wav_files(path)
        if not files:
            raise NotFound(f"speaker reference folder {path} has no .wav files")
    elif path.is_file():
        files = [path]
    else:
        raise NotFound(f"speaker reference {path} does not exist")
    embeddings = encoder.embed_many([(load_audio(f, SAMPLE_RATE), SAMPLE_RATE) for f in files])
    return pooled_reference(embeddings), [str(f) for f in files]


def speaker_section(
    waveforms: dict[str, tuple[np.ndarray, int]], reference: np.ndarray, encoder: Any, progress: bool = True
) -> tuple[dict[str, Any], dict[str, float]]:
    """(corpus SIM figures, {id: SIM}) of every waveform to the reference embedding."""

    from chattts_forge.evaluate.speaker import pooled_reference, similarity

    if not waveforms:
        raise BadInput("no utterances to compare with the speaker reference")
    ids = list(waveforms)
    chunks = [ids[i : i + 16] for i in range(0, len(ids), 16)]
    embeddings: dict[str, np.ndarray] = {}
    for chunk in track(chunks, "speaker", "batch", enabled=progress, leave=False):
        embeddings.update(zip(chunk, encoder.embed_many([waveforms[i] for i in chunk]), strict=True))
    sims = {utt_id: similarity(e, reference) for utt_id, e in embeddings.items()}
    values = list(sims.values())
    corpus = {
        "sim_mean": float(np.mean(values)),
        "sim_interval": list(bootstrap_interval(values)),
        "sim_pooled": similarity(pooled_reference(list(embeddings.values())), reference),
        "sim_min": float(np.min(values)),
        "n": len(values),
    }
    return corpus, sims


def naturalness_section(
    waveforms: dict[str, tuple[np.ndarray, int]], dnsmos: Any, progress: bool = True
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """(corpus means with intervals, {id: {sig, bak, ovrl, p808}}) of DNSMOS on every waveform."""

    from chattts_forge.evaluate.naturalness import KEYS

    if not waveforms:
        raise BadInput("no utterances to score with DNSMOS")
    per_utt = {}
    for utt_id in track(list(waveforms), "DNSMOS", "utt", enabled=progress, leave=False):
        per_utt[utt_id] = dnsmos.score(*waveforms[utt_id])
    corpus: dict[str, Any] = {"n": len(per_utt)}
    for key in KEYS:
        values = [m[key] for m in per_utt.values()]
        corpus[key] = {"mean": float(np.mean(values)), "interval": list(bootstrap_interval(values))}
    return corpus, per_utt


@dataclass(frozen=True)
class ScoreSettings:
    """How `score_audio_dir` scores: the ASR (`asr`, `asr_model`, `lang`: guessed from the transcripts
    when None), `threads`, progress bars; SIM to `speaker_reference` and DNSMOS (`mos`). `backend`,
    `encoder` and `dnsmos` may be ready models (reused across calls, e.g. in tests).

    Each `chattts-forge score` option is declared on its field (chattts_forge.options); `audio_dir`,
    `transcripts` and `json_out` (keyword-only) are the command's, which `score_audio_dir` takes as
    arguments instead."""

    audio_dir: Path | None = option(None, "--audio-dir", "Folder of <id>.wav files.", kind="path", required=True,
                                    kw_only=True)
    transcripts: Path | None = option(
        None, "--transcripts", "ID<TAB>sentence per line (UTF-8): WER/CER. Without it no ASR runs and every *.wav is "
        "scored for --speaker-reference / --mos only.", kind="path", kw_only=True)
    asr: str = option("faster-whisper", "--asr", "ASR backend: faster-whisper or pocketsphinx.", show_default=True)
    asr_model: str | os.PathLike[str] | None = option(
        None, "--asr-model",
        "A faster-whisper model folder (default: tiny.en for en, Whisper base for zh, from the asr wheels).",
        kind="path")
    lang: str | None = option(None, "--lang", "Language (default: guessed from the text).", choices=("en", "zh"))
    threads: int | None = option(
        None, "--threads", "ASR/DNSMOS CPU threads (default: OMP_NUM_THREADS or up to 4).", kind=int)
    progress: bool = True  # no CLI option
    speaker_reference: str | os.PathLike[str] | None = option(
        None, "--speaker-reference", "Speaker similarity (GE2E cosine) of every utterance to this recording, or to "
        "the pooled embedding of every *.wav in this folder.", kind="path", metavar="WAV|DIR")
    mos: bool = option(
        False, "--mos", "DNSMOS SIG/BAK/OVRL (P.835) and P.808 per utterance and their means.", is_flag=True)
    json_out: Path | None = option(None, "--json", "Write the full result here.", kind="path", kw_only=True)
    backend: Any = None
    encoder: Any = None
    dnsmos: Any = None


def _audio_to_score(audio_dir: Path, transcripts: str | os.PathLike[str] | dict[str, str] | None,
                    lang: str | None) -> tuple[dict[str, Path], dict[str, str] | None, str | None]:
    """(the audio files by id, the transcripts or None, the language) of a `score_audio_dir` call."""
    if transcripts is None:
        paths = {p.stem: p for p in _wav_files(audio_dir)}
        if not paths:
            raise NotFound(f"audio folder {audio_dir} has no .wav files")
        return paths, None, lang
    references = transcripts if isinstance(transcripts, dict) else read_transcripts(transcripts)
    lang = lang or textnorm.detect_lang(list(references.values()))
    if lang not in ("en", "zh"):
        raise BadInput(f"unsupported language '{lang}' (expected en or zh)")
    paths = {utt_id: audio_dir / f"{utt_id}.wav" for utt_id in references}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise BadInput(f"{len(missing)} audio file(s) missing, e.g. {missing[0]}")
    return paths, references, lang


def score_audio_dir(
    audio_dir: str | os.PathLike[str],
    transcripts: str | os.PathLike[str] | dict[str, str] | None = None,
    settings: ScoreSettings | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Score ``<audio_dir>/<id>.wav`` (see the module doc) as `settings` says (`options`: ScoreSettings'
    fields, the shorthand).

    With `transcripts`, every transcript line is transcribed and scored (WER/CER, both ways);
    without, every ``*.wav`` in the folder is scored for SIM (`speaker_reference`) and/or DNSMOS
    (`mos`) only.
    """
    from chattts_forge.evaluate.asr import get_backend, load_audio

    st = dataclasses.replace(settings or ScoreSettings(), **options)
    audio_dir = Path(audio_dir)
    if not audio_dir.is_dir():
        raise NotFound(f"audio folder {audio_dir} does not exist")
    if transcripts is None and st.speaker_reference is None and not st.mos:
        raise BadInput("nothing to score: give transcripts, a speaker reference or --mos")
    paths, references, lang = _audio_to_score(audio_dir, transcripts, st.lang)
    waveforms = {utt_id: (load_audio(p), 16000) for utt_id, p in paths.items()}
    if references is not None:
        backend, load_seconds = st.backend, 0.0
        if backend is None:
            t0 = time.perf_counter()
            backend = get_backend(st.asr, lang, st.asr_model, st.threads)
            load_seconds = time.perf_counter() - t0
        log.info("scoring %d utterances in %s with %s (%s)", len(paths), audio_dir, backend.name, lang)
        result = score_waveforms(waveforms, references, backend, lang, progress=st.progress)
        result["timing"]["asr_load_seconds"] = load_seconds
    else:
        result = {"schema": SCORE_SCHEMA, "lang": lang, "utterances": [{"id": utt_id} for utt_id in paths]}
    result["audio_dir"] = str(audio_dir)
    _score_voice(result, waveforms, st)
    return result


def _score_voice(result: dict[str, Any], waveforms: dict[str, tuple[np.ndarray, int]], st: ScoreSettings) -> None:
    """`score_audio_dir`'s speaker similarity and DNSMOS sections, per utterance too (in `result`)."""
    rows = {u["id"]: u for u in result["utterances"]}
    if st.speaker_reference is not None:
        from chattts_forge.evaluate.speaker import SpeakerEncoder

        encoder = st.encoder or SpeakerEncoder.load()
        reference, files = load_speaker_reference(st.speaker_reference, encoder)
        log.info("speaker similarity of %d utterances to %s (%d file(s))", len(waveforms), st.speaker_reference,
                 len(files))
        corpus, sims = speaker_section(waveforms, reference, encoder, st.progress)
        result["speaker"] = {"reference": str(st.speaker_reference), "reference_files": files,
                             "encoder": encoder.describe(), **corpus}
        for utt_id, sim in sims.items():
            rows[utt_id]["sim"] = sim
    if st.mos:
        from chattts_forge.evaluate.naturalness import Dnsmos

        dnsmos = st.dnsmos or Dnsmos.load(threads=st.threads)
        log.info("DNSMOS of %d utterances", len(waveforms))
        corpus, per_utt = naturalness_section(waveforms, dnsmos, st.progress)
        result["naturalness"] = {"model": dnsmos.describe(), **corpus}
        for utt_id, m in per_utt.items():
            rows[utt_id]["dnsmos"] = m
