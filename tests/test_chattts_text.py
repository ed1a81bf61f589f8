"""The runtime's text front end against ChatTTS's own Normalizer, Tokenizer and Speaker."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from chattts_forge.errors import ForgeError

# the fixture `chattts_speaker` is ChatTTS's own Speaker; ours is `ported_speaker`
from chattts_forge.runtime import chattts_speaker as ported_speaker
from chattts_forge.runtime import chattts_text

CHATTTS_DIR = Path(pytest.importorskip("ChatTTS").__file__).parent
HOMOPHONES = CHATTTS_DIR / "res" / "homophones_map.json"

TEXTS = [
    "你好，欢迎使用。",
    "Hello world, this is a test.",
    "我今天用了ChatTTS, it works great!",
    "四川美食确实以辣闻名，但也有不辣的选择。",
    "数字123和符号@#$%也要处理：（括号）【方括号】《书名》",
    "What's up?! (parentheses) <angle> a-b; c:d",
    "[uv_break]你好[laugh]世界[lbreak]",
    "Unclosed [tag here and 「引号」",
    "emoji 😀 and é accents, ñ, ü.",
    "  spaces   around  ",
    "只有中文没有标点",
    "mixed 中文 and English 各一半 words here",
    "\t tabs\tand\nnewlines\n",
    "行长在银行行走，重要的事情说三遍。",
    "[Stts][spk_emb]already decorated[Ptts]",
    "。。。",
]


@pytest.fixture(scope="module")
def chattts_normalizer():
    from ChatTTS.norm import Normalizer

    return Normalizer(str(HOMOPHONES), logging.getLogger("test.chattts.norm"))


@pytest.fixture(scope="module")
def ours() -> chattts_text.Normalizer:
    return chattts_text.Normalizer(HOMOPHONES)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("lang", [None, "zh", "en"])
def test_normalizer_matches_chattts(chattts_normalizer, ours, text, lang):
    for norm, homophones in ((True, True), (False, True), (True, False)):
        want = chattts_normalizer(text, norm, homophones, lang)
        assert ours(text, norm, homophones, lang) == want


def test_homophones_are_replaced(ours):
    import json

    table = json.loads(HOMOPHONES.read_text(encoding="utf-8"))
    key, value = next(iter(table.items()))
    assert ours(f"你{key}好") == f"你{value}好"


def test_detect_language_matches_chattts(chattts_normalizer):
    for t in TEXTS:
        assert chattts_text.Normalizer.detect_language(t) == chattts_normalizer._detect_language(t)


def test_split_tags_roundtrip_matches_chattts():
    from ChatTTS import norm as chattts_norm

    for t in TEXTS + ["a[x][y]", "[only]", "]x[", "a]b[c]d"]:
        texts, tags = chattts_text.split_tags(t)
        want_texts, want_tags = chattts_norm._split_tags(t)
        assert (texts, tags) == (list(want_texts), list(want_tags))
        if tags:  # ChatTTS only combines when there are tags
            assert chattts_text.combine_tags(texts, tags) == chattts_norm._combine_tags(list(want_texts), list(want_tags))


def _chattts_split(text: str) -> list[str]:
    """The split_text branch of ChatTTS.Chat.infer (copied; infer itself needs loaded models)."""
    if "\n" in text:
        return text.split("\n")
    return [t for t in re.split(r"(?<=。)|(?<=\.\s)", text) if t]


@pytest.mark.parametrize(
    "text",
    ["第一句。第二句。第三句", "One. Two. Three", "a.b. c", "line one\nline two", "no split here", "a\n\nb"],
)
def test_split_sentences_like_chat_infer(text):
    want = [t for t in _chattts_split(text) if t.strip()]  # we drop the blank parts ChatTTS keeps
    assert chattts_text.split_sentences(text) == want


def test_is_speakable():
    assert chattts_text.is_speakable("你好")
    assert chattts_text.is_speakable("[laugh]")
    assert not chattts_text.is_speakable("。。。 ,")
    assert not chattts_text.is_speakable("")


# ---- tokenizer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_pair(data_dir):
    from ChatTTS.model.tokenizer import Tokenizer

    tok_dir = data_dir / "chattts-tokenizer"
    return chattts_text.TextTokenizer(tok_dir / "tokenizer.json"), Tokenizer(str(tok_dir))


def test_special_token_ids(tokenizer_pair):
    ours, theirs = tokenizer_pair
    assert ours.spk_emb_id == theirs.spk_emb_ids
    assert ours.break_0_id == theirs.break_0_ids
    assert ours.eos_id == theirs.eos_token
    assert ours.vocab_size == theirs.len


def test_encode_matches_chattts(tokenizer_pair, chattts_normalizer):
    ours, theirs = tokenizer_pair
    long_text = "这是一个很长的句子，" * 40  # > 256 tokens: the file's BERT truncation must be off
    texts = [chattts_normalizer(t) for t in TEXTS if t.strip()] + [long_text]
    decorated = chattts_text.decorate_code_prompts(texts, "[speed_5]", None, "x")
    ids, mask, text_mask = ours.encode(decorated, 4)
    want_ids, want_mask, want_text_mask = theirs.encode(decorated, 4)
    assert ids.shape[1] > 256
    np.testing.assert_array_equal(ids, want_ids.numpy())
    np.testing.assert_array_equal(mask, want_mask.numpy())
    np.testing.assert_array_equal(text_mask, want_text_mask.numpy())


def test_encode_with_audio_prompt_matches_chattts(tokenizer_pair):
    import torch

    ours, theirs = tokenizer_pair
    prompt = np.random.default_rng(0).integers(0, 625, size=(4, 7))
    texts = chattts_text.decorate_code_prompts(["你好", "a longer english sentence"], "", "ref text", None)
    got = ours.encode(texts, 4, prompt)
    want = theirs.encode(texts, 4, prompt=torch.from_numpy(prompt))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w.numpy())


def test_decode_matches_chattts(tokenizer_pair):
    ours, theirs = tokenizer_pair
    rng = np.random.default_rng(1)
    seqs = [theirs._tokenizer.encode(t, add_special_tokens=False) for t in ["你好 [uv_break] 世界", "hello, world's end."]]
    seqs += [rng.integers(104, 21147, size=30).tolist() for _ in range(5)]
    want = theirs.decode(seqs)
    assert [ours.decode(s) for s in seqs] == want


# ---- prompts and speakers ----------------------------------------------------------------


@pytest.mark.parametrize("spk", [None, "SPK"])
@pytest.mark.parametrize("prompt", ["", "[speed_5]", "[oral_2][laugh_0][break_6]"])
@pytest.mark.parametrize("txt_smp", [None, "sample text"])
def test_decorate_code_prompts_matches_chattts(spk, prompt, txt_smp):
    from ChatTTS.model.speaker import Speaker

    texts = ["  你好 ", "[Stts][spk_emb]x[empty_spk]", "plain"]
    assert chattts_text.decorate_code_prompts(list(texts), prompt, txt_smp, spk) == Speaker.decorate_code_prompts(
        list(texts), prompt, txt_smp, spk
    )


def test_decorate_text_prompts_matches_chattts():
    from ChatTTS.model.speaker import Speaker

    for prompt in ("", "[oral_2][laugh_0][break_6]"):
        assert chattts_text.decorate_text_prompts(["a", "你好"], prompt) == Speaker.decorate_text_prompts(["a", "你好"], prompt)


@pytest.fixture(scope="module")
def chattts_speaker():
    from ChatTTS.config import Config
    from ChatTTS.model.speaker import Speaker

    return Speaker(768, Config().spk_stat)


def test_speaker_stats_and_random_speaker(chattts_speaker):
    import torch

    stats = torch.cat([chattts_speaker.std, chattts_speaker.mean]).view(2, -1).numpy()
    spk = ported_speaker.sample_random_speaker(stats, np.random.default_rng(0))
    vec = ported_speaker.decode_speaker(spk)
    assert vec.dtype == np.float16 and vec.shape == (768,)
    # ChatTTS decodes our string to the same vector, and ours decodes ChatTTS's strings
    np.testing.assert_array_equal(chattts_speaker._decode(spk), vec)
    torch.manual_seed(0)
    theirs = chattts_speaker.sample_random()
    np.testing.assert_array_equal(ported_speaker.decode_speaker(theirs), chattts_speaker._decode(theirs))
    assert ported_speaker.decode_speaker(ported_speaker.encode_speaker(vec)).tobytes() == vec.tobytes()


def test_apply_speaker_matches_chattts(chattts_speaker):
    import torch

    torch.manual_seed(3)
    spk = chattts_speaker.sample_random()
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((2, 9, 768)).astype(np.float32)
    ids = rng.integers(0, 100, size=(2, 9, 4))
    ids[0, 1, :] = 21143
    ids[1, 4, :] = 21143
    want = chattts_speaker.apply(torch.from_numpy(emb.copy()), spk, torch.from_numpy(ids), 21143, "cpu").numpy()
    got = ported_speaker.apply_speaker(emb.copy(), ids, 21143, ported_speaker.speaker_vector(spk, 768))
    np.testing.assert_array_equal(got, want)


def test_decode_prompt_matches_chattts():
    import torch
    from ChatTTS.model.speaker import Speaker

    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 625, size=(4, 11)))
    s = Speaker.encode_prompt(codes)
    np.testing.assert_array_equal(ported_speaker.decode_prompt(s), Speaker.decode_prompt(s).numpy())


@pytest.mark.parametrize("bad", ["", "not a speaker", "蛋"])
def test_bad_speaker_string_is_a_forge_error(bad):
    with pytest.raises(ForgeError):
        ported_speaker.speaker_vector(bad, 768)
