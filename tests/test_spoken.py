"""runtime.spoken: the spoken form of written text (wetext per Chinese/English span plus small passes).

The case table tests/data/spoken_cases.tsv holds what a human reader would say: `expect` lists
substrings that must appear (` | ` between them), `absent` substrings that must not.
"""

from __future__ import annotations

import csv
import importlib.metadata
import re
from pathlib import Path

import pytest

from chattts_forge.runtime.spoken import CONTROL_TAG, SPOKEN, normalizer_identity

CASES_PATH = Path(__file__).resolve().parent / "data" / "spoken_cases.tsv"
LANGS = {"zh", "en", "mixed", "tags", "edge"}


def _split(cell: str | None) -> list[str]:
    return [part for part in (cell or "").split(" | ") if part.strip()]


def _load_cases() -> list[dict[str, str]]:
    with CASES_PATH.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


CASES = _load_cases()


def test_case_table_is_well_formed() -> None:
    assert len(CASES) >= 170
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert case["lang"] in LANGS, case["id"]
        assert case["input"], case["id"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_spoken_case(case: dict[str, str]) -> None:
    text = case["input"]
    out = SPOKEN.normalize(text)
    bare = CONTROL_TAG.sub("", out)  # tags keep their digits ([speed_5])
    assert not re.search(r"[0-9]", bare), f"digit left in {out!r}"
    assert not re.search(r"[$€£¥￥]", bare), f"currency sign left in {out!r}"
    for want in _split(case["expect"]):
        assert want in out, f"{want!r} not in {out!r}"
    for unwanted in _split(case.get("absent")):
        assert unwanted not in out, f"{unwanted!r} in {out!r}"
    assert CONTROL_TAG.findall(out) == CONTROL_TAG.findall(text)
    assert out == out.strip() and "  " not in out, repr(out)


@pytest.mark.parametrize("text", ["Hello world", "你好世界", "Hello, world.", "你好，世界。",
                                  "three dollars and fifty cents", "二零二六年十二月六日",
                                  "[uv_break]你好[laugh]"])
def test_spoken_text_is_left_alone(text: str) -> None:
    assert SPOKEN.normalize(text) == text


@pytest.mark.parametrize("text", ["转人工请按 0", "Call 555-0123 at 3:30 pm on Dec 8, 2026.",
                                  "我们明天 meeting 在 3 点，please confirm.", "Growth was 12.5% in Q3!"])
def test_normalizing_twice_changes_nothing_more(text: str) -> None:
    once = SPOKEN.normalize(text)
    assert SPOKEN.normalize(once) == once


def test_lang_override() -> None:
    assert SPOKEN.normalize("3", lang="zh") == "三"
    assert SPOKEN.normalize("3", lang="en") == "three"
    assert "百分之五十" in SPOKEN.normalize("50%", lang="zh")
    assert "fifty percent" in SPOKEN.normalize("50%", lang="en")
    # letters still decide their own span: English words stay English under a Chinese default
    assert "three apples" in SPOKEN.normalize("3 apples", lang="zh")


@pytest.mark.parametrize("text", ["  3 apples  ", "a  3   b", "你好 3 个 ", "[laugh]  3  [uv_break]  ok"])
def test_no_stray_spaces(text: str) -> None:
    out = SPOKEN.normalize(text)
    assert out == out.strip()
    assert "  " not in out


def test_call_is_normalize() -> None:
    assert SPOKEN("转人工请按 0") == SPOKEN.normalize("转人工请按 0")


def test_identity_names_wetext_and_its_version() -> None:
    identity = normalizer_identity()
    assert identity["name"] == "wetext"
    assert identity["version"] == importlib.metadata.version("wetext")
    assert isinstance(identity["rules"], int)
    assert SPOKEN.identity() == identity
