"""The built-in corpora: split disjointness, counts, manifest consistency, loader validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_forge.calibration_data.corpus import (
    CORPORA_DIR,
    check_manifest,
    latest_version,
    load_corpus,
    read_sentences,
    split_of,
)
from chattts_forge.errors import ForgeError

VERSION_DIR = CORPORA_DIR / latest_version()


def _sentences(split: str, prefix: str = "") -> list[str]:
    out: list[str] = []
    for path in sorted((VERSION_DIR / split).glob(f"{prefix}*.txt")):
        out.extend(read_sentences(path))
    return out


def test_splits_share_no_sentence():
    calib = _sentences("calibration")
    evaluation = _sentences("evaluation")
    assert calib and evaluation
    assert set(calib).isdisjoint(evaluation)
    # The split is a function of the text, so every line sits in the split the rule assigns.
    assert all(split_of(s) == "calibration" for s in calib)
    assert all(split_of(s) == "evaluation" for s in evaluation)


def test_counts_meet_the_brief():
    assert len(set(_sentences("calibration", "zh_"))) >= 500
    assert len(set(_sentences("calibration", "en_"))) >= 300
    assert len(_sentences("calibration", "mixed_")) >= 30
    assert len(_sentences("evaluation")) >= 150
    names = {p.stem for p in (VERSION_DIR / "calibration").glob("*.txt")}
    for needed in ("zh_numbers_dates", "zh_phone_address", "zh_short_replies", "zh_long_paragraphs",
                   "en_numbers_addresses", "en_short_replies", "en_long_paragraphs", "mixed_zh_en"):
        assert needed in names


def test_lines_are_short_enough_for_tts():
    for path in (VERSION_DIR / "calibration").glob("*.txt"):
        if "long_paragraphs" in path.stem:
            continue
        for s in read_sentences(path):
            if path.stem.startswith("en_"):
                assert len(s.split()) <= 25, (path.name, s)
            else:
                assert len(s) <= 60, (path.name, s)


def test_manifest_matches_files():
    assert check_manifest(VERSION_DIR) == []


def test_builtin_specs_and_files_load():
    calib = load_corpus("builtin:calibration")
    one = load_corpus(f"{VERSION_DIR.name}:evaluation/zh_everyday")
    assert len(calib.sentences) == len(set(calib.sentences)) >= 800
    assert one.language == "zh" and one.files == [VERSION_DIR / "evaluation" / "zh_everyday.txt"]
    assert len(load_corpus("builtin:evaluation", max_sentences=7).sentences) == 7
    assert calib.sha256 == load_corpus("builtin:calibration").sha256


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "is empty"), (b"\n  \n\n", "is empty"), (b"ok line\n\xff\xfe bad\n", "not UTF-8")],
)
def test_bad_corpus_files_give_clear_errors(tmp_path: Path, content: bytes, message: str):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    with pytest.raises(ForgeError, match=message):
        load_corpus(bad)


def test_missing_and_unknown_corpora(tmp_path: Path):
    with pytest.raises(ForgeError, match="does not exist"):
        load_corpus(tmp_path / "nope.txt")
    with pytest.raises(ForgeError, match="no .txt files"):
        load_corpus(tmp_path)
    with pytest.raises(ForgeError, match="unknown corpus split"):
        load_corpus("builtin:training")
    with pytest.raises(ForgeError, match="no built-in corpus"):
        load_corpus("builtin:evaluation/klingon")


def test_user_corpus_folder(tmp_path: Path):
    (tmp_path / "a.txt").write_text("第一句。\n\nsecond line\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("\ufeffsecond line\nthird\n", encoding="utf-8")
    corpus = load_corpus(tmp_path)
    assert corpus.sentences == ["第一句。", "second line", "third"]
