"""The runtime's numpy logits processing against ChatTTS's torch processors and transformers' warpers."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_forge.runtime import sampling as sp

torch = pytest.importorskip("torch")


def chattts_chain(
    logits: np.ndarray,
    history: np.ndarray,
    temperature: np.ndarray,
    *,
    top_p: float | None,
    top_k: int | None,
    penalty: float | None,
    max_input_ids: int,
    eos: int,
    mask_eos: bool,
) -> np.ndarray:
    """ChatTTS's GPT.generate step on code logits [rows, V], with its own processors."""
    from ChatTTS.model.processors import gen_logits

    warpers, processors = gen_logits(num_code=max_input_ids, top_P=top_p, top_K=top_k, repetition_penalty=penalty)
    x = torch.from_numpy(logits.copy())
    x /= torch.from_numpy(temperature).view(-1, 1)
    tokens = torch.from_numpy(history)
    for proc in (*processors, *warpers):
        x = proc(tokens, x)
    if mask_eos:
        x[:, eos] = -torch.inf
    return x.numpy()


def ours_chain(logits, history, temperature, *, top_p, top_k, penalty, max_input_ids, eos, mask_eos):
    streams = len(temperature)
    cfg = sp.SamplingConfig(
        temperature=tuple(float(t) for t in temperature[:streams]),
        top_p=top_p,
        top_k=top_k,
        repetition_penalty=penalty,
        min_new_token=1 if mask_eos else 0,
        eos_token=eos,
        max_input_ids=max_input_ids,
    )
    return sp.process_logits(logits, history, 0, cfg, streams)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=1e-6)


CASES = [
    # (rows, vocab, steps, top_p, top_k, penalty, temperature, scale)
    (8, 626, 0, 0.7, 20, 1.05, 0.3, 3.0),
    (8, 626, 5, 0.7, 20, 1.05, 0.3, 3.0),
    (12, 626, 40, 0.7, 20, 1.05, 0.3, 3.0),
    (4, 626, 40, 0.9, 1, 1.3, 1.0, 1.0),  # top_k=1 keeps 3 tokens (min_tokens_to_keep)
    (4, 626, 40, 0.0, 50, 1.05, 0.7, 5.0),  # top_p=0 keeps 3 tokens
    (4, 626, 17, None, None, 1.05, 0.3, 3.0),
    (4, 626, 17, 1.0, 626, None, 0.3, 3.0),
    (4, 626, 16, 0.5, 5, 0.8, 1e-4, 3.0),  # penalty < 1
    (4, 626, 64, 0.7, 20, 1.05, 1e-9, 3.0),
    (2, 21178, 30, 0.7, 20, None, 0.7, 4.0),  # text head width
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask_eos", [False, True])
def test_process_logits_matches_chattts(case, mask_eos):
    rows, vocab, steps, top_p, top_k, penalty, temp, scale = case
    rng = np.random.default_rng(rows * 1000 + steps)
    logits = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    # histories with repeats so the penalty sees counts > 1; few distinct tokens per row
    history = rng.integers(0, 12, size=(rows, steps)) + rng.integers(0, vocab - 12, size=(rows, 1))
    # make some penalised tokens the best ones, so the penalty changes the kept set
    for r in range(rows):
        if steps:
            logits[r, history[r, -1]] = logits[r].max() + 0.01
            logits[r, history[r, 0]] = -abs(logits[r, history[r, 0]])
    temperature = np.full(rows, temp, dtype=np.float32)
    kw = dict(top_p=top_p, top_k=top_k, penalty=penalty, max_input_ids=vocab - 1, eos=vocab - 1, mask_eos=mask_eos)
    want = chattts_chain(logits, history, temperature, **kw)
    got = ours_chain(logits, history, temperature[:1].repeat(1), **kw)
    assert_same(got, want)
    assert np.isfinite(got).sum(axis=1).min() >= (3 if top_k or top_p is not None else 1) - int(mask_eos)


def test_per_stream_temperature_matches_chattts():
    rng = np.random.default_rng(5)
    num_vq, batch = 4, 3
    temps = np.array([0.3, 0.5, 1.0, 2.0], dtype=np.float32)
    logits = rng.standard_normal((batch * num_vq, 626)).astype(np.float32)
    history = rng.integers(0, 626, size=(batch * num_vq, 20))
    kw = dict(top_p=0.7, top_k=20, penalty=1.05, max_input_ids=625, eos=625, mask_eos=False)
    want = chattts_chain(logits, history, np.tile(temps, batch), **kw)
    got = ours_chain(logits, history, temps, **kw)
    assert_same(got, want)


def test_penalty_rows_beyond_max_input_ids_are_not_penalised_like_chattts():
    """ChatTTS narrows the count matrix on dim 0 (rows): rows >= max_input_ids keep their scores."""
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((10, 50)).astype(np.float32)
    history = rng.integers(0, 5, size=(10, 8))
    kw = dict(top_p=None, top_k=None, penalty=1.5, max_input_ids=6, eos=49, mask_eos=False)
    want = chattts_chain(logits, history, np.ones(10, np.float32), **kw)
    got = ours_chain(logits, history, np.ones(1, np.float32), **kw)
    assert_same(got, want)
    np.testing.assert_array_equal(got[6:], logits[6:])
    assert not np.array_equal(got[:6], logits[:6])


@pytest.mark.parametrize("penalty", [1.05, 1.1, 1.2, 1.3, 0.9])
def test_penalty_factor_is_float32_power(penalty):
    counts = torch.arange(0, 17)
    want = torch.pow(penalty, counts).numpy()
    got = sp.penalty_factors(penalty, counts.numpy())
    assert got.dtype == np.float32
    # bit-identical for ChatTTS's default 1.05; torch's vectorised powf is within 1 ulp otherwise
    if penalty == 1.05:
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_max_ulp(got, want, maxulp=1)


def test_softmax_matches_torch():
    x = np.random.default_rng(0).standard_normal((6, 626)).astype(np.float32) * 10
    x[:, :300] = -np.inf
    np.testing.assert_allclose(sp.softmax(x), torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-5, atol=1e-7)


def test_sampling_is_a_categorical_draw():
    probs = np.array([[0.1, 0.6, 0.3, 0.0]], dtype=np.float32)
    rngs = [np.random.default_rng(0)]
    draws = np.array([sp.sample_rows(probs, rngs, 1)[0] for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, probs[0], atol=0.015)
    assert freq[3] == 0


def test_seeded_sampler_is_reproducible_and_rows_independent():
    rng = np.random.default_rng(0)
    probs = sp.softmax(rng.standard_normal((3 * 4, 626)).astype(np.float32))
    a = sp.Sampler(sp.SamplingConfig(temperature=(1.0,) * 4), 4, 3, seed=7)
    b = sp.Sampler(sp.SamplingConfig(temperature=(1.0,) * 4), 4, 3, seed=7)
    draws_a = [a.draw(probs) for _ in range(5)]
    draws_b = [b.draw(probs) for _ in range(5)]
    np.testing.assert_array_equal(np.stack(draws_a), np.stack(draws_b))
    # row 1 of the batch draws what a batch of one draws for the same probabilities
    single = sp.Sampler(sp.SamplingConfig(temperature=(1.0,) * 4), 4, 1, seed=7)
    draws_single = [single.draw(probs[4:8]) for _ in range(5)]
    np.testing.assert_array_equal(np.stack(draws_a)[:, 4:8], np.stack(draws_single))


def test_next_tokens_redraws_only_rows_that_end_at_once():
    """The one sampling step of the pipeline and the scheduler: a row that drew EOS at step 0 draws
    again from the same probabilities (the next draws of its own generator); other rows keep theirs."""
    cfg = sp.SamplingConfig(temperature=(1.0,), eos_token=0)
    # row 0: EOS or token 1 at even odds; row 1: never EOS
    scores = np.log(np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], dtype=np.float32) + 1e-30)
    ended_seed = next(s for s in range(100) if sp.Sampler(cfg, 1, 2, seed=s).next_tokens(scores)[0, 0] == 0)
    plain = sp.Sampler(cfg, 1, 2, seed=ended_seed)
    draws = [plain.draw(sp.softmax(scores)) for _ in range(sp.EMPTY_REDRAWS + 1)]
    redrawn = sp.Sampler(cfg, 1, 2, seed=ended_seed).next_tokens(scores, redraw_ended=True)
    first_live = next(d[0] for d in draws if d[0] != 0)
    assert redrawn[0, 0] == first_live != 0
    # row 1 never ended: it keeps its first draw although its generator drew again alongside row 0
    assert redrawn[1, 0] == draws[0][1]
    assert sp.Sampler(cfg, 1, 2, seed=ended_seed).next_tokens(scores).shape == (2, 1)


def test_seed_groups_sample_each_group_as_a_batch_of_its_own():
    """Rows in seed groups (calibrate's batches generated in one call) draw, over several steps and a
    step-0 redraw in one group, exactly the tokens of each group sampled as its own batch."""
    cfg = sp.SamplingConfig(temperature=(1.0,), eos_token=0)
    rng = np.random.default_rng(3)
    # group 0 (2 rows): row 0 may end at once (EOS at even odds); group 1 (3 rows): never EOS
    first = np.log(np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.4, 0.3, 0.3],
                             [0.0, 0.2, 0.4, 0.4], [0.0, 0.3, 0.3, 0.4], [0.0, 0.1, 0.1, 0.8]], np.float32) + 1e-30)
    seed0 = next(s for s in range(100) if sp.Sampler(cfg, 1, 2, seed=s).next_tokens(first[:2])[0, 0] == 0)
    later = [rng.standard_normal((5, 4)).astype(np.float32) for _ in range(3)]
    grouped = sp.Sampler(cfg, 1, 5, sp.SeedGroups((seed0, 11), (2, 3)))
    alone = [sp.Sampler(cfg, 1, 2, seed0), sp.Sampler(cfg, 1, 3, 11)]
    got = [grouped.next_tokens(first, redraw_ended=True)] + [grouped.next_tokens(x) for x in later]
    want = [np.concatenate([alone[0].next_tokens(first[:2], redraw_ended=True),
                            alone[1].next_tokens(first[2:], redraw_ended=True)])]
    want += [np.concatenate([alone[0].next_tokens(x[:2]), alone[1].next_tokens(x[2:])]) for x in later]
    np.testing.assert_array_equal(np.stack(got), np.stack(want))
    assert got[0][0, 0] != 0  # the redraw happened
    with pytest.raises(ValueError, match="cover 4 rows"):
        sp.Sampler(cfg, 1, 5, sp.SeedGroups((1, 2), (2, 2)))


def test_tiny_temperature_is_argmax():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((8, 626)).astype(np.float32)
    cfg = sp.SamplingConfig(temperature=(1e-9,) * 4)
    s = sp.Sampler(cfg, 4, 2, seed=0)
    np.testing.assert_array_equal(s(logits, np.zeros((8, 0), np.int64), 5), logits.argmax(axis=1))


@pytest.mark.parametrize("scale", [0.05, 1.0, 8.0])
@pytest.mark.parametrize("top_p", [0.1, 0.7, 0.95, 0.999])
def test_top_p_matches_transformers_on_flat_and_peaked_rows(scale, top_p):
    """Flat rows keep hundreds of tokens (the partial sort must grow); peaked rows keep a few."""
    from transformers.generation import TopPLogitsWarper

    rng = np.random.default_rng(int(scale * 100) + int(top_p * 1000))
    x = (rng.standard_normal((6, 6000)) * scale).astype(np.float32)  # flat rows keep more than TOP_P_SLICE
    x[0, :5] = x[0, 5]  # ties
    want = TopPLogitsWarper(top_p, min_tokens_to_keep=3)(None, torch.from_numpy(x.copy())).numpy()
    assert_same(sp.apply_top_p(x, top_p), want)


def test_zero_noise_never_picks_an_impossible_token():
    """An exponential draw of exactly 0 (float32 ones are ~1e-7 likely) must not select p = 0 tokens."""

    class ZeroNoise:
        def standard_exponential(self, size, dtype=np.float64):
            noise = np.ones(size, dtype=dtype)
            noise[..., 0] = 0.0  # a zero draw where the probability is 0
            return noise

    probs = np.array([[0.0, 0.2, 0.8], [0.0, 1.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(sp.sample_rows(probs, [ZeroNoise()], 2), [2, 1])
