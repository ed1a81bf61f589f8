"""Scoring text normalisation and WER/CER arithmetic (no ASR involved)."""

from __future__ import annotations

import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate import textnorm
from chattts_forge.evaluate.score import error_rates, read_transcripts


@pytest.mark.parametrize(
    "n, words",
    [
        (0, "zero"),
        (7, "seven"),
        (15, "fifteen"),
        (50, "fifty"),
        (730, "seven hundred thirty"),
        (1200, "one thousand two hundred"),
        (2_000_005, "two million five"),
    ],
)
def test_english_number_words(n: int, words: str) -> None:
    assert textnorm.en_number_words(n) == words


@pytest.mark.parametrize(
    "n, words",
    [(0, "零"), (10, "十"), (12, "十二"), (26, "二十六"), (105, "一百零五"), (1200, "一千二百"), (10000, "一万"), (20000005, "二千万零五")],
)
def test_chinese_number_words(n: int, words: str) -> None:
    assert textnorm.zh_number_words(n) == words


def test_english_digits_and_words_normalise_to_the_same_text() -> None:
    spoken = "Your account balance is twelve dollars and fifty cents."
    for written in ("Your account balance is 12 dollars and 50 cents", "your account balance is $12.50"):
        a = textnorm.normalize(spoken, "en")
        b = textnorm.normalize(written, "en")
        # "$12.50" has no "and"; everything else matches word for word.
        assert a.replace(" and ", " ") == b.replace(" and ", " ")
    assert textnorm.normalize("The 1st train, at 8:05!", "en") == "the first train at eight oh five"
    assert textnorm.normalize("Press zero at ANY time.", "en") == "press zero at any time"
    assert textnorm.normalize("three o'clock", "en") == textnorm.normalize("3 o’clock", "en") == "three oclock"
    assert textnorm.normalize("12 dollars", "en", numbers=False) == "12 dollars"


def test_chinese_folding_numbers_and_characters() -> None:
    ref = "您的会员积分还有一千二百分。"
    hyp = "您的會員積分還有1200分"  # what Whisper writes: Traditional characters, digits
    assert textnorm.normalize(hyp, "zh") == textnorm.normalize(ref, "zh") == "您的会员积分还有一千二百分"
    assert textnorm.normalize("2024年，50%，3.5度", "zh") == "二零二四年 百分之五十 三点五度"
    assert textnorm.tokens(textnorm.normalize("你好 OK 世界！", "zh"), "zh") == ["你", "好", "ok", "世", "界"]
    assert textnorm.detect_lang(["您好，请问有什么可以帮您？"]) == "zh"
    assert textnorm.detect_lang(["Hello, how can I help you today?"]) == "en"


def test_error_rates_are_pooled_over_reference_words() -> None:
    refs = {"a": "one two three four", "b": "five six"}
    hyps = {"a": "one two three four", "b": "five seven eight"}  # 1 substitution + 1 insertion
    corpus, utts = error_rates(refs, hyps, "en")
    assert corpus["n"] == 2
    assert corpus["wer"] == pytest.approx(2 / 6)
    assert [u["wer"] for u in utts] == [0.0, 1.0]
    assert corpus["substitutions"] == 1 and corpus["insertions"] == 1 and corpus["deletions"] == 0
    # Digits in the hypothesis do not count as errors once normalised; they do in the raw figure.
    corpus, _ = error_rates({"a": "leaves every fifteen minutes"}, {"a": "Leaves every 15 minutes."}, "en")
    assert corpus["wer"] == 0.0 and corpus["wer_raw"] == pytest.approx(0.25)


def test_chinese_error_rate_is_per_character() -> None:
    corpus, utts = error_rates({"x": "转人工服务请按零。"}, {"x": "轉人工服務請按鈴"}, "zh")
    assert corpus["metric"] == "cer"
    assert corpus["ref_words"] == 8 and corpus["cer"] == pytest.approx(1 / 8) and corpus["wer"] == corpus["cer"]
    corpus, _ = error_rates({"x": "您好"}, {"x": "《《《"}, "zh")  # a hallucinated run of brackets
    assert corpus["cer"] == 1.0


def test_read_transcripts_errors(tmp_path) -> None:
    good = tmp_path / "t.tsv"
    good.write_text("001\tHello there.\n\n002\tSecond one\n", encoding="utf-8")
    assert read_transcripts(good) == {"001": "Hello there.", "002": "Second one"}
    bad = tmp_path / "bad.tsv"
    bad.write_text("001 no tab here\n", encoding="utf-8")
    with pytest.raises(ForgeError, match="ID<TAB>sentence"):
        read_transcripts(bad)
    dup = tmp_path / "dup.tsv"
    dup.write_text("001\ta\n001\tb\n", encoding="utf-8")
    with pytest.raises(ForgeError, match="duplicate"):
        read_transcripts(dup)
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("001\tcaf\xe9\n".encode("latin-1"))
    with pytest.raises(ForgeError, match="not UTF-8"):
        read_transcripts(latin1)
    with pytest.raises(ForgeError, match="does not exist"):
        read_transcripts(tmp_path / "missing.tsv")
