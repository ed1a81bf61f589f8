"""The runtime pipeline on the tiny FP32 artifact: ChatTTS parity, streaming, batching, errors."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from chattts_forge.errors import ForgeError
from chattts_forge.runtime import InferCodeParams, Pipeline, RefineTextParams, StreamDecoder, SynthParams
from chattts_forge.runtime.chattts_text import is_speakable

TEXTS = ["你好，欢迎使用这个系统。", "Hello world, this is a test.", "我今天用了 ChatTTS, it works."]
NEAR_TIE = 1e-5


@pytest.fixture(scope="module")
def pipe(tiny_artifacts) -> Pipeline:
    return Pipeline(tiny_artifacts["fp32"], threads=1)


@pytest.fixture(scope="module")
def speaker(pipe) -> str:
    return pipe.random_speaker(11)


@pytest.mark.parametrize("with_speaker", [False, True])
def test_codes_match_chattts_at_tiny_temperature(pipe, tiny_chat, speaker, with_speaker):
    from chattts_forge.torch_ref import oracle

    spk = speaker if with_speaker else None
    steps = 40
    run = oracle.chattts_codes(tiny_chat, TEXTS, max_new_token=steps, min_new_token=steps, spk_emb=spk)
    norm = [pipe.normalize(t) for t in TEXTS]
    assert norm == run["texts"]
    gen = pipe.infer_code(
        norm, InferCodeParams(temperature=1e-9, max_new_token=steps, min_new_token=steps, spk_emb=spk, seed=0)
    )
    for b in range(len(TEXTS)):
        want, got = run["codes"][b], gen.ids[b]
        assert got.shape == want.shape == (steps, 4)
        diff = np.nonzero((got != want).any(axis=1))[0]
        if len(diff):  # admissible only at a near-tie of ChatTTS's own decision
            gap = run["top2_gap_penalized"][b][diff[0]].min()
            assert gap < NEAR_TIE, f"row {b} diverges at step {diff[0]} with top-2 gap {gap}"
            pytest.xfail(f"row {b} diverged at a near-tie (gap {gap:.2e}) at step {diff[0]}")
        np.testing.assert_allclose(gen.hiddens[b], run["hiddens"][b], atol=1e-4)


def test_teacher_forced_logits_match_chattts(pipe, tiny_chat, speaker):
    from chattts_forge.torch_ref import oracle

    rng = np.random.default_rng(0)
    codes = [rng.integers(0, 625, size=(n, 4)) for n in (30, 22, 25)]
    codes[1][5:9, 2] = codes[1][4, 2]  # repeats, so the penalty has counts > 1
    kw = dict(temperature=0.3, min_new_token=10, spk_emb=speaker)
    want = oracle.chattts_teacher_forced_logits(tiny_chat, TEXTS, codes, **kw)["processed_logits"]
    norm = [pipe.normalize(t) for t in TEXTS]
    got = pipe.teacher_forced_logits(norm, codes, InferCodeParams(**kw))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_array_equal(np.isfinite(g), np.isfinite(w))
        fin = np.isfinite(w)
        assert np.abs(g[fin] - w[fin]).max() <= 1e-4


@pytest.mark.parametrize("use_decoder", [True, False])
def test_decode_matches_chattts(pipe, tiny_chat, use_decoder):
    from chattts_forge.torch_ref import oracle

    rng = np.random.default_rng(1)
    items = (
        [rng.standard_normal((n, pipe.dims.hidden_size)).astype(np.float32) for n in (17, 40)]
        if use_decoder
        else [rng.integers(0, 625, size=(n, 4)) for n in (17, 40)]
    )
    for x in items:
        want = oracle.chattts_decode_to_wavs(tiny_chat, [x], use_decoder)[0]
        got = pipe.decode([x], use_decoder)[0]
        assert got.shape == want.shape == (pipe.hop * (2 * len(x) - 1),)
        assert np.abs(got - want).max() <= 1e-3
    # ChatTTS's zero-padded batch semantics
    want = oracle.chattts_decode_to_wavs(tiny_chat, items, use_decoder)
    got = pipe.decode_to_wavs(items, use_decoder)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-3


STREAM_TOL = 1e-5


@pytest.mark.parametrize("use_decoder", [True, False])
def test_stream_decoder_equals_full_decode(pipe, use_decoder):
    """Pushing growing prefixes (irregular sizes, down to one step) and concatenating == one decode."""
    rng = np.random.default_rng(2)
    for total in (1, 3, 30, 97):
        x = (
            rng.standard_normal((total, pipe.dims.hidden_size)).astype(np.float32)
            if use_decoder
            else rng.integers(0, 625, size=(total, 4))
        )
        full = pipe.decode([x], use_decoder)[0]
        dec = StreamDecoder(pipe, use_decoder)
        pieces, n = [], 0
        while n < total:
            n = min(total, n + int(rng.integers(1, 30)))
            pieces.append(dec.push(x[:n], final=n == total))
        streamed = np.concatenate(pieces)
        assert streamed.shape == full.shape
        assert np.abs(streamed - full).max() <= STREAM_TOL


def test_stream_decodes_windows_not_the_prefix(pipe, monkeypatch):
    seen: list[int] = []
    orig = pipe.decode_mel

    def spy(x, use_decoder=True):
        seen.append(len(x))
        return orig(x, use_decoder)

    monkeypatch.setattr(pipe, "decode_mel", spy)
    x = np.random.default_rng(3).standard_normal((400, pipe.dims.hidden_size)).astype(np.float32)
    dec = StreamDecoder(pipe)
    for n in range(24, 401, 24):
        dec.push(x[:n], final=False)
    dec.push(x, final=True)
    window = 24 + pipe.decoder_radius + pipe.vocos_radius + 4
    assert max(seen) <= window < 400


def test_stream_equals_synthesize(pipe, speaker):
    params = SynthParams(code=InferCodeParams(seed=3, max_new_token=75, min_new_token=75, spk_emb=speaker))
    full = pipe.synthesize(TEXTS[:2], params)
    chunks = list(pipe.stream(TEXTS[:2], params, stream_batch=24))
    assert len(chunks) >= 3
    for i, res in enumerate(full):
        streamed = np.concatenate([c[i] for c in chunks])
        assert streamed.shape == res.wav.shape
        assert np.abs(streamed - res.wav).max() <= STREAM_TOL


def _first_audio_step(pipe, chunks, lookahead):
    """The code step at which the first non-empty chunk was emitted (its length is (2n - L) * hop)."""
    first = next(c[0] for c in chunks if len(c[0]))
    return (len(first) // pipe.hop + lookahead) / 2


def test_first_chunk_comes_as_soon_as_exact_audio_exists(pipe):
    """First audio is not held to the stream_batch cadence, and the stream stays exact."""
    params = SynthParams(code=InferCodeParams(seed=3, max_new_token=75, min_new_token=75))
    [full] = pipe.synthesize(TEXTS[:1], params)
    chunks = list(pipe.stream(TEXTS[:1], params, stream_batch=1000))
    exact = pipe.decoder_radius + pipe.vocos_radius
    first = next(c[0] for c in chunks if len(c[0]))
    assert 0 < len(first) <= 2 * pipe.hop  # emitted at the first step with any final sample
    assert _first_audio_step(pipe, chunks, exact) == exact // 2 + 1
    streamed = np.concatenate([c[0] for c in chunks])
    assert streamed.shape == full.wav.shape
    assert np.abs(streamed - full.wav).max() <= STREAM_TOL


def test_lookahead_trades_exactness_for_earlier_audio(pipe):
    params = SynthParams(code=InferCodeParams(seed=3, max_new_token=75, min_new_token=75))
    [full] = pipe.synthesize(TEXTS[:1], params)
    exact = pipe.decoder_radius + pipe.vocos_radius
    chunks = list(pipe.stream(TEXTS[:1], params, stream_batch=16, lookahead_frames=8))
    assert _first_audio_step(pipe, chunks, 8) == 5 < exact // 2 + 1
    streamed = np.concatenate([c[0] for c in chunks])
    assert streamed.shape == full.wav.shape  # same samples, only chunk edges see less right context
    # a lookahead at or beyond the receptive field is the exact stream
    wide = np.concatenate([c[0] for c in pipe.stream(TEXTS[:1], params, stream_batch=16, lookahead_frames=10_000)])
    assert np.abs(wide - full.wav).max() <= STREAM_TOL
    with pytest.raises(ForgeError, match="lookahead"):
        list(pipe.stream(TEXTS[:1], params, lookahead_frames=-1))


def test_batch_rows_equal_single_runs(pipe):
    params = SynthParams(code=InferCodeParams(seed=5, max_new_token=50, temperature=0.3))
    batch = pipe.synthesize(TEXTS, params)
    for text, row in zip(TEXTS, batch, strict=True):
        [single] = pipe.synthesize([text], params)
        np.testing.assert_array_equal(row.codes, single.codes)
        np.testing.assert_allclose(row.hiddens, single.hiddens, atol=1e-5)
        assert row.wav.shape == single.wav.shape
        assert np.abs(row.wav - single.wav).max() <= 1e-4


def test_seeded_sampling_is_reproducible(pipe):
    def codes(seed):
        return pipe.synthesize(TEXTS[0], SynthParams(code=InferCodeParams(seed=seed, max_new_token=30)))[0].codes

    np.testing.assert_array_equal(codes(1), codes(1))
    assert not np.array_equal(codes(1), codes(2))


class _EosAt:
    """A head_code session wrapper that makes stream 2 of batch row 0 prefer EOS at one step."""

    def __init__(self, session, step: int, eos: int) -> None:
        self.session, self.step, self.eos, self.calls = session, step, eos, 0

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feeds):
        out = self.session.run(names, feeds)
        if self.calls == self.step:
            out[0][0, 2, self.eos] = 1e4
        self.calls += 1
        return out


@pytest.mark.parametrize("min_new_token", [0, 9])
def test_eos_in_any_stream_ends_only_its_row(pipe, monkeypatch, min_new_token):
    head = pipe.artifact.session("head_code")
    monkeypatch.setitem(pipe.artifact._sessions, "head_code", _EosAt(head, 7, pipe.eos_code))
    gen = pipe.infer_code(
        [pipe.normalize(t) for t in TEXTS[:2]],
        InferCodeParams(seed=0, max_new_token=20, min_new_token=min_new_token, temperature=1e-9),
    )
    if min_new_token > 7:  # EOS masked at that step: nothing ends
        assert [len(i) for i in gen.ids] == [20, 20]
        assert not gen.finished.any()
    else:
        assert [len(i) for i in gen.ids] == [7, 20]
        assert [len(h) for h in gen.hiddens] == [7, 20]
        assert gen.finished.tolist() == [True, False]


def test_refine_matches_chattts(pipe, tiny_chat):
    from ChatTTS.core import Chat

    from chattts_forge.torch_ref.chat import quiet_chattts

    norm = [pipe.normalize(t) for t in TEXTS]
    steps = 20
    with quiet_chattts():
        want = tiny_chat._refine_text(
            norm,
            tiny_chat.device,
            Chat.RefineTextParams(temperature=1e-9, max_new_token=steps, min_new_token=steps, show_tqdm=False,
                                  ensure_non_empty=False, manual_seed=0),
        )
    gen = pipe.refine_generation(norm, RefineTextParams(temperature=1e-9, max_new_token=steps, min_new_token=steps))
    for got, w in zip(gen.ids, want.ids, strict=True):
        np.testing.assert_array_equal(got, w.numpy())
    texts = pipe.refine_text(norm, RefineTextParams(temperature=1e-9, max_new_token=steps, min_new_token=steps, seed=1))
    kept = [w[w < tiny_chat.tokenizer.break_0_ids] for w in want.ids]
    assert texts == tiny_chat.tokenizer.decode(kept)


def test_stream_equals_synthesize_when_rows_end_at_different_steps(pipe, monkeypatch):
    head = pipe.artifact.session("head_code")
    params = SynthParams(code=InferCodeParams(seed=4, max_new_token=70))
    monkeypatch.setitem(pipe.artifact._sessions, "head_code", _EosAt(head, 30, pipe.eos_code))
    full = pipe.synthesize(TEXTS[:2], params)
    assert [len(r.codes) for r in full] == [30, 70]
    monkeypatch.setitem(pipe.artifact._sessions, "head_code", _EosAt(head, 30, pipe.eos_code))
    chunks = list(pipe.stream(TEXTS[:2], params, stream_batch=16))
    for i, res in enumerate(full):
        streamed = np.concatenate([c[i] for c in chunks])
        assert streamed.shape == res.wav.shape
        assert np.abs(streamed - res.wav).max() <= STREAM_TOL


def test_split_sentences_joins_rows(pipe):
    text = "第一句话。Second sentence here. 第三句。"
    params = SynthParams(code=InferCodeParams(seed=0, max_new_token=12, min_new_token=12), split_sentences=True)
    [res] = pipe.synthesize([text], params)
    parts = pipe.synthesize(["第一句话。", "Second sentence here. ", "第三句。"], replace(params, split_sentences=False))
    np.testing.assert_array_equal(res.codes, np.concatenate([p.codes for p in parts]))
    np.testing.assert_allclose(res.wav, np.concatenate([p.wav for p in parts]), atol=1e-5)


def test_fast_engine_equals_plain(tiny_artifacts, tmp_path):
    """With gpt_fast.onnx (quantize.fast_gpt_graph), the default engine ("auto", as synth) takes the in-place KV-cache graph: same codes."""
    from chattts_forge.quantize import fast_gpt_graph as optimize

    art = shutil.copytree(tiny_artifacts["fp32"], tmp_path / "fast")
    if not (art / "gpt_fast.onnx").exists():
        record = optimize.optimize_gpt(art)
        meta = json.loads((art / "artifact.json").read_text())
        meta["components"]["gpt_fast"] = record
        (art / "artifact.json").write_text(json.dumps(meta))
    plain, fast = Pipeline(art, threads=1, engine="plain"), Pipeline(art, threads=1)
    assert (plain.engine, fast.engine) == ("plain", "fast")
    params = InferCodeParams(seed=0, max_new_token=40, min_new_token=40, temperature=1e-9)
    norm = [plain.normalize(t) for t in TEXTS]
    a, b = plain.infer_code(norm, params), fast.infer_code(norm, params)
    for x, y, hx, hy in zip(a.ids, b.ids, a.hiddens, b.hiddens, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_allclose(hx, hy, atol=1e-4)
    with pytest.raises(ForgeError, match="engine"):
        Pipeline(tiny_artifacts["fp32"], engine="turbo")


# ---- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_empty_text(pipe, text):
    with pytest.raises(ForgeError, match="empty text"):
        pipe.synthesize([text])


@pytest.mark.parametrize("text", ["!!!", "😀😀", "。。。"])
def test_text_that_normalises_to_nothing(pipe, text):
    with pytest.raises(ForgeError, match="normalises to nothing"):
        pipe.synthesize([text])


def test_symbols_are_spoken_with_normalization_and_deleted_without(pipe):
    """`@#$%`: ChatTTS's own front end deletes every character; the spoken form names them."""
    with pytest.raises(ForgeError, match="normalises to nothing"):
        pipe.synthesize(["@#$%"], SynthParams(text_normalization=False))
    spoken = pipe.normalize("@#$%")
    assert is_speakable(spoken) and not set("@#$%") & set(spoken)


def test_unknown_characters_are_filtered_with_a_warning(pipe, caplog):
    with caplog.at_level("WARNING"):
        out = pipe.normalize("你好😀世界")
    assert out == "你好世界"
    assert "invalid characters" in caplog.text


def test_overlong_input(pipe):
    with pytest.raises(ForgeError, match="more than the 4096"):
        pipe.synthesize(["很长的句子。" * 700], SynthParams(code=InferCodeParams(max_new_token=2048)))


def test_long_input_is_cut_into_segments_that_join_to_its_spoken_form(pipe):
    """2,400 characters: accepted (OpenAI's 4,096 bound), cut at sentence ends into bounded segments
    whose concatenation is the whole spoken text; without normalization, ChatTTS's one prompt."""
    from chattts_forge.runtime.segments import SEGMENT_SECONDS, spoken_seconds

    text = "第1句话，价格是 ¥5。" * 200
    segments, owner = pipe.normalize_texts([text], SynthParams())
    assert len(segments) > 1 and set(owner) == {0}
    assert all(spoken_seconds(s) <= SEGMENT_SECONDS for s in segments)
    assert "".join(segments) == pipe.normalize(text).replace(" ", "")
    assert not any(c.isdigit() or c == "¥" for c in "".join(segments))


def test_unknown_provider(tiny_artifacts):
    with pytest.raises(ForgeError, match="unknown provider"):
        Pipeline(tiny_artifacts["fp32"], provider="tpu")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_artifact_file(tiny_artifacts, tmp_path):
    art = _copy(tiny_artifacts["fp32"], tmp_path / "a")
    (art / "head_code.onnx").unlink()
    with pytest.raises(ForgeError, match="missing"):
        Pipeline(art)
    with pytest.raises(ForgeError, match="does not exist"):
        Pipeline(tmp_path / "nope")


def test_mismatched_artifact_file(tiny_artifacts, tmp_path):
    art = _copy(tiny_artifacts["fp32"], tmp_path / "a")
    data = bytearray((art / "head_code.onnx").read_bytes())
    data[-1] ^= 0xFF
    (art / "head_code.onnx").write_bytes(bytes(data))
    with pytest.raises(ForgeError, match="sha256"):
        Pipeline(art)
    (art / "head_code.onnx").write_bytes(bytes(data) + b"x")
    with pytest.raises(ForgeError, match="bytes"):
        Pipeline(art)


def test_bad_artifact_json(tiny_artifacts, tmp_path):
    art = _copy(tiny_artifacts["fp32"], tmp_path / "a")
    meta = json.loads((art / "artifact.json").read_text())
    meta["schema"] = "something/else"
    (art / "artifact.json").write_text(json.dumps(meta))
    with pytest.raises(ForgeError, match="schema"):
        Pipeline(art)
    (art / "artifact.json").write_text("{not json")
    with pytest.raises(ForgeError, match="unreadable"):
        Pipeline(art)


def test_a_long_text_streams_segment_after_segment_as_it_synthesizes_whole(pipe, speaker):
    """Segments of one long text: streamed in turn (a pause between) = synthesized whole (batched rows,
    each seeded alike), refinement off; without normalization the same text is one prompt."""
    text = "第1段话，请在 3 点前确认订单。" * 12
    params = SynthParams(code=InferCodeParams(seed=5, max_new_token=20, min_new_token=20, spk_emb=speaker))
    segments, _ = pipe.normalize_texts([text], params)
    assert len(segments) > 1
    [whole] = pipe.synthesize([text], params)
    streamed = np.concatenate([c[0] for c in pipe.stream([text], params, stream_batch=8)])
    assert streamed.shape == whole.wav.shape
    assert np.abs(streamed - whole.wav).max() <= STREAM_TOL
    assert len(pipe.normalize_texts([text], replace(params, text_normalization=False))[0]) == 1
