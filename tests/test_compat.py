"""Issue 16: `chattts_forge.compat`, the drop-in ChatTTS 0.2.5 API, against ChatTTS's own `Chat`.

The oracle is ChatTTS's `Chat` loaded on the same tiny checkpoint (`tiny_chat`). Codes are recorded
where each side generates them (ChatTTS's `_infer_code`, our `Chat._generate_codes`) while the
public `infer` runs; at temperature 1e-9 with the same `manual_seed` they must be identical.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import chattts_forge.compat as ChatTTS  # noqa: N812 - the one-line switch this module tests
from chattts_forge.convert.components import speech_like_recording
from chattts_forge.errors import ForgeError
from chattts_forge.runtime.chattts_speaker import encode_prompt, encode_speaker

TEXTS = {
    "zh": "今天天气很好，我们一起去公园散步吧。",
    "en": "The quick brown fox jumps over the lazy dog.",
    "mixed": "我们用 ChatTTS 合成 speech，效果很好。",
}
# Several sentences: split_text makes parts, batches of max_split_batch, and ChatTTS's
# reference-speaker step (speak part 1, encode that audio as spk_smp) runs on both sides.
SPLIT_TEXT = "今天天气很好。我们一起去公园散步吧。The dog runs. 我们用 ChatTTS 合成。"
GREEDY = {"temperature": 1e-9, "max_new_token": 24, "min_new_token": 12, "manual_seed": 0, "show_tqdm": False}


def _recording(seconds: float, seed: int) -> np.ndarray:
    return speech_like_recording(int(24000 * seconds), 24000, torch.Generator().manual_seed(seed)).numpy()


@pytest.fixture(scope="module")
def chat(tiny_artifacts: dict[str, Path]) -> ChatTTS.Chat:
    c = ChatTTS.Chat()
    assert not c.has_loaded()
    assert c.load(source="custom", custom_path=tiny_artifacts["fp32"], device="cpu", threads=1) is True
    assert c.has_loaded() and c.has_loaded(use_decoder=True)
    return c


def _record_chattts(ref) -> tuple[list[list[np.ndarray]], Callable[[], None]]:
    """Record the codes of every `_infer_code` batch ChatTTS runs; returns (calls, undo)."""
    calls: list[list[np.ndarray]] = []
    orig = ref._infer_code

    def wrapped(text, stream, device, return_hidden, params):
        for res in orig(text, stream, device, return_hidden, params):
            calls.append([i.detach().cpu().numpy().copy() for i in res.ids])
            yield res

    ref._infer_code = wrapped
    return calls, lambda: delattr(ref, "_infer_code")


def _record_ours(c: ChatTTS.Chat) -> tuple[list[list[np.ndarray]], Callable[[], None]]:
    calls: list[list[np.ndarray]] = []
    orig = c._generate_codes

    def wrapped(*args, **kwargs):
        gen = orig(*args, **kwargs)
        calls.append([x.copy() for x in gen.ids])
        return gen

    c._generate_codes = wrapped
    return calls, lambda: delattr(c, "_generate_codes")


def _both(tiny_chat, chat, text, **kwargs):
    """Run `infer` on ChatTTS and on compat with the same arguments; return both outputs and codes."""
    code = kwargs.pop("code", {})
    ref_calls, undo_ref = _record_chattts(tiny_chat)
    our_calls, undo_ours = _record_ours(chat)
    try:
        ref_out = tiny_chat.infer(text, params_infer_code=tiny_chat.InferCodeParams(**GREEDY, **code), **kwargs)
        our_out = chat.infer(text, params_infer_code=ChatTTS.Chat.InferCodeParams(**GREEDY, **code), **kwargs)
    finally:
        undo_ref()
        undo_ours()
    return ref_out, our_out, ref_calls, our_calls


def _assert_same_codes(ref_calls, our_calls) -> None:
    assert len(our_calls) == len(ref_calls), "not the same number of generation batches"
    for k, (ref, ours) in enumerate(zip(ref_calls, our_calls, strict=True)):
        assert len(ours) == len(ref), f"batch {k}: row count"
        for b, (r, o) in enumerate(zip(ref, ours, strict=True)):
            assert o.shape == r.shape and np.array_equal(o, r), f"batch {k} row {b}: codes differ from ChatTTS's"


def _assert_wavs_like_chattts(ref_out, our_out) -> None:
    assert isinstance(our_out, list) and len(our_out) == len(ref_out)
    for r, o in zip(ref_out, our_out, strict=True):
        assert isinstance(o, np.ndarray) and o.dtype == np.float32 and o.ndim == 1
        # same codes, same decoding; the |x| <= 1e-5 strip may differ by a few samples
        assert abs(len(o) - len(r)) <= 16, (len(o), len(r))


# ---- voice cloning -----------------------------------------------------------------------------


def test_sample_audio_speaker_equals_chattts(chat, tiny_chat) -> None:
    wavs = [_recording(513 / 24000, 1), _recording(1.0, 2), _recording(3.3, 3)]
    # and a waveform the model itself made (what split_text's reference step encodes)
    wavs.append(chat.infer(TEXTS["en"], skip_refine_text=True, split_text=False,
                           params_infer_code=ChatTTS.Chat.InferCodeParams(**GREEDY))[0])
    for wav in wavs:
        ours = chat.sample_audio_speaker(wav)
        assert isinstance(ours, str)
        assert ours == tiny_chat.sample_audio_speaker(wav.copy())
    # a CPU tensor is accepted as ChatTTS accepts it
    assert chat.sample_audio_speaker(torch.from_numpy(wavs[1])) == tiny_chat.sample_audio_speaker(wavs[1].copy())


# ---- identity of codes ---------------------------------------------------------------------------


@pytest.mark.parametrize("speaker", ["none", "spk_emb", "spk_smp"])
def test_infer_codes_equal_chattts(chat, tiny_chat, speaker: str) -> None:
    code = {}
    if speaker == "spk_emb":
        code = {"spk_emb": chat.sample_random_speaker(seed=11)}
    elif speaker == "spk_smp":
        smp = chat.sample_audio_speaker(_recording(2.0, 7))
        code = {"spk_smp": smp, "txt_smp": "今天天气很好"}
    texts = list(TEXTS.values())  # zh, en, mixed in one batch; split_text off
    ref_out, our_out, ref_calls, our_calls = _both(
        tiny_chat, chat, texts, skip_refine_text=True, split_text=False, code=code
    )
    _assert_same_codes(ref_calls, our_calls)
    _assert_wavs_like_chattts(ref_out, our_out)
    assert len(our_out) == 3


def test_split_text_codes_equal_chattts(chat, tiny_chat) -> None:
    ref_out, our_out, ref_calls, our_calls = _both(
        tiny_chat, chat, SPLIT_TEXT, skip_refine_text=True, split_text=True, max_split_batch=2
    )
    # the reference sentence, then the 4 parts in batches of 2
    assert [len(c) for c in our_calls] == [1, 2, 2]
    _assert_same_codes(ref_calls, our_calls)
    _assert_wavs_like_chattts(ref_out, our_out)
    assert len(our_out) == 1  # split_text joins the parts into one waveform, as ChatTTS


def test_refine_text_only_equals_chattts(chat, tiny_chat) -> None:
    refine = {"temperature": 1e-9, "max_new_token": 12, "manual_seed": 3, "show_tqdm": False}
    texts = [TEXTS["zh"], TEXTS["en"]]
    ref = tiny_chat.infer(texts, refine_text_only=True, split_text=False,
                          params_refine_text=tiny_chat.RefineTextParams(**refine))
    ours = chat.infer(texts, refine_text_only=True, split_text=False,
                      params_refine_text=ChatTTS.Chat.RefineTextParams(**refine))
    assert ours == ref and isinstance(ours, list)
    joined = chat.infer(texts, refine_text_only=True, params_refine_text=ChatTTS.Chat.RefineTextParams(**refine))
    assert joined == "\n".join(ref)  # split_text=True: one str, as ChatTTS


# ---- streaming, interrupt, normalizer ------------------------------------------------------------


def test_stream_chunks_are_the_waveforms(chat) -> None:
    texts = [TEXTS["zh"], TEXTS["en"]]
    code = {**GREEDY, "max_new_token": 60, "min_new_token": 10}
    params = ChatTTS.Chat.InferCodeParams(**code, stream_batch=8, stream_speed=3000, pass_first_n_batches=1)
    gen = chat.infer(texts, stream=True, skip_refine_text=True, split_text=False, params_infer_code=params)
    chunks = list(gen)
    assert len(chunks) >= 3
    for c in chunks:
        assert isinstance(c, np.ndarray) and c.dtype == np.float32 and c.ndim == 2 and c.shape[0] == 2
    assert all(c.shape[1] <= 3000 for c in chunks[:-1]), "stream_speed caps every chunk but the last"
    joined = np.concatenate(chunks, axis=1)
    # each row: its waveform decoded alone (exact streaming), then zeros where it waited for the other
    from chattts_forge.runtime import InferCodeParams

    runtime_params = InferCodeParams(temperature=code["temperature"], max_new_token=code["max_new_token"],
                                     min_new_token=code["min_new_token"], seed=code["manual_seed"])
    gen = chat.pipe.infer_code([chat.pipe.normalize(t) for t in texts], runtime_params)
    wavs = chat.pipe.decode(gen.hiddens)
    assert joined.shape[1] == max(len(w) for w in wavs)
    for b, w in enumerate(wavs):
        np.testing.assert_allclose(joined[b, : len(w)], w, atol=1e-4)
        assert not joined[b, len(w) :].any()


def test_interrupt_stops_a_stream(chat) -> None:
    params = ChatTTS.Chat.InferCodeParams(**{**GREEDY, "max_new_token": 400, "min_new_token": 400},
                                          stream_batch=4, pass_first_n_batches=0)
    full_steps = 400
    gen = chat.infer(TEXTS["en"], stream=True, skip_refine_text=True, split_text=False, params_infer_code=params)
    first = next(gen)
    chat.interrupt()
    rest = list(gen)
    samples = first.shape[1] + sum(c.shape[1] for c in rest)
    assert samples < 256 * (2 * full_steps - 1) // 2, "interrupt() did not stop the generation"


def test_normalizer_register(chat) -> None:
    assert chat.normalizer.register("en", lambda s: s.replace("fox", "cat"))
    try:
        assert not chat.normalizer.register("en", lambda s: s), "a second registration is refused, as ChatTTS"
        assert not chat.normalizer.register("zh", lambda s: 3), "a function not str -> str is refused"
        out = chat.normalizer("The quick brown fox [uv_break] jumps.")
        assert "cat" in out and "fox" not in out and "[uv_break]" in out
    finally:
        chat.normalizer.unregister("en")
    assert "fox" in chat.normalizer("The quick brown fox.")


# ---- loading ----------------------------------------------------------------------------------------


def test_load_version_folder_picks_a_variant(tiny_artifacts, tmp_path: Path) -> None:
    version = tmp_path / "chattts-synthetic-tiny-seed0" / "v1"
    version.mkdir(parents=True)
    for v in ("fp32", "fp16"):
        (version / v).symlink_to(tiny_artifacts[v], target_is_directory=True)
    c = ChatTTS.Chat()
    c.load(source="custom", custom_path=version, device="cpu", threads=1)
    assert c.pipe.artifact.variant == "fp32"  # CPU: int8-dynamic first, then fp32
    c.unload()
    assert not c.has_loaded()
    c.load(source="custom", custom_path=version, variant="fp16", device="cpu", threads=1)
    assert c.pipe.artifact.variant == "fp16"
    with pytest.raises(ForgeError, match="variant='int4' is not in .*fp16, fp32"):
        c.load(source="custom", custom_path=version, variant="int4")


def test_version_folder_preference_covers_every_built_variant(tmp_path: Path) -> None:
    from chattts_forge.artifact import VARIANTS
    from chattts_forge.runtime.compat_load import VARIANT_PREFERENCE, resolve_artifact

    def version_with(*variants: str) -> Path:
        folder = tmp_path / "-".join(variants)
        for v in variants:
            (folder / v).mkdir(parents=True, exist_ok=True)
            (folder / v / "artifact.json").write_text("{}")
        return folder

    assert set(VARIANT_PREFERENCE["cpu"]) == set(VARIANTS)  # every variant the build makes has a place
    # A version where int8-dynamic failed its gate but the KV-cache and auto variants passed.
    assert resolve_artifact(version_with("auto", "fp16", "int8-dynamic-kv8"), None, "cpu").name == "int8-dynamic-kv8"
    assert resolve_artifact(version_with("auto", "fp16", "int4"), None, "cpu").name == "auto"
    assert resolve_artifact(version_with("auto", "fp16", "int8-dynamic-kv8"), None, "cuda").name == "fp16"
    # The INT8 KV cache is measured on CPU only: on CUDA it is never preferred.
    assert resolve_artifact(version_with("int8-dynamic-kv8", "int8-static"), None, "cuda").name == "int8-static"


def test_artifact_without_encoder(tiny_artifacts, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(tiny_artifacts["fp32"], old)
    doc = json.loads((old / "artifact.json").read_text())
    del doc["components"]["dvae_encoder"]
    (old / "artifact.json").write_text(json.dumps(doc))
    (old / "dvae_encoder.onnx").unlink()
    c = ChatTTS.Chat()
    c.load(source="custom", custom_path=old, device="cpu", threads=1)
    with pytest.raises(ForgeError, match="no dvae_encoder.onnx .*convert the checkpoint again"):
        c.sample_audio_speaker(_recording(1.0, 1))
    with pytest.raises(ForgeError, match="split_text=False or a spk_smp"):
        c.infer(SPLIT_TEXT, skip_refine_text=True, params_infer_code=ChatTTS.Chat.InferCodeParams(**GREEDY))
    # everything else still works
    [wav] = c.infer(TEXTS["zh"], skip_refine_text=True, params_infer_code=ChatTTS.Chat.InferCodeParams(**GREEDY))
    assert wav.ndim == 1 and len(wav) > 0


# ---- bad input --------------------------------------------------------------------------------------


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_bad_recordings(chat) -> None:
    wav = _recording(1.0, 4)
    cases = {
        "must be 1-D": wav[None, :],
        "must hold float samples .* int16": (wav * 32767).astype(np.int16),
        "is empty": np.zeros(0, dtype=np.float32),
        "has 100 samples; the encoder needs at least 513": wav[:100],
        "holds NaN or infinite": np.full(1000, np.nan, dtype=np.float32),
    }
    for pattern, bad in cases.items():
        with pytest.raises(ForgeError, match=f"wav {pattern}") as e:
            chat.sample_audio_speaker(bad)
        _one_line(e)


def test_speakers_from_another_model(chat) -> None:
    greedy = {**GREEDY, "max_new_token": 4, "min_new_token": 0}
    full_size_spk = encode_speaker(np.ones(768, dtype=np.float16))  # a released-size speaker
    bad_smp = {
        "spk_smp holds codes of shape \\(3, 10\\)": encode_prompt(np.zeros((3, 10), dtype=np.int64)),
        "spk_smp holds code 900": encode_prompt(np.full((4, 10), 900)),
        "spk_smp: not a ChatTTS speaker sample string": "not a sample",
    }
    with pytest.raises(ForgeError, match="spk_emb: speaker embedding has 768 values") as e:
        chat.infer("hello.", skip_refine_text=True,
                   params_infer_code=ChatTTS.Chat.InferCodeParams(**greedy, spk_emb=full_size_spk))
    _one_line(e)
    for pattern, smp in bad_smp.items():
        with pytest.raises(ForgeError, match=pattern) as e:
            chat.infer("hello.", skip_refine_text=True,
                       params_infer_code=ChatTTS.Chat.InferCodeParams(**greedy, spk_smp=smp))
        _one_line(e)


def test_unknown_and_unsupported_arguments(chat, tiny_artifacts) -> None:
    with pytest.raises(ForgeError, match="Chat.infer\\(\\) has no parameter 'speed'") as e:
        chat.infer("hello.", speed=3)
    assert isinstance(e.value, TypeError)  # as Python's own unknown-keyword error
    with pytest.raises(ForgeError, match="InferCodeParams has no parameter 'top_p'"):
        ChatTTS.Chat.InferCodeParams(top_p=0.5)  # ChatTTS spells it top_P
    with pytest.raises(ForgeError, match="RefineTextParams has no parameter 'spk_emb'"):
        ChatTTS.Chat.RefineTextParams(spk_emb="x")
    fresh = ChatTTS.Chat()
    art = tiny_artifacts["fp32"]
    refusals = {
        "source='huggingface' is not supported; .*custom_path": {"source": "huggingface"},
        "source='local' is not supported": {"custom_path": art},
        "custom_path is required": {"source": "custom"},
        "compile=True": {"source": "custom", "custom_path": art, "compile": True},
        "use_vllm=True": {"source": "custom", "custom_path": art, "use_vllm": True},
        "device='mps'": {"source": "custom", "custom_path": art, "device": "mps"},
        "coef differs": {"source": "custom", "custom_path": art, "coef": "abc"},
        "Chat.load\\(\\) has no parameter 'dtype'": {"source": "custom", "custom_path": art, "dtype": "fp16"},
    }
    for pattern, kwargs in refusals.items():
        with pytest.raises(ForgeError, match=pattern) as e:
            fresh.load(**kwargs)
        _one_line(e)
    assert not fresh.has_loaded()
    with pytest.raises(ForgeError, match="call chat.load"):
        fresh.infer("hello.")
    with pytest.raises(ForgeError, match="params_infer_code must be"):
        chat.infer("hello.", params_infer_code={"temperature": 0.3})


# ---- synth --speaker-audio ------------------------------------------------------------------------


def test_synth_speaker_audio_clones_like_chattts(tiny_chat, tiny_artifacts, tmp_path: Path) -> None:
    import soundfile as sf
    from click.testing import CliRunner

    from chattts_forge.cli import main

    wav = _recording(1.5, 9)
    sample = tmp_path / "me.wav"
    sf.write(sample, wav, 24000, subtype="FLOAT")
    transcript = "今天天气很好"
    args = ["synth", "--artifact", str(tiny_artifacts["fp32"]), "--text", TEXTS["mixed"], "--out",
            str(tmp_path / "a.wav"), "--seed", "0", "--temperature", "1e-9", "--no-refine", "--threads", "1",
            "--max-new-token", "24", "--min-new-token", "12", "--speaker-audio", str(sample),
            "--speaker-text", transcript, "--speaker-out", str(tmp_path / "spk.txt"),
            "--codes-out", str(tmp_path / "codes.npy")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    spk_smp = (tmp_path / "spk.txt").read_text().strip()
    assert spk_smp == tiny_chat.sample_audio_speaker(wav.copy())
    calls, undo = _record_chattts(tiny_chat)
    try:
        tiny_chat.infer(TEXTS["mixed"], skip_refine_text=True, split_text=False, params_infer_code=(
            tiny_chat.InferCodeParams(**GREEDY, spk_smp=spk_smp, txt_smp=transcript)))
    finally:
        undo()
    assert np.array_equal(np.load(tmp_path / "codes.npy"), calls[0][0])

    stereo = tmp_path / "stereo.wav"
    sf.write(stereo, np.stack([wav, wav], 1), 24000)
    slow = tmp_path / "16k.wav"
    sf.write(slow, wav, 16000)
    for path, message in ((stereo, "has 2 channels; give a mono recording"),
                          (slow, "is sampled at 16000 Hz; resample it to 24000 Hz first"),
                          (tmp_path / "missing.wav", "does not exist")):
        res = CliRunner().invoke(main, args[:-6] + ["--speaker-audio", str(path)])
        assert res.exit_code == 2 and message in res.output, res.output


def test_load_of_a_version_opens_each_session_once(tiny_artifacts, tmp_path: Path, monkeypatch) -> None:
    """Chat.load on a version folder: the Router's autotune opens every passing variant's GPT step to
    time it, and the variant it serves is built on those sessions, not opened a second time."""
    import onnxruntime as ort
    from stand_in_report import publish_stand_in_version

    from chattts_forge.runtime.autotune import AutotuneSettings

    # fp32 passes everywhere, fp16 only short and medium texts: autotune times both there, and the
    # longest bucket (the one Chat serves) has fp32 alone
    version = publish_stand_in_version(tiny_artifacts, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (True, 1.0), "long": (False, 1.0)}})
    opened: list[str] = []
    real = ort.InferenceSession

    def counting(path, *args, **kwargs):
        opened.append(str(Path(path).relative_to(version)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    c = ChatTTS.Chat()
    c.load(source="custom", custom_path=version, device="cpu", threads=1,
           autotune=AutotuneSettings(time_cap_s=0.3, use_cache=False))
    assert c.autotune["source"] == "measured" and c.pipe.artifact.variant == "fp32"
    gpt = [p for p in opened if p.startswith("fp32/gpt")]
    assert gpt and sorted({p.split("/")[0] for p in opened}) == ["fp16", "fp32"]  # both were timed
    wavs = c.infer("你好。", skip_refine_text=True, params_infer_code=ChatTTS.Chat.InferCodeParams(**GREEDY))
    assert len(wavs) == 1 and wavs[0].size > 0
    assert len(opened) == len(set(opened)), f"sessions opened twice: {opened}"
    assert [p for p in opened if p.startswith("fp32/gpt")] == gpt  # synthesis ran on the timed session
