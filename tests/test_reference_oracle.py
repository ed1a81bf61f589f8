"""The instrumented ChatTTS oracle: what it records is what ChatTTS's own loop decided."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.torch_ref import oracle

TEXTS = ["你好，世界。", "Hello world, this is a test.", "我们用 ChatTTS 合成 speech。"]
N = 32


@pytest.fixture(scope="module")
def greedy_run(tiny_chat) -> dict:
    return oracle.chattts_codes(tiny_chat, TEXTS, max_new_token=N, min_new_token=N)


def test_shapes_are_consistent(tiny_chat, greedy_run: dict) -> None:
    hidden = tiny_chat.config.gpt.hidden_size
    assert greedy_run["texts"] == TEXTS  # ChatTTS's normaliser leaves these as they are
    for key in ("codes", "hiddens", "processed_logits", "raw_logits", "top2_gap", "top2_gap_penalized"):
        assert len(greedy_run[key]) == len(TEXTS), key
    for b in range(len(TEXTS)):
        assert greedy_run["codes"][b].shape == (N, 4) and greedy_run["codes"][b].dtype == np.int64
        assert greedy_run["hiddens"][b].shape == (N, hidden)
        assert greedy_run["processed_logits"][b].shape == (N, 4, 626)
        assert greedy_run["raw_logits"][b].shape == (N, 4, 626)
        assert greedy_run["top2_gap"][b].shape == (N, 4)
        assert np.all(np.isfinite(greedy_run["raw_logits"][b]))
        assert np.all(greedy_run["top2_gap"][b] >= 0)
    ids, mask = greedy_run["input_ids"], greedy_run["attention_mask"]
    assert ids.shape == mask.shape and ids.shape[0] == len(TEXTS)
    assert np.all(mask[:, -1] == 1)  # left padded


def test_processed_argmax_is_the_code_at_tiny_temperature(greedy_run: dict) -> None:
    for b, codes in enumerate(greedy_run["codes"]):
        proc = greedy_run["processed_logits"][b]
        np.testing.assert_array_equal(proc.argmax(-1), codes)
        # min_new_token == max_new_token: EOS is masked at every step.
        assert np.all(proc[:, :, 625] == -np.inf)
        # top-k 20 after top-p: between ChatTTS's minimum of 3 and 20 candidates survive; the EOS
        # mask comes after the warpers, so where EOS was one of the 3, only 2 remain.
        kept = np.isfinite(proc).sum(-1)
        assert kept.min() >= 2 and kept.max() <= 20


def test_recorded_logits_follow_temperature_and_chain(tiny_chat) -> None:
    # Without penalty and warpers ChatTTS's chain is only `logits / temperature`.
    plain = oracle.chattts_codes(
        tiny_chat, TEXTS[:1], max_new_token=8, min_new_token=0, temperature=0.5,
        top_p=None, top_k=None, repetition_penalty=None,
    )
    raw, proc = plain["raw_logits"][0], plain["processed_logits"][0]
    np.testing.assert_array_equal(proc, raw / np.float32(0.5))
    # top_K=1 is not greedy: ChatTTS's warpers keep at least 3 tokens.
    k1 = oracle.chattts_codes(tiny_chat, TEXTS[:1], max_new_token=4, min_new_token=0, top_k=1)
    assert np.all(np.isfinite(k1["processed_logits"][0]).sum(-1) == 3)


def test_repetition_penalty_matches_the_float64_factor(tiny_chat) -> None:
    run = oracle.chattts_codes(
        tiny_chat, TEXTS[:1], max_new_token=24, min_new_token=24, temperature=1.0, top_p=None, top_k=None
    )
    codes, raw, proc = run["codes"][0], run["raw_logits"][0], run["processed_logits"][0]
    checked = 0
    for step in range(1, len(codes)):
        window = codes[max(0, step - 16) : step]
        for q in range(4):
            counts = np.bincount(window[:, q], minlength=626)
            for tok in np.flatnonzero(counts):
                alpha = np.float32(1.05 ** float(counts[tok]))  # float64 power, then float32
                x = raw[step, q, tok]
                want = x * alpha if x < 0 else x / alpha
                assert proc[step, q, tok] == pytest.approx(want, rel=1e-6)
                checked += 1
    assert checked > 0


def test_teacher_forcing_on_own_codes_reproduces_the_run(tiny_chat, greedy_run: dict) -> None:
    tf = oracle.chattts_teacher_forced_logits(tiny_chat, TEXTS, greedy_run["codes"], min_new_token=N)
    for b in range(len(TEXTS)):
        np.testing.assert_array_equal(tf["codes"][b], greedy_run["codes"][b])
        np.testing.assert_array_equal(tf["raw_logits"][b], greedy_run["raw_logits"][b])
        np.testing.assert_array_equal(tf["processed_logits"][b], greedy_run["processed_logits"][b])
        np.testing.assert_array_equal(tf["hiddens"][b], greedy_run["hiddens"][b])


def test_teacher_forcing_follows_other_codes(tiny_chat, greedy_run: dict) -> None:
    rng = np.random.default_rng(0)
    other = [rng.integers(0, 625, size=(12, 4)), rng.integers(0, 625, size=(7, 4))]
    tf = oracle.chattts_teacher_forced_logits(tiny_chat, TEXTS[:2], other, temperature=1.0)
    for b in range(2):
        np.testing.assert_array_equal(tf["codes"][b], other[b])
        assert tf["raw_logits"][b].shape == (len(other[b]), 4, 626)
        # The first step sees only the prompt: the free run's logits (up to the numerics of a
        # different left padding, this batch has 2 rows, that one 3); later steps differ.
        np.testing.assert_allclose(tf["raw_logits"][b][0], greedy_run["raw_logits"][b][0], atol=1e-4)
        assert not np.allclose(tf["raw_logits"][b][3], greedy_run["raw_logits"][b][3])
    with pytest.raises(ForgeError):
        oracle.chattts_teacher_forced_logits(tiny_chat, TEXTS[:2], other[:1])


def test_decode_to_wavs_is_chattts_batch_decode(tiny_chat, greedy_run: dict) -> None:
    hop = 256
    wavs = oracle.chattts_decode_to_wavs(tiny_chat, greedy_run["hiddens"], use_decoder=True)
    assert wavs.dtype == np.float32 and wavs.shape == (len(TEXTS), hop * (2 * N - 1))
    assert np.all(np.isfinite(wavs)) and np.abs(wavs).max() > 1e-3
    one = oracle.chattts_decode_to_wavs(tiny_chat, greedy_run["hiddens"][:1], use_decoder=True)
    np.testing.assert_allclose(one[0], wavs[0], atol=1e-5)
    dvae = oracle.chattts_decode_to_wavs(tiny_chat, greedy_run["codes"], use_decoder=False)
    assert dvae.shape == wavs.shape and np.all(np.isfinite(dvae))


def test_speaker_changes_the_codes(tiny_chat, greedy_run: dict) -> None:
    from chattts_forge.torch_ref.reference import sample_speaker

    spk = sample_speaker(tiny_chat, seed=0)
    run = oracle.chattts_codes(tiny_chat, TEXTS[:1], spk_emb=spk, max_new_token=8, min_new_token=8)
    assert run["input_ids"].shape[1] == greedy_run["input_ids"][:1, -run["input_ids"].shape[1]:].shape[1]
    assert not np.array_equal(run["raw_logits"][0][0], greedy_run["raw_logits"][0][0])


def _fake_run(codes: np.ndarray, gaps: np.ndarray) -> dict:
    return {"codes": [codes], "texts": ["t"], "top2_gap_penalized": [gaps]}


def test_compare_codes_admits_only_near_ties() -> None:
    from chattts_forge.torch_ref.compare import compare_codes

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 625, size=(10, 4))
    gaps = np.full((10, 4), 1e-3, dtype=np.float32)
    [same] = compare_codes(_fake_run(codes, gaps), [codes.copy()])
    assert same.equal and same.ok and same.first_divergence is None and same.min_gap == pytest.approx(1e-3)

    other = codes.copy()
    other[6, 2] = (other[6, 2] + 1) % 625
    other[7:] = 0  # after a divergence the histories differ: not held against the engine
    [far] = compare_codes(_fake_run(codes, gaps), [other])
    assert not far.ok and far.first_divergence == 6 and "NOT a near-tie" in far.describe()

    gaps[6, 2] = 3e-6
    [tie] = compare_codes(_fake_run(codes, gaps), [other])
    assert tie.ok and tie.near_tie and not tie.equal and "admissible near-tie" in tie.describe()

    # Stopping early (EOS) is judged by the gap of that decision.
    [short] = compare_codes(_fake_run(codes, np.full((10, 4), 1e-3, np.float32)), [codes[:4]])
    assert not short.ok and short.first_divergence == 4
