"""ChatTTS's text front end, ported: normalisation, sentence splitting, prompt decoration, tokenisation.

Every function here is our own numpy/`tokenizers` port of a piece of ChatTTS 0.2.5 and behaves
like it (the tests compare them against ChatTTS itself):

- `Normalizer` <- `ChatTTS.norm.Normalizer` (language detection, half->full width map for zh,
  character simplification and invalid-character filtering, homophone replacement). ChatTTS
  registers no language normalizers by default, so neither do we.
- `split_sentences` <- the `split_text` branch of `ChatTTS.Chat.infer`.
- `TextTokenizer.encode` <- `ChatTTS.model.tokenizer.Tokenizer.encode` (left padding, attention
  mask, text mask, ids expanded to num_vq, optional audio prompt at the end).
- `decorate_code_prompts` / `decorate_text_prompts` <- `Speaker.decorate_*`.

The speaker strings (`spk_emb`, `spk_smp`) are `runtime.chattts_speaker`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger

log = get_logger(__name__)

# ChatTTS's Normalizer tables, copied verbatim (ChatTTS/norm.py).
_REJECT_PATTERN = re.compile(r"[^\u4e00-\u9fffA-Za-z，。、,\. ]")
_TAG_PATTERN = re.compile(r"\[[\w_]+\]")
_CHINESE_CHAR_PATTERN = re.compile(r"[\u4e00-\u9fff]")
_ENGLISH_WORD_PATTERN = re.compile(r"\b[A-Za-z]+\b")
_CHARACTER_SIMPLIFIER = str.maketrans(
    {
        "：": "，", "；": "，", "！": "。", "（": "，", "）": "，", "【": "，", "】": "，",
        "『": "，", "』": "，", "「": "，", "」": "，", "《": "，", "》": "，", "－": "，",
        ":": ",", ";": ",", "!": ".", "(": ",", ")": ",", ">": ",", "<": ",", "-": ",",
    }
)  # fmt: skip
_HALFWIDTH_TO_FULLWIDTH = str.maketrans(
    {
        "!": "！", '"': "“", "'": "‘", "#": "＃", "$": "＄", "%": "％", "&": "＆", "(": "（",
        ")": "）", ",": "，", "-": "－", "*": "＊", "+": "＋", ".": "。", "/": "／", ":": "：",
        ";": "；", "<": "＜", "=": "＝", ">": "＞", "?": "？", "@": "＠", "\\": "＼", "^": "＾",
        "`": "｀", "{": "｛", "|": "｜", "}": "｝", "~": "～",
    }
)  # fmt: skip
# Something that can be spoken: a letter, digit or CJK character, or a control tag like [uv_break].
_SPEAKABLE = re.compile(r"\w|\[[\w_]+\]")


def split_tags(text: str) -> tuple[list[str], list[str]]:
    """ChatTTS's `_split_tags`: plain runs and `[...]` tags (an unclosed tag is dropped, as there)."""
    texts: list[str] = []
    tags: list[str] = []
    current_text = ""
    current_tag = ""
    for c in text:
        if c == "[":
            texts.append(current_text)
            current_text = ""
            current_tag = c
        elif current_tag != "":
            current_tag += c
        else:
            current_text += c
        if c == "]":
            tags.append(current_tag)
            current_tag = ""
    if current_text != "":
        texts.append(current_text)
    return texts, tags


def combine_tags(texts: list[str], tags: list[str]) -> str:
    """ChatTTS's `_combine_tags` (tags beyond the number of runs are dropped, as there)."""
    tags = list(tags)
    return "".join(t + (tags.pop(0) if tags else "") for t in texts)


def _map_tagless(text: str, fn) -> str:
    texts, tags = split_tags(text)
    texts = [fn(t) for t in texts]
    return combine_tags(texts, tags) if tags else texts[0]


class Normalizer:
    """ChatTTS's text normalizer, with the homophone map of the artifact (`homophones_map.json`)."""

    def __init__(self, homophones: dict[str, str] | str | Path) -> None:
        if not isinstance(homophones, dict):
            try:
                homophones = json.loads(Path(homophones).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
                raise BadInput(f"cannot read homophone map {homophones}: {str(e)[:200]}") from None
        if not isinstance(homophones, dict) or not all(isinstance(v, str) for v in homophones.values()):
            raise BadInput("homophone map must be a JSON object of single characters")
        bad = [k for k, v in homophones.items() if len(k) != 1 or len(v) != 1]
        if bad:
            raise BadInput(f"homophone map entries must be single characters (e.g. {bad[0]!r})")
        # ChatTTS replaces UTF-16 code units; keys and values are BMP characters, so a per-character
        # translation is the same (a surrogate pair never matches a BMP key).
        self.homophones = {ord(k): ord(v) for k, v in homophones.items() if ord(k) < 0x10000}

    @staticmethod
    def detect_language(sentence: str) -> str:
        chinese_chars = _CHINESE_CHAR_PATTERN.findall(sentence)
        english_words = _ENGLISH_WORD_PATTERN.findall(sentence)
        return "zh" if len(chinese_chars) > len(english_words) else "en"

    @staticmethod
    def invalid_characters(text: str) -> set[str]:
        """Characters ChatTTS cannot speak (outside CJK, Latin letters and `，。、,. `), tags ignored."""
        return set(_REJECT_PATTERN.findall(_TAG_PATTERN.sub("", text)))

    def __call__(
        self,
        text: str,
        do_text_normalization: bool = True,
        do_homophone_replacement: bool = True,
        lang: str | None = None,
    ) -> str:
        return self.filtered(text, do_text_normalization, do_homophone_replacement, lang)[0]

    def filtered(
        self,
        text: str,
        do_text_normalization: bool = True,
        do_homophone_replacement: bool = True,
        lang: str | None = None,
    ) -> tuple[str, str]:
        """(ChatTTS's normalisation of `text`, the characters it deleted: sorted, each once)."""
        removed = ""
        if do_text_normalization:
            detected = self.detect_language(text) if lang is None else lang
            if detected == "zh":
                text = text.translate(_HALFWIDTH_TO_FULLWIDTH)
        invalid = self.invalid_characters(text)
        if invalid:
            log.warning("found invalid characters (filtered out): %s", "".join(sorted(invalid)))
            text = text.translate(_CHARACTER_SIMPLIFIER)
            removed = "".join(sorted(c for c in invalid if ord(c) not in _CHARACTER_SIMPLIFIER))
        if do_homophone_replacement:
            replaced = text.translate(self.homophones)
            if replaced != text:
                pairs = [f"{a}->{b}" for a, b in zip(text, replaced, strict=True) if a != b]
                log.info("replace homophones: %s", ", ".join(pairs))
                text = replaced
        if invalid:
            text = _map_tagless(text, lambda t: _REJECT_PATTERN.sub("", t))
        return text, removed


def split_sentences(text: str) -> list[str]:
    """Split like `Chat.infer(split_text=True)`: on newlines if any, else after `。` and `. `.

    Unlike ChatTTS, parts that are empty or only whitespace are dropped (ChatTTS keeps the empty
    lines of a newline split and feeds them to the model as empty prompts).
    """
    parts = text.split("\n") if "\n" in text else re.split(r"(?<=。)|(?<=\.\s)", text)
    return [p for p in parts if p.strip()]


def is_speakable(normalized: str) -> bool:
    """False for text that normalised to nothing a voice could say (only spaces/punctuation)."""
    return _SPEAKABLE.search(normalized) is not None


# The tokens that frame ChatTTS's prompts (decorate_code_prompts / decorate_text_prompts and the ASR
# ones): inside a text they end or restart the prompt and cut the audio. The prosody tokens
# ([uv_break], [lbreak], [laugh], [break_N], [oral_N], [speed_N], ...) are not among them.
STRUCTURAL_TOKENS = ("[Sasr]", "[Pasr]", "[Easr]", "[Stts]", "[Ptts]", "[Etts]", "[Sbreak]", "[Pbreak]", "[Ebreak]",
                     "[spk_emb]", "[empty_spk]")


def structural_token_in(text: str) -> str | None:
    """The first ChatTTS structural token `text` holds (None: none)."""
    found = [(i, t) for t in STRUCTURAL_TOKENS if (i := text.find(t)) >= 0]
    return min(found)[1] if found else None


def decorate_code_prompts(
    texts: Sequence[str], prompt: str, txt_smp: str | None, spk_emb: str | None
) -> list[str]:
    """`Speaker.decorate_code_prompts`: `[Stts][spk_emb|empty_spk]{txt_smp}{prompt}{text}[Ptts]`."""
    cleaned = [
        t.replace("[Stts]", "").replace("[spk_emb]", "").replace("[empty_spk]", "").strip() for t in texts
    ]
    if prompt:
        cleaned = [prompt + t for t in cleaned]
    txt_smp = "" if txt_smp is None else txt_smp
    spk_tag = "[spk_emb]" if spk_emb is not None else "[empty_spk]"
    return [f"[Stts]{spk_tag}{txt_smp}{t}[Ptts]" for t in cleaned]


def decorate_text_prompts(texts: Sequence[str], prompt: str) -> list[str]:
    """`Speaker.decorate_text_prompts`: `[Sbreak]{text}[Pbreak]{prompt}`."""
    return [f"[Sbreak]{t}[Pbreak]{prompt}" for t in texts]


class TextTokenizer:
    """The artifact's `tokenizer.json` through `tokenizers`, encoding like ChatTTS's `Tokenizer`."""

    def __init__(self, tokenizer_json: str | Path) -> None:
        # tokenizers: only when a tokenizer is read; 6 ms to import
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(tokenizer_json))
        except Exception as e:  # tokenizers raises a bare Exception on a broken file
            raise ForgeError(f"cannot load tokenizer {tokenizer_json}: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
        # The file carries BERT's fixed 256 padding/truncation; ChatTTS (transformers) uses neither.
        self._tok.no_padding()
        self._tok.no_truncation()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.spk_emb_id = self.token_id("[spk_emb]")
        self.break_0_id = self.token_id("[break_0]")
        self.eos_id = self.token_id("[Ebreak]")  # end of a refined text

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ForgeError(f"the artifact's tokenizer has no token {token}")
        return int(i)

    def ids(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode(
        self, texts: Sequence[str], num_vq: int, prompt: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input_ids int64 [B, L, num_vq], attention_mask int64 [B, L], text_mask bool [B, L]).

        Left-padded like ChatTTS; `prompt` (int [num_vq, P], an audio-sample prompt) goes at the end
        of every row with text_mask False.
        """
        rows = [self.ids(t) for t in texts]
        prompt_size = 0 if prompt is None else int(prompt.shape[1])
        if prompt is not None and prompt.shape[0] != num_vq:
            raise ForgeError(f"speaker sample prompt has {prompt.shape[0]} code streams, expected {num_vq}")
        width = max(len(r) for r in rows) + prompt_size
        input_ids = np.zeros((len(rows), width), dtype=np.int64)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            start = width - prompt_size - len(r)
            input_ids[i, start : start + len(r)] = r
            attention_mask[i, start : start + len(r)] = 1
        if prompt_size:
            attention_mask[:, width - prompt_size :] = 1
        text_mask = attention_mask.astype(bool)
        ids = np.repeat(input_ids[:, :, None], num_vq, axis=2)
        if prompt_size:
            text_mask[:, width - prompt_size :] = False
            ids[:, width - prompt_size :, :] = np.asarray(prompt, dtype=np.int64).T[None]
        return ids, attention_mask, text_mask

    def decode(self, ids: Sequence[int]) -> str:
        """Like ChatTTS's `tokenizer.decode` (BertTokenizerFast, specials kept, spaces cleaned up)."""
        text = self._tok.decode(list(map(int, ids)), skip_special_tokens=False)
        return _clean_up_tokenization(text)


def _clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization` (clean_up_tokenization_spaces=True in the config)."""
    return (
        text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
    )
