"""The synthesized tokenizer gives the released ChatTTS tokenizer's ids (tests/data/chattts-tokenizer)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from chattts_forge.checkpoint import tokenizer as tok_mod
from chattts_forge.checkpoint.tokenizer import (
    CHATTTS_SPECIAL_TOKENS,
    NUM_TEXT_TOKENS,
    build_tokenizer,
    find_vocab_file,
    special_token_id,
)
from chattts_forge.errors import ForgeError

TEXTS = [
    "你好，世界。今天天气怎么样？",  # zh
    "Hello World! This is ChatTTS, a text-to-speech model for dialogue.",  # en
    "我最喜欢的 app 是 ChatGPT，版本 4.0 真的很 powerful。",  # mixed
    "[Stts][spk_emb]你好，世界[uv_break]Hello World![Ptts]",  # special tokens
    "[Stts][empty_spk][speed_5]今天[laugh_0]真开心[break_4]对吧[oral_2][Ptts]",
    "[Sbreak][lbreak][llbreak][v_break][Ebreak][Sasr][Pasr][Easr][Etts][undefine][music][pure][laugh]",
    "电话 13800138000，价格 ¥1,299.50 元，100% 完成；2024-05-01 12:30",  # numbers
    "“引号” 『书名』 ——破折号…… (括号) [方括号] {花括号} <尖括号>!?;:",  # punctuation
    "ＡＢＣ１２３ ＦＵＬＬ－ＷＩＤＴＨ，全角！？",  # full-width
    "Café naïve résumé ÀÉÎÕÜ ß straße",  # accents (kept: strip_accents None, lowercased)
    "supercalifragilisticexpialidocious antidisestablishmentarianism",  # long WordPiece splits
    "emoji 😂🔥 and rare 㐀𠀀 chars",  # unknown chars -> [UNK]
    "[speed_0][speed_9][oral_0][oral_9][break_0][break_7][laugh_1][laugh_2]",
    "  leading and   multiple   spaces\tand\ttabs\nnewlines  ",
    "",
]


@pytest.fixture(scope="module")
def released(data_dir: Path) -> Path:
    d = data_dir / "chattts-tokenizer"
    assert (d / "tokenizer.json").is_file()
    return d


def test_vocab_comes_from_cn_clip_wheel() -> None:
    path = find_vocab_file()
    assert path.name == "vocab.txt" and path.parent.name == "clip" and path.parent.parent.name == "cn_clip"
    assert len(tok_mod.read_vocab(path)) == 21128


def test_special_token_ids() -> None:
    assert len(CHATTTS_SPECIAL_TOKENS) == 50 and NUM_TEXT_TOKENS == 21178
    assert special_token_id("[Sasr]") == 21128
    assert special_token_id("[spk_emb]") == 21143
    assert special_token_id("[speed_9]") == 21177


def test_special_tokens_in_released_order(released: Path) -> None:
    cfg = json.loads((released / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert tuple(cfg["additional_special_tokens"]) == CHATTTS_SPECIAL_TOKENS
    for i, t in enumerate(CHATTTS_SPECIAL_TOKENS):
        assert cfg["added_tokens_decoder"][str(21128 + i)]["content"] == t


@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_with_tokenizers_library(text: str, released: Path, tiny_ckpt: Path) -> None:
    ours = Tokenizer.from_file(str(tiny_ckpt / "tokenizer" / "tokenizer.json"))
    ref = Tokenizer.from_file(str(released / "tokenizer.json"))
    a, b = ours.encode(text), ref.encode(text)
    assert a.ids == b.ids
    assert a.attention_mask == b.attention_mask
    # the in-memory builder is the same tokenizer
    assert build_tokenizer().encode(text).ids == b.ids


def test_same_ids_with_bert_tokenizer_fast(released: Path, tiny_ckpt: Path) -> None:
    """What ChatTTS's Tokenizer calls: BertTokenizerFast.from_pretrained(folder)."""
    transformers = pytest.importorskip("transformers")
    ours = transformers.BertTokenizerFast.from_pretrained(str(tiny_ckpt / "tokenizer"))
    ref = transformers.BertTokenizerFast.from_pretrained(str(released))
    assert len(ours) == len(ref) == NUM_TEXT_TOKENS
    assert ours.convert_tokens_to_ids(list(CHATTTS_SPECIAL_TOKENS)) == list(range(21128, 21178))
    for text in TEXTS:
        # ChatTTS encodes with add_special_tokens=False, padding/truncation as configured
        for kwargs in ({"add_special_tokens": False}, {}):
            assert ours(text, **kwargs)["input_ids"] == ref(text, **kwargs)["input_ids"], (text, kwargs)
        assert ours.tokenize(text) == ref.tokenize(text)
        ids = ref(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids)


def test_files_are_byte_identical_to_release(released: Path, tiny_ckpt: Path) -> None:
    """Stronger than id parity: the files (and so their sha256) equal the released ones."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tiny_ckpt / "tokenizer" / name).read_bytes() == (released / name).read_bytes(), name


def test_missing_vocab_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "files", not_installed)  # what fsutil.installed_file reads
    with pytest.raises(ForgeError, match=r"pip install --no-deps cn-clip==1\.6\.0"):
        find_vocab_file()


def test_wrong_vocab_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "vocab.txt"
    bad.write_text("[PAD]\nhello\n", encoding="utf-8")
    with pytest.raises(ForgeError, match="not the bert-base-chinese vocabulary"):
        tok_mod.read_vocab(bad)
