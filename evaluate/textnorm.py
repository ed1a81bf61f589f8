"""Text normalisation for scoring ASR output, in the manner of Seed-TTS-eval.

Both the reference and the ASR hypothesis go through the same function before WER/CER:

- Unicode NFKC, then (Chinese) Traditional -> Simplified folding with `zhconv` (Whisper often
  writes Traditional characters for Mandarin speech);
- numbers are written out as words, one way for both sides: English digits become English words
  ("12" -> "twelve", "$3.50" -> "three dollars fifty cents", "8th" -> "eighth"); Chinese digits
  become 汉字 ("1200" -> "一千二百", "3.5" -> "三点五", "50%" -> "百分之五十", long digit
  strings and 4-digit years are read digit by digit);
- punctuation (every Unicode P* character, plus a few symbols) is removed, text is lower-cased,
  whitespace is collapsed;
- Chinese is scored per character: `tokens_zh` splits into characters (Latin words inside
  Chinese text stay whole words), so "WER" on Chinese is the character error rate.

`normalize(text, lang, numbers=True, spoken=False)` is the entry point; `numbers=False` gives the
raw (punctuation/case-only) form, used to report the un-normalised figures alongside.

`spoken=True` (what `score.error_rates` uses by default) first turns the text into its spoken form
with the runtime's own normalizer (`runtime.spoken.SPOKEN`, wetext's grammars: `$199` -> "one
hundred and ninety nine dollars", `¥5` -> "五元", phones digit by digit), then applies the rules
above to what is left. So a written reference and a transcript that spells the number out, or writes
it another way, compare equal. Two spellings of the same English number are made one on both sides:
hyphens split words ("ninety-nine" -> "ninety nine", as every punctuation mark does), and an "and"
between a scale word and the number words after it is dropped ("one hundred and ninety nine" ->
"one hundred ninety nine"; "and" anywhere else stays), and a lone "o" (wetext's zero in "7:05" ->
"seven o five") is written "oh", as Whisper spells it. The spoken=False form is byte for byte what it
was before, for the "without" figures.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "normalize",
    "normalize_en",
    "spoken_form",
    "normalizer_key",
    "normalize_zh",
    "tokens",
    "detect_lang",
    "en_number_words",
    "zh_number_words",
]

# ---------------------------------------------------------------- English numbers -> words

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand")]
_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def _en_below_1000(n: int) -> list[str]:
    words: list[str] = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10])
        if n % 10:
            words.append(_ONES[n % 10])
    elif n > 0 or not words:
        words.append(_ONES[n])
    return words


def en_number_words(n: int) -> str:
    """Cardinal English words for a non-negative integer: 1200 -> 'one thousand two hundred'."""
    if n < 1000:
        return " ".join(_en_below_1000(n))
    words: list[str] = []
    for scale, name in _SCALES:
        if n >= scale:
            words += [en_number_words(n // scale), name]
            n %= scale
    if n:
        words += _en_below_1000(n)
    return " ".join(words)


def _en_ordinal(n: int) -> str:
    words = en_number_words(n).split()
    last = words[-1]
    if last in _ORDINAL_IRREGULAR:
        words[-1] = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def _en_digits_one_by_one(s: str) -> str:
    return " ".join(_ONES[int(d)] for d in s)


def _en_number(int_part: str, frac_part: str | None) -> str:
    int_part = int_part.replace(",", "")
    # Long digit strings (phone numbers, codes) are read digit by digit.
    words = _en_digits_one_by_one(int_part) if len(int_part) > 9 else en_number_words(int(int_part))
    if frac_part:
        words += " point " + _en_digits_one_by_one(frac_part)
    return words


_EN_MONEY = re.compile(r"\$\s?(\d[\d,]*)(?:\.(\d{1,2}))?")
_EN_PERCENT = re.compile(r"(\d[\d,]*)(?:\.(\d+))?\s?%")
_EN_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_EN_NUMBER = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?")


def _en_money(m: re.Match[str]) -> str:
    dollars = int(m.group(1).replace(",", ""))
    out = f"{en_number_words(dollars)} {'dollar' if dollars == 1 else 'dollars'}"
    if m.group(2):
        cents = int(m.group(2).ljust(2, "0"))
        if cents:
            out += f" {en_number_words(cents)} {'cent' if cents == 1 else 'cents'}"
    return f" {out} "


def _en_numbers_to_words(text: str) -> str:
    text = _EN_MONEY.sub(_en_money, text)
    text = _EN_PERCENT.sub(lambda m: f" {_en_number(m.group(1), m.group(2))} percent ", text)
    text = _EN_ORDINAL.sub(lambda m: f" {_en_ordinal(int(m.group(1)))} ", text)
    # Clock times "3:30" -> "three thirty"; "7:05" -> "seven oh five".
    text = re.sub(
        r"\b(\d{1,2}):(\d{2})\b",
        lambda m: f" {en_number_words(int(m.group(1)))} "
        + ("" if m.group(2) == "00" else ("oh " if m.group(2)[0] == "0" else ""))
        + ("" if m.group(2) == "00" else en_number_words(int(m.group(2))))
        + " ",
        text,
    )
    return _EN_NUMBER.sub(lambda m: f" {_en_number(m.group(1), m.group(2))} ", text)


# ---------------------------------------------------------------- Chinese numbers -> 汉字

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_UNITS = ["", "十", "百", "千"]
_ZH_BIG = ["", "万", "亿", "万亿"]


def _zh_below_10000(n: int) -> str:
    out = ""
    zero_pending = False
    for pos in range(3, -1, -1):
        d = (n // 10**pos) % 10
        if d == 0:
            if out:
                zero_pending = True
            continue
        if zero_pending:
            out += "零"
            zero_pending = False
        out += _ZH_DIGITS[d] + _ZH_UNITS[pos]
    return out


def zh_number_words(n: int) -> str:
    """Chinese reading of a non-negative integer: 1200 -> '一千二百', 10 -> '十', 105 -> '一百零五'."""
    if n == 0:
        return "零"
    groups = []
    while n:
        groups.append(n % 10000)
        n //= 10000
    out = ""
    zero_pending = False
    for i in range(len(groups) - 1, -1, -1):
        g = groups[i]
        if g == 0:
            zero_pending = bool(out)
            continue
        if out and (zero_pending or g < 1000):
            out += "零"
        zero_pending = False
        out += _zh_below_10000(g) + _ZH_BIG[i]
    # 一十 -> 十 at the very start ("十二", not "一十二").
    if out.startswith("一十"):
        out = out[1:]
    return out


def _zh_digits_one_by_one(s: str) -> str:
    return "".join(_ZH_DIGITS[int(d)] for d in s)


def _zh_read(int_part: str, frac_part: str | None, year: bool = False) -> str:
    int_part = int_part.replace(",", "")
    if (year and len(int_part) == 4) or len(int_part) > 8 or (len(int_part) > 1 and int_part[0] == "0"):
        words = _zh_digits_one_by_one(int_part)  # years, phone numbers, codes
    else:
        words = zh_number_words(int(int_part))
    if frac_part:
        words += "点" + _zh_digits_one_by_one(frac_part)
    return words


def _zh_clock(m: re.Match[str]) -> str:
    minutes = "" if m.group(2) == "00" else _zh_read(m.group(2).lstrip("0") or "0", None)
    return f"{_zh_read(m.group(1), None)}点{minutes}"


def _zh_numbers_to_words(text: str) -> str:
    text = re.sub(r"(\d[\d,]*)(?:\.(\d+))?\s?%", lambda m: "百分之" + _zh_read(m.group(1), m.group(2)), text)
    text = re.sub(r"(\d{1,2}):(\d{2})", _zh_clock, text)
    return re.sub(
        r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(年)?",
        lambda m: _zh_read(m.group(1), m.group(2), year=bool(m.group(3))) + (m.group(3) or ""),
        text,
    )


# ---------------------------------------------------------------- shared

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _strip_punctuation(text: str) -> str:
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        # Symbols are dropped like punctuation: once numbers are spelled out they are not spoken.
        if cat.startswith("P") or cat.startswith("S"):
            # An apostrophe joins a word ("o'clock" -> "oclock"), any other mark separates words.
            out.append("" if ch in "'’" else " ")
        else:
            out.append(ch)
    return "".join(out)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def normalize_en(text: str, numbers: bool = True) -> str:
    text = unicodedata.normalize("NFKC", text)
    if numbers:
        text = _en_numbers_to_words(text)
    text = _strip_punctuation(text).lower()
    # Hyphenated words ("well-known") become separate words on both sides.
    return _collapse(text)


def normalize_zh(text: str, numbers: bool = True) -> str:
    import zhconv  # small, pure Python; imported here so English-only use never loads its table

    text = unicodedata.normalize("NFKC", text)
    text = zhconv.convert(text, "zh-cn")
    if numbers:
        text = _zh_numbers_to_words(text)
    text = _strip_punctuation(text).lower()
    return _collapse(text)


# ---------------------------------------------------------------- spoken form first

# "and" is dropped only after one of these and before one of the number words below.
_EN_SCALE_WORDS = frozenset(["hundred", "thousand", "million", "billion", "trillion"])
_EN_SMALL_NUMBER_WORDS = frozenset(_ONES[1:] + _TENS[2:])


def _en_number_words_one_way(normalized: str) -> str:
    """One spelling of English number words in an already normalised text: 'one hundred and ninety
    nine' -> 'one hundred ninety nine' (an "and" only between a scale word and a number word), and the
    zero read as a letter written 'oh' ('seven o five' -> 'seven oh five')."""
    words = normalized.split()
    keep = [
        "oh" if w == "o" else w
        for i, w in enumerate(words)
        if not (w == "and" and 0 < i < len(words) - 1 and words[i - 1] in _EN_SCALE_WORDS
                and words[i + 1] in _EN_SMALL_NUMBER_WORDS)
    ]
    return " ".join(keep)


def spoken_form(text: str, lang: str) -> str:
    """`text` as it is spoken (`runtime.spoken.SPOKEN`, wetext), in `lang`; not yet scoring-normalised."""
    from chattts_forge.runtime.spoken import SPOKEN

    return SPOKEN.normalize(text, lang)


def normalizer_key() -> str:
    """What `spoken=True` verbalizes with, as a short string ('wetext-0.1.8-r1')."""
    from chattts_forge.runtime.spoken import identity_key, normalizer_identity

    return identity_key(normalizer_identity())


def normalize(text: str, lang: str, numbers: bool = True, spoken: bool = False) -> str:
    """Scoring form of `text` for `lang` ('en' or 'zh'); see the module docstring."""
    if lang not in ("en", "zh"):
        raise ValueError(f"unsupported language {lang!r} (expected 'en' or 'zh')")
    if spoken:
        text = spoken_form(text, lang)
    if lang == "en":
        out = normalize_en(text, numbers=numbers)
        return _en_number_words_one_way(out) if spoken else out
    return normalize_zh(text, numbers=numbers)


def tokens(normalized: str, lang: str) -> list[str]:
    """Scoring units: words for English; characters for Chinese (Latin words inside stay whole)."""
    if lang == "en":
        return normalized.split()
    units: list[str] = []
    for word in normalized.split():
        buf = ""
        for ch in word:
            if _CJK.match(ch):
                if buf:
                    units.append(buf)
                    buf = ""
                units.append(ch)
            else:
                buf += ch
        if buf:
            units.append(buf)
    return units


def detect_lang(sentences: list[str]) -> str:
    """'zh' when the text is mostly CJK characters, else 'en'."""
    joined = "".join(sentences)
    cjk = len(_CJK.findall(joined))
    letters = sum(ch.isalpha() for ch in joined)
    return "zh" if letters and cjk / letters > 0.3 else "en"
