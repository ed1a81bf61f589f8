"""The spoken form of a text: numbers, money, dates, times, units and symbols written out as words.

ChatTTS registers no normalizer, so its front end deletes every digit, currency sign and `?`
(`chattts_text.Normalizer` keeps CJK, Latin letters and `，。、,.`). `SpokenNormalizer` runs before it:

1. ChatTTS control tags (`[uv_break]`, `[laugh]`, `[speed_5]`, ...) are set aside and put back untouched.
2. Full-width digits, letters and symbols become ASCII (`２０２６` -> `2026`); CJK punctuation stays.
3. Phone numbers and long digit strings (order numbers, codes) are read digit by digit, as people read
   them (`+86 138 0013 8000`, `555-0123`, `20261206`); thousands separators are dropped.
4. The text is cut into Chinese and English spans (a number goes with the language of the words it
   belongs to: `在 3 点` is Chinese, `at 3 pm` English) and each span is verbalized by wetext's
   WeTextProcessing grammars for its language (FSTs through kaldifst, no torch).
5. `?` `!` become sentence ends and `;` `:` clause marks the model can speak; what still cannot be
   spoken is listed in `SpokenText.removed` (the caller reports it) rather than dropped in silence.

The grammars (runtime.spoken_grammars) load on first use, per language, and only for spans that hold
something to verbalize: plain words never load them. `NORMALIZER_IDENTITY` names what produced a text
(caches key on it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.chattts_text import Normalizer
from chattts_forge.runtime.spoken_grammars import GRAMMARS, NEEDS_GRAMMAR, verbalize_chunks

log = get_logger(__name__)

# Bumped whenever the rules below change what a text becomes (caches and records key on it).
RULES_VERSION = 4
WETEXT_DIST = "wetext"


def wetext_version() -> str:
    try:
        return importlib.metadata.version(WETEXT_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def normalizer_identity() -> dict[str, Any]:
    """What turns written text into spoken text here: recorded in artifact.json, the manifest and cache keys."""
    return {"name": "wetext", "version": wetext_version(), "rules": RULES_VERSION,
            "options": {"operator": "tn", "languages": ["zh", "en"], "phones": "digit-by-digit"}}


def identity_key(identity: dict[str, Any] | None) -> str:
    """A short stable string of an identity (None: normalization off)."""
    if identity is None:
        return "off"
    return f"{identity['name']}-{identity['version']}-r{identity['rules']}"


@dataclass(frozen=True)
class SpokenText:
    """A text in its spoken form and the characters that could not be spoken (sorted, unique)."""

    text: str
    removed: str = ""


# ---- character classes ----------------------------------------------------------------------------

# A ChatTTS control tag ([uv_break], [laugh], [speed_5]) and a CJK ideograph: the segmenter reads them too.
CONTROL_TAG = re.compile(r"\[[A-Za-z_]+(?:_\d+)?\]")
_CJK_CLASS = "\u4e00-\u9fff\u3400-\u4dbf"
CJK = re.compile(f"[{_CJK_CLASS}]")
# Full-width ASCII variants (U+FF01..U+FF5E) to ASCII, except the CJK punctuation ChatTTS speaks as pauses.
_KEEP_FULLWIDTH = set("，！？：；（）")
_FULL_TO_HALF = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F) if chr(c) not in _KEEP_FULLWIDTH}
_FULL_TO_HALF[0x3000] = 0x20  # ideographic space
_FULL_TO_HALF.update({ord("–"): ord("-"), ord("—"): ord(","), ord("…"): ord(","),
                      ord("‐"): ord("-"), ord("﹣"): ord("-")})
# The minus sign U+2212 between two numbers is subtraction (`5 − 3`); anywhere else it is a sign (`−3.5`).
_BINARY_MINUS = re.compile(r"(?<=[\d)])\s*−\s*(?=[\d(])")

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_PHONE_DIGITS = "零幺二三四五六七八九"  # 1 is read 幺 in phone numbers
_EN_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_CURRENCY_WORDS = {"zh": {"$": "美元", "€": "欧元", "£": "英镑", "¥": "元", "￥": "元", "₹": "卢比", "¢": "美分",
                          "₩": "韩元"},
                   "en": {"$": "dollars", "€": "euros", "£": "pounds", "¥": "yuan", "￥": "yuan", "₹": "rupees",
                          "¢": "cents", "₩": "won"}}
_SYMBOL_WORDS = {"zh": {"+": "加", "=": "等于", "×": "乘", "−": "减", "÷": "除以", "%": "百分号", "@": "艾特", "#": "井号",
                        "&": "和", "°": "度", "℃": "摄氏度", "℉": "华氏度", "/": "斜杠", "*": "星号", "‰": "千分号",
                        "π": "派"},
                 "en": {"+": "plus", "=": "equals", "×": "times", "−": "minus", "÷": "divided by", "%": "percent", "@": "at",
                        "#": "number", "&": "and", "°": "degrees", "℃": "degrees Celsius", "℉": "degrees Fahrenheit", "π": "pi",
                        "/": "slash", "*": "star", "‰": "per mille"}}

# A phone number: an optional +country code, then groups of digits split by spaces, dashes, dots or
# parentheses, 7 digits or more in all; or one run of 7+ digits (an order number, a code).
_PHONE = re.compile(
    r"(?<![\w.,:/\-])(?:(?:\+\d{1,3}[ \-]?)?(?:\(\d{2,4}\)[ \-]?)?\d{2,4}(?:[ \-]\d{2,4}){1,4}|0\d{2,3}-\d{7,8})"
    r"(?![\w:/]|[.,]\d)"
)
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}-\d{1,2}-\d{4}")
_LONG_DIGITS = re.compile(r"(?<![\d.,$€£¥￥+\-])\d{7,}(?![\w%]|[.,]\d)")
_CODE = re.compile(r"((?:码|号|\b(?:code|PIN|pin|number))(?:是|为|[:：]|\s+is)?\s*)(?<![\d,.])(\d{4,6})(?![\w%]|[.,:]\d)")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
# ?!;: and their full-width forms: sentence ends and clause marks the model can speak.
_PAUSES = {"zh": str.maketrans({"?": "。", "？": "。", "!": "。", "！": "。", ";": "，", "；": "，", ":": "，", "：": "，"}),
           "en": str.maketrans({"?": ".", "？": ".", "!": ".", "！": ".", ";": ",", "；": ",", ":": ",", "：": ","})}


# Compatibility characters that stand for digits, fractions or units (², ½, ①, ㎞, ㎏, ㎡): their NFKC
# form, which the grammars read (½ -> 1/2, ㎞ -> km); CJK punctuation is left alone.
_COMPATIBILITY = re.compile(r"[\u00b9\u00bc-\u00be\u2070-\u2079\u2150-\u215f\u2460-\u2473\u3380-\u33df]")
_DIGIT_COLON = re.compile(r"(?<=\d)：(?=\d)")  # a full-width colon inside a time (１２：３０)
_SEPARATOR_HYPHEN = re.compile(r"(?<=[A-Za-z])-(?=\d)")  # COVID-19: a separator, not a minus


_SQUARED_UNIT = re.compile(r"(?<=\d)\s?([kcmd]?m)([²³])")  # 5 m² -> 5m2, which the grammars read as a unit


def _compatibility_forms(text: str) -> str:
    def form(m: re.Match[str]) -> str:
        out = unicodedata.normalize("NFKC", m.group(0)).replace("\u2044", "/")
        return out if not out[:1].isdigit() or m.group(0) in "¹" else f" {out} "

    text = _SQUARED_UNIT.sub(lambda m: m.group(1) + ("2" if m.group(2) == "²" else "3"), text)
    return _COMPATIBILITY.sub(form, text)


def _digits(run: str, lang: str, phone: bool) -> str:
    if lang == "zh":
        table = _ZH_PHONE_DIGITS if phone else _ZH_DIGITS
        return "".join(table[int(d)] for d in run)
    return " ".join(_EN_DIGITS[int(d)] for d in run)


def read_digit_by_digit(number: str, lang: str) -> str:
    """`+86 138 0013 8000` -> `加八六，幺三八，零零幺三，八零零零` (zh) / `plus eight six, one three eight, ...`."""
    groups = re.findall(r"\d+", number)
    plus = number.lstrip().startswith("+")
    joiner = "，" if lang == "zh" else ", "
    spoken = joiner.join(_digits(g, lang, phone=True) for g in groups)
    if plus:
        spoken = ("加" if lang == "zh" else "plus ") + spoken
    return spoken


# ---- spans --------------------------------------------------------------------------------------------


def _strong(ch: str) -> str | None:
    if CJK.match(ch):
        return "zh"
    if ch.isascii() and ch.isalpha():
        return "en"
    return None


def language_spans(text: str, default: str) -> list[tuple[str, str]]:
    """Cut `text` into (language, span) runs. Letters and CJK characters decide; what lies between them
    (digits, symbols, spaces) goes to Chinese when Chinese follows it (a measure word: `3 点`, `199元`)
    or when Chinese precedes and no English follows, to English between English words, and else to
    `default` (the text's language)."""
    kinds = [_strong(c) for c in text]
    spans: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        if kinds[i] is not None:
            j = i
            while j < n and kinds[j] == kinds[i]:
                j += 1
            lang = kinds[i]
        else:
            j = i
            while j < n and kinds[j] is None:
                j += 1
            prev = next((k for k in reversed(kinds[:i]) if k), None)
            nxt = kinds[j] if j < n else None
            if nxt == "zh" or (prev == "zh" and nxt is None):
                lang = "zh"
            elif prev == "en" and nxt in ("en", None) or prev is None and nxt == "en":
                lang = "en"
            else:
                lang = default
        assert lang is not None
        if spans and spans[-1][0] == lang:
            spans[-1] = (lang, spans[-1][1] + text[i:j])
        else:
            spans.append((lang, text[i:j]))
        i = j
    return spans


def _digit_runs(text: str, default: str) -> str:
    """Phone numbers and long digit strings read digit by digit, in the language around them."""

    def lang_at(m: re.Match[str]) -> str:
        start = m.start()
        while start and text[start - 1].isascii() and text[start - 1].isalpha():  # a code's prefix: SF123...
            start -= 1
        before = next((_strong(c) for c in reversed(text[:start]) if _strong(c)), None)
        after = next((_strong(c) for c in text[m.end():] if _strong(c)), None)
        if after == "zh" or (before == "zh" and after is None):
            return "zh"
        if before == "en" or after == "en":
            return "en"
        return default

    def phone(m: re.Match[str]) -> str:
        number = m.group(0)
        groups = re.findall(r"\d+", number)
        plus = number.startswith("+")
        if not plus and (sum(map(len, groups)) < 7 or _DATE.fullmatch(number)
                         or (len(groups) == 2 and all(g.endswith("00") for g in groups))):  # a range
            return number
        sep = " " if lang_at(m) == "en" else ""
        return sep + read_digit_by_digit(m.group(0), lang_at(m)) + sep

    text = _PHONE.sub(phone, text)
    text = _LONG_DIGITS.sub(lambda m: read_digit_by_digit(m.group(0), lang_at(m)), text)

    def code(m: re.Match[str]) -> str:  # a short code after its name: 验证码是 846512, PIN 4821
        sep = " " if lang_at(m) == "en" else ""
        return m.group(1) + sep + read_digit_by_digit(m.group(2), lang_at(m)) + sep

    return _CODE.sub(code, text)


# A short unit or suffix written against a number (5km, 60kg, 1.5L, 3rd, 4K) goes with the number's span.
_UNIT_AFTER_DIGIT = 3
_UNIT = re.compile(r"[A-Za-z]{1,3}(?:[23]|/[A-Za-z]{1,2})?\b")  # km, kg, km/h, m2 (a squared unit)


def _attach_units(spans: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for lang, span in spans:
        if (lang == "en" and out and out[-1][1][-1:].isdigit() and len(span) <= _UNIT_AFTER_DIGIT
                and span.isalpha()):
            out[-1] = (out[-1][0], out[-1][1] + span)
        elif lang == "en" and out and out[-1][1][-1:].isdigit() and _UNIT.match(span):
            unit = _UNIT.match(span).group(0)  # type: ignore[union-attr]
            out[-1] = (out[-1][0], out[-1][1] + unit)
            out.append((lang, span[len(unit):]))
        else:
            out.append((lang, span))
    merged: list[tuple[str, str]] = []
    for lang, span in out:
        if merged and merged[-1][0] == lang:
            merged[-1] = (lang, merged[-1][1] + span)
        elif span:
            merged.append((lang, span))
    return merged


def _leftovers(text: str, lang: str) -> str:
    """What a grammar left written: digits (read one by one), currency signs and operators (named)."""
    words = {**_CURRENCY_WORDS[lang], **_SYMBOL_WORDS[lang]}
    sep = "" if lang == "zh" else " "

    def name(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.isdigit():
            return sep + _digits(tok, lang, phone=False) + sep
        return sep + words[tok] + sep

    out = re.sub(r"\d+|[" + re.escape("".join(words)) + "]", name, text)
    return re.sub(r" {2,}", " ", out)


def _tidy(text: str, lang: str) -> str:
    text = text.translate(_PAUSES[lang])
    if lang == "en":
        text = re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", " ", text)  # twenty-one, COVID-nineteen
    return text


# ---- passes around the grammars: what wetext 0.1.8 reads wrong or not as people say it --------------------

_CENT_WORDS = {"$": ("cent", "cents"), "€": ("cent", "cents"), "£": ("penny", "pence")}
_EN_MONEY_CENTS = re.compile(r"([$€£])(\d+)\.(\d\d?)(?!\d|\.\d)(?!\s*(?:thousand|million|billion|trillion)\b)")
_YUAN = re.compile(r"[¥￥]\s?(\d+(?:\.\d+)?)(\s*(?:thousand|million|billion|trillion)\b)?")
_DECADE = re.compile(r"\b(1\d|20)(\d0)'?s\b")
_NUMBER_WORDS = frozenset(
    "a one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred and".split())
_ZH_YUAN = re.compile(r"[¥￥]\s?(\d+)(?:\.(\d{1,2}))?(?![\d.万亿千百])|(?<![\d.])(\d+)\.(\d{1,2})元")


def _strip_zeros(number: str) -> str:
    return number.rstrip("0").rstrip(".") if "." in number else number


# Currency signs wetext does not know: the amount, then the currency's name (₹500 -> 500 rupees).
_OTHER_CURRENCY = re.compile(r"([₹₩])\s?(\d[\d,]*(?:\.\d+)?)|(\d[\d,]*(?:\.\d+)?)\s?(¢)")
# A power after a number or a single-letter variable (x², 2³); a squared unit (m², km²) is NFKC's m2.
_POWER = re.compile(r"(?<![A-Za-z])([A-Za-z]|\d+)([²³])")


def _pre_both(text: str, lang: str) -> str:
    words = _CURRENCY_WORDS[lang]
    sep = "" if lang == "zh" else " "

    def other(m: re.Match[str]) -> str:
        amount, sign = (m.group(2), m.group(1)) if m.group(1) else (m.group(3), m.group(4))
        return f"{amount}{sep}{words[sign]}"

    text = _OTHER_CURRENCY.sub(other, text)
    power = {"zh": {"²": "的平方", "³": "的立方"}, "en": {"²": " squared", "³": " cubed"}}[lang]
    text = _POWER.sub(lambda m: m.group(1) + power[m.group(2)], text)
    return text.replace("π", f"{sep}{_SYMBOL_WORDS[lang]['π']}{sep}")


def _pre_en(text: str) -> str:
    text = _BINARY_MINUS.sub(" − ", text)
    if "=" in text:  # an equation: `10 - 3 = 7` subtracts (elsewhere `10-20` is a range)
        text = re.sub(r"(?<=\d)\s+-\s+(?=\d)|(?<=\d)-(?=\d+\s*=)", " − ", text)
    text = re.sub(r"(?<=[\d²³)])\s*=\s*(?=[\d\-(])|(?<=squared)\s*=\s*|(?<=cubed)\s*=\s*", " = ", text)  # 2=5: not "equal sign"
    text = re.sub(r"(?<=\d)\s*×\s*(?=\d)", " times ", text).replace("÷", " divided by ").replace("−", " minus ")
    text = re.sub(r"(?<=\d)\s*~\s*(?=\d)", " to ", text)
    text = re.sub(r"~\s*(?=\d)", "about ", text)
    text = re.sub(r"(\d+(?:\.\d+)?)%\s*(?:-|to)\s*(?=\d+(?:\.\d+)?%)", r"\1 to ", text)
    text = re.sub(r"(\d\.\d+)(?=[A-Za-z])", r"\1 ", text)  # 1.5L: wetext reads one.five L
    text = re.sub(r"(?<=\d)\s?L\b", " liters", text)

    def decade(m: re.Match[str]) -> str:  # 1990s: wetext reads one thousand nine hundred and ninety seconds
        words = GRAMMARS.get("en").normalize(m.group(1) + m.group(2)).split()
        last = words[-1]
        words[-1] = last[:-1] + "ies" if last.endswith("y") else last + "s"
        return " ".join(words)

    text = _DECADE.sub(decade, text)

    def cents(m: re.Match[str]) -> str:  # $3.50: three dollars and fifty cents, not three point five dollars
        sign, whole, part = m.groups()
        n = int(part.ljust(2, "0"))
        unit = _CENT_WORDS[sign][0 if n == 1 else 1]
        if n == 0:
            return f"{sign}{whole}"
        if int(whole) == 0:
            return f"{n} {unit}"
        return f"{sign}{whole} and {n} {unit}"

    text = _EN_MONEY_CENTS.sub(cents, text)
    # ¥ is the yuan here (wetext says yen)
    return _YUAN.sub(lambda m: f"{_strip_zeros(m.group(1))}{m.group(2) or ''} yuan", text)


def _post_en(text: str) -> str:
    # wetext drops the `one` of 1000..1999 in a decimal or with separators (`thousand two hundred ...`)
    def one(m: re.Match[str]) -> str:
        before = text[: m.start()].split()
        if before and before[-1].lower() in _NUMBER_WORDS:
            return m.group(0)
        return "one thousand"

    text = re.sub(r"\bthousand\b", one, text)
    text = re.sub(r"\bten hundred\b", "one thousand", text)  # 1000 read as a year
    return re.sub(r"\bNumber\.\s", "number ", text)


def _pre_zh(text: str) -> str:
    # a number set apart by spaces from its Chinese words: `请按 0`, `在 3 点`
    text = re.sub(rf"(?<=[{_CJK_CLASS}])\s+(?=[-+\d¥￥$€£*#])", "", text)
    text = re.sub(rf"(?<=[\d%℃])\s+(?=[{_CJK_CLASS}])", "", text)
    text = _BINARY_MINUS.sub("减", text).replace("÷", "除以")
    text = re.sub(r"(?<=\d)\s*×\s*(?=\d)", "乘", text)
    text = re.sub(r"(\d+(?:\.\d+)?%)\s*[-~]\s*(?=\d+(?:\.\d+)?%)", r"\1到", text)

    def yuan(m: re.Match[str]) -> str:  # ¥199.50: 一百九十九元五角, not 一百九十九点五零元
        whole = m.group(1) or m.group(3)
        part = (m.group(2) or m.group(4) or "").ljust(2, "0")
        jiao, fen = part[0], part[1]
        out = "" if int(whole) == 0 and part != "00" else f"{whole}元"
        if jiao != "0":
            out += f"{jiao}角"
        elif fen != "0" and out:
            out += "零"
        if fen != "0":
            out += f"{fen}分"
        return out

    text = _ZH_YUAN.sub(yuan, text)
    text = re.sub(r"[¥￥]\s?(\d+(?:\.\d+)?[万亿千百]*)", r"\1元", text)
    return re.sub(r"(?<=[$€£])(\d+\.\d+)", lambda m: _strip_zeros(m.group(1)), text)


def _post_zh(text: str) -> str:
    return re.sub(rf"(?<=[{_CJK_CLASS}]) +(?=[{_CJK_CLASS}])", "", text)


# ---- the normalizer ---------------------------------------------------------------------------------


class SpokenNormalizer:
    """Written text -> spoken text, Chinese and English spans each through wetext (see the module doc)."""

    @staticmethod
    def preload() -> None:
        """Read the grammars in a background thread (`spoken_grammars._Grammars.preload`)."""
        GRAMMARS.preload()

    identity = staticmethod(normalizer_identity)

    def __call__(self, text: str, lang: str | None = None) -> str:
        return self.normalize(text, lang)

    def normalize(self, text: str, lang: str | None = None) -> str:
        default = lang or Normalizer.detect_language(CONTROL_TAG.sub("", text))
        out: list[str] = []
        pos = 0
        for m in CONTROL_TAG.finditer(text):
            out.append(self._sentences(text[pos: m.start()], default))
            out.append(m.group(0))
            pos = m.end()
        out.append(self._sentences(text[pos:], default))
        return re.sub(r" {2,}", " ", "".join(out)).strip()

    def _sentences(self, text: str, default: str) -> str:
        """Sentence by sentence (cut after `。！？!?` and at line ends): a number's language is read from
        its own sentence, not the next line's, and a line break ends a sentence."""
        out = ""
        for piece in _SENTENCE_CUT.split(re.sub(r"[\t\r\f\v]", " ", text)):
            line_end = piece.endswith("\n")
            spoken = self._plain(piece.rstrip("\n"), default).strip()
            if line_end and spoken and spoken[-1] not in _ENDS:  # a line break is a sentence end
                spoken += "。" if CJK.search(spoken) else "."
            if out and spoken and (out[-1].isascii() and out[-1] != "\n") and spoken[0].isascii():
                out += " "
            out += spoken
        return (" " if text[:1].isspace() else "") + out + (" " if text[-1:].isspace() and out else "")

    def _plain(self, text: str, default: str) -> str:
        if not text:
            return text
        text = _compatibility_forms(text.translate(_FULL_TO_HALF)).replace("°C", "℃").replace("°F", "℉")
        text = _SEPARATOR_HYPHEN.sub(" ", _DIGIT_COLON.sub(":", text))
        text = _BINARY_MINUS.sub(" − ", text).replace("−", "-")  # subtraction kept, a sign made ASCII
        if not NEEDS_GRAMMAR.search(text) and not re.search(r"[?？!！;；:：]", text):
            return text
        text = _digit_runs(text, default)  # before separators go: 1,000,000 is a number, 1000000 a code
        text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
        parts = []
        for lang, span in _attach_units(language_spans(text, default)):
            if NEEDS_GRAMMAR.search(span):
                lead = span[: len(span) - len(span.lstrip())]
                trail = span[len(span.rstrip()):]
                core = re.sub(r"\s+", " ", span.strip())  # wetext asserts on a double space
                if core:
                    core = _pre_both(core, lang)
                    core = _pre_zh(core) if lang == "zh" else _pre_en(core)
                    spoken = verbalize_chunks(core, lang)
                    core = _post_zh(spoken) if lang == "zh" else _post_en(spoken)
                span = lead + _leftovers(core, lang) + trail
            parts.append(_tidy(span, lang))
        text = re.sub(r" +(?=[,.，。])", "", "".join(parts))  # `zero one two three .` from a phone
        return re.sub(r" {2,}", " ", text).strip()


_SENTENCE_CUT = re.compile(r"(?<=[。！？!?\n])")
_ENDS = set("。！？!?.，,、；;：:")

SPOKEN = SpokenNormalizer()


def registered(lang: str) -> Callable[[str], str]:
    """A ChatTTS normalizer (str -> str) for `chat.normalizer.register(lang, registered(lang))`: the spoken
    form of the runs ChatTTS hands it (tag-free text detected as `lang`), in that language."""
    if lang not in ("zh", "en"):
        raise ForgeError(f"no spoken-form normalizer for language {lang!r} (zh or en)")
    return lambda text: SPOKEN.normalize(text, lang)


# One line for reports and pages: where the spoken text comes from and how long input is cut.
SEGMENT_NOTE = ("Numbers, money, dates, times and symbols are spoken as words; input up to 4,096 characters is cut "
                "at sentence ends into segments of at most ~20 s of speech; --no-text-normalization / "
                "\"normalize\": false give ChatTTS's own front end.")
