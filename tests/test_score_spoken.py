"""Scoring in the spoken form: a written reference and a transcript that says the number compare equal
(`textnorm.normalize(..., spoken=True)`, `score.error_rates(..., spoken=True)`); no ASR needed."""

from __future__ import annotations

import pytest

from chattts_forge.evaluate import textnorm
from chattts_forge.evaluate.score import error_rates, score_hypotheses, seed_tts_eval_rates


def _wer(ref: str, hyp: str, lang: str = "en", spoken: bool = True) -> float:
    corpus, _ = error_rates({"a": ref}, {"a": hyp}, lang, spoken=spoken)
    return corpus["error_rate"]


def test_written_money_and_spoken_money_are_the_same_words() -> None:
    ref, hyp = "It costs $199.", "It costs one hundred and ninety-nine dollars."
    assert _wer(ref, hyp) == 0.0
    assert _wer(ref, hyp, spoken=False) > 0.0  # the number rules alone: "and" is an insertion
    assert _wer(ref, "It costs one hundred ninety nine dollars.") == 0.0
    assert _wer(ref, "It costs $199") == 0.0


def test_chinese_currency_is_spoken_before_characters_are_compared() -> None:
    assert _wer("金额 ¥5", "金额五元", "zh") == 0.0
    assert _wer("金额 ¥5", "金额五元", "zh", spoken=False) > 0.0  # the sign was only deleted
    corpus, _ = error_rates({"a": "金额 ¥5"}, {"a": "金额五元"}, "zh")
    assert corpus["cer"] == 0.0 and corpus["metric"] == "cer"


def test_number_spellings_are_one_but_other_words_are_not_touched() -> None:
    n = textnorm.normalize
    assert n("one hundred and ninety-nine", "en", spoken=True) == "one hundred ninety nine"
    assert n("$199", "en", spoken=True) == n("one hundred ninety nine dollars", "en", spoken=True)
    # "and" stays outside a number, and between a scale word and a non-number word.
    assert n("bread and butter", "en", spoken=True) == "bread and butter"
    assert n("three hours and twelve minutes", "en", spoken=True) == "three hours and twelve minutes"
    assert n("a hundred and then some", "en", spoken=True) == "a hundred and then some"
    assert _wer("bread and butter", "bread butter") == pytest.approx(1 / 3)
    # wetext reads the zero of "7:05" as "o"; Whisper spells it "oh".
    assert _wer("The train leaves at 7:05.", "The train leaves at seven oh five.") == 0.0
    # Phones digit by digit on both sides.
    assert _wer("Call 555-0123.", "Call five five five zero one two three.") == 0.0


def test_spoken_false_is_the_previous_normalisation() -> None:
    for text in ("The 1st train, at 8:05!", "It costs $3.50, 12% off.", "one hundred and ninety-nine"):
        assert textnorm.normalize(text, "en", spoken=False) == textnorm.normalize(text, "en")
    assert textnorm.normalize("The 1st train, at 8:05!", "en") == "the first train at eight oh five"


def test_records_name_the_normalizer_and_keep_the_unspoken_figure() -> None:
    refs = {"1": "It costs $199.", "2": "Call 555-0123 at 3:30 pm."}
    hyps = {"1": "It costs one hundred and ninety-nine dollars.", "2": "Call five five five zero one two three at 3.30pm."}
    spoken, utts = error_rates(refs, hyps, "en")
    plain, _ = error_rates(refs, hyps, "en", spoken=False)
    assert spoken["wer"] == 0.0 and spoken["wer_unspoken"] == plain["wer"] > 0.0
    assert spoken["normalizer"].startswith("wetext-") and plain["normalizer"] == "off"
    assert "wer_unspoken" not in plain
    assert utts[0]["reference_norm"] == "it costs one hundred ninety nine dollars"
    timing = {k: {"asr_seconds": 0.1, "audio_seconds": 1.0} for k in refs}
    rec = score_hypotheses(refs, hyps, timing, {"backend": "test"}, "en", 0.2)
    assert rec["normalizer"]["name"] == "wetext" and rec["normalization"].startswith("spoken form")
    # The Seed-TTS-eval-compatible figure never uses the spoken form.
    assert rec["seed_tts_eval"] == seed_tts_eval_rates(refs, hyps, "en")[0]
    assert rec["seed_tts_eval"]["wer"] > 0.0
    off = score_hypotheses(refs, hyps, timing, {"backend": "test"}, "en", 0.2, spoken=False)
    assert off["normalizer"] is None and off["corpus"]["wer"] == plain["wer"]
