"""`chattts-forge reference` and `reference_synthesize`: ChatTTS's own Chat.infer on a tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.torch_ref.reference import reference_synthesize

TEXT = "你好，世界。"
FAST = {"refine": False, "max_new_token": 48, "min_new_token": 16}


def _check_audio(wav: np.ndarray) -> None:
    assert wav.dtype == np.float32 and wav.ndim == 1
    assert wav.size > 2400, "less than 0.1 s of audio"
    assert np.all(np.isfinite(wav))
    assert float(np.sqrt(np.mean(wav.astype(np.float64) ** 2))) > 1e-4, "silent output"


def test_cli_writes_24k_float_wav_and_codes(tiny_ckpt: Path, tmp_path: Path) -> None:
    out, codes_out = tmp_path / "ref.wav", tmp_path / "codes.npy"
    args = ["reference", "--checkpoint", str(tiny_ckpt), "--text", TEXT, "--out", str(out), "--seed", "0"]
    args += ["--no-refine", "--max-new-token", "48", "--min-new-token", "24", "--codes-out", str(codes_out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    info = sf.info(str(out))
    assert (info.samplerate, info.channels, info.subtype) == (24000, 1, "FLOAT")
    wav, sr = sf.read(str(out), dtype="float32")
    _check_audio(wav)
    codes = np.load(codes_out)
    assert codes.ndim == 2 and codes.shape[1] == 4 and 24 <= codes.shape[0] <= 48
    assert np.issubdtype(codes.dtype, np.integer)
    assert codes.min() >= 0 and codes.max() < 625  # EOS (625) is never part of the codes
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


def test_same_seed_same_result_other_seed_other_codes(tiny_chat) -> None:
    kw = {**FAST, "temperature": 0.7, "min_new_token": 32}
    a = reference_synthesize(tiny_chat, TEXT, seed=7, **kw)
    b = reference_synthesize(tiny_chat, TEXT, seed=7, **kw)
    c = reference_synthesize(tiny_chat, TEXT, seed=8, **kw)
    _check_audio(a.wav)
    assert a.sample_rate == 24000
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.wav, b.wav)
    assert a.codes.shape[1] == 4 and a.hiddens.shape == (len(a.codes), tiny_chat.config.gpt.hidden_size)
    assert not np.array_equal(a.codes[: len(c.codes)], c.codes[: len(a.codes)])


def test_dvae_path_uses_the_same_codes(tiny_chat) -> None:
    dec = reference_synthesize(tiny_chat, TEXT, seed=1, use_decoder=True, **FAST)
    dvae = reference_synthesize(tiny_chat, TEXT, seed=1, use_decoder=False, **FAST)
    _check_audio(dvae.wav)
    np.testing.assert_array_equal(dec.codes, dvae.codes)
    assert dvae.hiddens.shape[0] == 0  # ChatTTS only returns hidden states for the Decoder
    assert not np.array_equal(dec.wav[:1000], dvae.wav[:1000])


def test_random_speaker_is_seeded_and_reusable(tiny_chat) -> None:
    a = reference_synthesize(tiny_chat, TEXT, seed=3, speaker="random", **FAST)
    b = reference_synthesize(tiny_chat, TEXT, seed=3, speaker="random", **FAST)
    assert a.speaker and a.speaker == b.speaker
    again = reference_synthesize(tiny_chat, TEXT, seed=3, speaker=a.speaker, **FAST)
    np.testing.assert_array_equal(a.codes, again.codes)
    plain = reference_synthesize(tiny_chat, TEXT, seed=3, **FAST)
    assert not np.array_equal(plain.codes[:8], a.codes[:8]), "the speaker embedding had no effect"


def test_refine_runs_the_text_refiner(tiny_chat) -> None:
    res = reference_synthesize(
        tiny_chat, TEXT, seed=0, refine=True, max_new_token=24, min_new_token=8, refine_max_new_token=24
    )
    _check_audio(res.wav)
    assert res.codes.shape[1] == 4 and len(res.texts) >= 1


def test_several_sentences_give_all_parts(tiny_chat) -> None:
    res = reference_synthesize(tiny_chat, "你好。Hello there. 再见。", seed=0, **FAST)
    assert len(res.parts) == 3
    assert len(res.codes) == sum(len(p) for p in res.parts)
    _check_audio(res.wav)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"text": "   "}, "empty text"),
        ({"speaker": "not a speaker"}, "speaker"),
        ({"temperature": 0.0}, "temperature"),
        ({"min_new_token": 99, "max_new_token": 10}, "min-new-token"),
    ],
)
def test_bad_input_is_a_forge_error(tiny_chat, kwargs: dict, message: str) -> None:
    call = {"text": TEXT, **FAST, **kwargs}
    with pytest.raises(ForgeError, match=message):
        reference_synthesize(tiny_chat, call.pop("text"), **call)


def test_cli_errors_are_one_line(tiny_ckpt: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(
        main, ["reference", "--checkpoint", str(tmp_path / "nope"), "--text", TEXT, "--out", str(tmp_path / "a.wav")]
    )
    assert missing.exit_code == 2
    assert missing.output.strip().count("\n") == 0 and "does not exist" in missing.output
    empty = runner.invoke(
        main, ["reference", "--checkpoint", str(tiny_ckpt), "--text", " ", "--out", str(tmp_path / "a.wav")]
    )
    assert empty.exit_code == 2 and "empty" in empty.output
    assert not (tmp_path / "a.wav").exists()


def test_help_explains_the_knobs() -> None:
    res = CliRunner().invoke(main, ["reference", "--help"])
    assert res.exit_code == 0
    for opt in ("--seed", "--speaker", "--temperature", "--top-p", "--top-k", "--repetition-penalty",
                "--max-new-token", "--min-new-token", "--refine / --no-refine", "--decoder / --dvae", "--codes-out"):
        assert opt in res.output, opt


def test_load_chat_honours_tiny_dims_without_touching_chattts_defaults(tiny_chat) -> None:
    from ChatTTS.config.config import Config

    from chattts_forge.checkpoint.layout import TINY

    assert tiny_chat.config.gpt.hidden_size == TINY.hidden_size
    assert tiny_chat.gpt.gpt.config.num_hidden_layers == TINY.num_hidden_layers
    assert tiny_chat.config.decoder.hidden == TINY.decoder.hidden
    assert tiny_chat.config.vocos.backbone.init_args.dim == TINY.vocos_dim
    assert not tiny_chat.gpt.training and not tiny_chat.decoder.training
    # ChatTTS's Config shares nested default instances: they must still hold the released model.
    assert Config().gpt.hidden_size == 768 and Config().decoder.hidden == 512


def test_load_chat_rejects_unmarked_or_incomplete_checkpoints(tiny_ckpt: Path, tmp_path: Path) -> None:
    import shutil

    from chattts_forge.checkpoint.layout import MARKER_NAME
    from chattts_forge.torch_ref.chat import load_chat

    unmarked = tmp_path / "unmarked"
    shutil.copytree(tiny_ckpt, unmarked)
    (unmarked / MARKER_NAME).unlink()
    # Without the marker it claims to be the released checkpoint: ChatTTS's hashes must match.
    with pytest.raises(ForgeError, match="sha256"):
        load_chat(unmarked)
    incomplete = tmp_path / "incomplete"
    shutil.copytree(tiny_ckpt, incomplete)
    (incomplete / "Vocos.safetensors").unlink()
    with pytest.raises(ForgeError, match="Vocos.safetensors is missing"):
        load_chat(incomplete)


def test_no_split_speaks_the_text_as_one_part(tiny_chat) -> None:
    res = reference_synthesize(tiny_chat, "你好。Hello there. 再见。", seed=0, split_text=False, **FAST)
    assert len(res.parts) == 1
    _check_audio(res.wav)
