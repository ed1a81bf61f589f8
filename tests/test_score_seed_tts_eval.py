"""Seed-TTS-eval-compatible scoring: the rules of its run_wer.py / average_wer.py, by hand-counted
cases, and the score record's per-utterance edit counts and bootstrap intervals."""

from __future__ import annotations

import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.score import (
    error_rates,
    score_hypotheses,
    seed_tts_eval_process,
    seed_tts_eval_rates,
)


def _row(ref: str, hyp: str, lang: str = "en") -> tuple[float, float, float, float]:
    r = seed_tts_eval_process(ref, hyp, lang)
    return r["wer"], r["substitutions"], r["deletions"], r["insertions"]


def test_punctuation_is_deleted_case_folded_numbers_left_alone() -> None:
    assert _row("Hello, world!", "hello world") == (0.0, 0.0, 0.0, 0.0)
    # Deleted, not replaced by a space: "well-known" is one word, so "well known" is 1 sub + 1 ins.
    assert _row("A well-known fact.", "a well known fact") == pytest.approx((2 / 3, 1 / 3, 0.0, 1 / 3))
    # The ASCII apostrophe is kept; the typographic one is zhon punctuation and goes.
    assert _row("Don't stop.", "dont stop") == pytest.approx((0.5, 0.5, 0.0, 0.0))
    assert _row("Don’t stop.", "dont stop") == (0.0, 0.0, 0.0, 0.0)
    # No number normalisation (unlike this project's own figures).
    assert _row("I have 3 cats.", "I have three cats.") == pytest.approx((0.25, 0.25, 0.0, 0.0))
    ours, _ = error_rates({"a": "I have 3 cats."}, {"a": "I have three cats."}, "en")
    assert ours["wer"] == 0.0


def test_rates_are_over_the_reference_split_on_single_spaces() -> None:
    # "Wait , , now" -> "Wait   now" -> one double space made single -> "wait  now": run_wer.py divides
    # S/D/I by len("wait  now".split(" ")) = 3 while jiwer's WER counts 2 reference words.
    wer, sub, dele, ins = _row("Wait , , now", "wait later now")
    assert wer == pytest.approx(0.5) and ins == pytest.approx(1 / 3) and sub == dele == 0.0


def test_chinese_is_per_character_after_simplified_conversion() -> None:
    assert _row("这是测试。", "這是測試", "zh") == (0.0, 0.0, 0.0, 0.0)  # Traditional ASR output
    assert _row("你好，世界", "你好世", "zh") == pytest.approx((0.25, 0.0, 0.25, 0.0))
    r = seed_tts_eval_process("你好，世界", "你好世", "zh")
    assert r["reference_processed"] == "你 好 世 界" and r["counts"]["ref_words"] == 4


def test_empty_texts() -> None:
    assert _row("hello there", "") == (1.0, 0.0, 1.0, 0.0)
    assert _row("!", "extra words") == (1.0, 0.0, 0.0, 2.0)  # empty reference: run_wer.py's divisor is 1
    with pytest.raises(ForgeError, match="unsupported language"):
        seed_tts_eval_process("a", "a", "fr")


def test_corpus_figures_are_means_of_utterance_rates() -> None:
    refs = {"a": "the cat sat", "b": "one two", "c": "a b c d e f g h i j"}
    hyps = {"a": "the cat sat down", "b": "one two", "c": "a b c d e f g h i x"}
    corpus, rows = seed_tts_eval_rates(refs, hyps, "en")
    assert corpus["wer"] == pytest.approx((1 / 3 + 0 + 1 / 10) / 3)  # not pooled: 2 / 15
    assert corpus["insertions"] == pytest.approx(1 / 9) and corpus["substitutions"] == pytest.approx(1 / 30)
    assert corpus["n"] == 3 and corpus["n_above_50"] == 0
    lo, hi = corpus["wer_interval"]
    assert lo <= corpus["wer"] <= hi
    assert rows["a"]["counts"] == {"substitutions": 0, "deletions": 0, "insertions": 1, "hits": 3, "ref_words": 3}
    ours, _ = error_rates(refs, hyps, "en")
    assert ours["wer"] == pytest.approx(2 / 15)
    with pytest.raises(ForgeError, match="no hypothesis"):
        seed_tts_eval_rates(refs, {"a": "x"}, "en")


def test_score_record_carries_both_and_per_utterance_counts() -> None:
    refs = {"1": "Please hold the line.", "2": "Your order has shipped.", "3": "Thank you for calling."}
    hyps = {"1": "please hold the line", "2": "your order has slipped", "3": "thank you for calling today"}
    timing = {k: {"asr_seconds": 0.1, "audio_seconds": 1.0} for k in refs}
    rec = score_hypotheses(refs, hyps, timing, {"backend": "test"}, "en", 0.3)
    c = rec["corpus"]
    assert c["wer"] == pytest.approx(2 / 12)
    lo, hi = c["wer_interval"]
    assert 0.0 <= lo <= c["wer"] <= hi <= 0.5
    u = {x["id"]: x for x in rec["utterances"]}
    assert (u["2"]["substitutions"], u["2"]["deletions"], u["2"]["insertions"], u["2"]["ref_words"]) == (1, 0, 0, 4)
    assert u["3"]["insertions"] == 1 and u["3"]["seed_tts_eval"]["insertions"] == pytest.approx(1 / 4)
    assert rec["seed_tts_eval"]["wer"] == pytest.approx((0 + 1 / 4 + 1 / 4) / 3)
    assert "run_wer.py" in rec["seed_tts_eval"]["rules"]
