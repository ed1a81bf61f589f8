"""`chattts-forge synth`: outputs, batch files, streaming, and one-line errors with exit code 2."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from chattts_forge.cli import main


def synth(*args: str):
    return CliRunner().invoke(main, ["synth", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def art(tiny_artifacts) -> str:
    return str(tiny_artifacts["fp32"])


def test_synth_writes_wav_and_codes(art, tmp_path):
    out, codes = tmp_path / "a.wav", tmp_path / "c.npy"
    r = synth("--artifact", art, "--text", "你好，世界。", "--out", str(out), "--seed", "1", "--no-refine",
              "--max-new-token", "25", "--min-new-token", "25", "--codes-out", str(codes), "--threads", "1")
    assert r.exit_code == 0, r.output
    wav, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and sf.info(out).subtype == "FLOAT" and wav.ndim == 1
    c = np.load(codes)
    assert c.shape == (25, 4) and c.dtype == np.int64
    assert len(wav) == 256 * (2 * 25 - 1)
    # same seed, same codes; the library gives the same result
    r2 = synth("--artifact", art, "--text", "你好，世界。", "--out", str(tmp_path / "b.wav"), "--seed", "1",
               "--no-refine", "--max-new-token", "25", "--min-new-token", "25", "--codes-out", str(tmp_path / "d.npy"))
    assert r2.exit_code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "d.npy"), c)


def test_the_library_config_writes_what_the_command_writes(art, tmp_path):
    """`synth` maps its options onto a SynthConfig: the library call with the same knobs writes the same
    samples and codes (float32, and 16-bit PCM that Python's `wave` reads: round(x * 32768))."""
    import wave
    from pathlib import Path

    from chattts_forge.runtime.synth import SynthConfig, synthesize_to_files

    r = synth("--artifact", art, "--text", "你好。", "--out", str(tmp_path / "cli.wav"), "--seed", "3", "--no-refine",
              "--max-new-token", "20", "--codes-out", str(tmp_path / "cli.npy"), "--threads", "1")
    assert r.exit_code == 0, r.output
    synthesize_to_files(SynthConfig(artifact=Path(art), out=tmp_path / "lib.wav", text="你好。", seed=3, refine=False,
                                    max_new_token=20, codes_out=tmp_path / "lib.npy", threads=1))
    floats = sf.read(tmp_path / "cli.wav", dtype="float32")[0]
    np.testing.assert_array_equal(sf.read(tmp_path / "lib.wav", dtype="float32")[0], floats)
    np.testing.assert_array_equal(np.load(tmp_path / "lib.npy"), np.load(tmp_path / "cli.npy"))
    for stream in ([], ["--stream"]):
        r = synth("--artifact", art, "--text", "你好。", "--out", str(tmp_path / "p16.wav"), "--seed", "3",
                  "--no-refine", "--max-new-token", "20", "--threads", "1", "--sample-format", "pcm16", *stream)
        assert r.exit_code == 0, r.output
        with wave.open(str(tmp_path / "p16.wav"), "rb") as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        want = np.clip(np.rint(floats.astype(np.float64) * 32768), -32768, 32767)
        assert len(pcm) == len(floats)
        assert np.max(np.abs(pcm - want)) <= (1 if stream else 0)  # a stream differs from a whole decode by ~1e-6


def _phrases(tmp_path):
    path = tmp_path / "phrases.txt"
    path.write_text("你好。\n", encoding="utf-8")
    return path


def test_batch_file_and_stream(art, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("你好。\n\nHello there.\n", encoding="utf-8")
    r = synth("--artifact", art, "--batch-file", str(lines), "--out", str(tmp_path / "out.wav"), "--seed", "0",
              "--no-refine", "--max-new-token", "30", "--min-new-token", "30", "--codes-out", str(tmp_path / "c.npy"))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.glob("out_*.wav")) == ["out_000.wav", "out_001.wav"]
    assert np.load(tmp_path / "c_001.npy").shape == (30, 4)
    folder = tmp_path / "streamed"
    folder.mkdir()
    r = synth("--artifact", art, "--batch-file", str(lines), "--out", str(folder), "--seed", "0", "--no-refine",
              "--max-new-token", "30", "--min-new-token", "30", "--stream", "--stream-batch", "8", "--batch-size", "1",
              "--codes-out", str(folder))
    assert r.exit_code == 0, r.output
    for i in range(2):
        a, _ = sf.read(folder / f"{i:03d}.wav", dtype="float32")
        b, _ = sf.read(tmp_path / f"out_{i:03d}.wav", dtype="float32")
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-5
        np.testing.assert_array_equal(np.load(folder / f"{i:03d}.npy"), np.load(tmp_path / f"c_{i:03d}.npy"))
    assert not list(folder.glob(".*tmp"))


def _error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--text", ""], "empty"),
        (["--text", "   "], "empty"),
        (["--text", "!!! ???"], "normalises to nothing"),
        (["--text", "很长的句子。" * 700, "--max-new-token", "2048"], "more than the 4096"),
        (["--text", "你好", "--provider", "tpu"], "unknown provider"),
        (["--text", "你好", "--provider", "cuda"], "cuda"),
        (["--text", "你好", "--temperature", "0"], "temperature"),
        (["--text", "你好", "--min-new-token", "5", "--max-new-token", "3"], "min-new-token"),
        (["--text", "你好", "--speaker", "garbage"], "speaker"),
        (["--batch-file", "/nonexistent/lines.txt"], "does not exist"),
        (["--text", "你好", "--batch-size", "0"], "batch-size"),
        ([], "exactly one of --text or --batch-file"),
    ],
)
def test_errors_are_one_line(art, tmp_path, args, message):
    out = tmp_path / "x.wav"
    r = CliRunner().invoke(main, ["synth", "--artifact", art, "--out", str(out), "--no-refine", *args])
    assert message in _error(r)
    assert not out.exists()


def test_missing_and_mismatched_artifact(art, tmp_path):
    broken = tmp_path / "art"
    shutil.copytree(art, broken)
    (broken / "vocos.onnx").unlink()
    r = CliRunner().invoke(main, ["synth", "--artifact", str(broken), "--text", "你好", "--out", str(tmp_path / "x.wav")])
    assert "missing" in _error(r)
    shutil.copy(art + "/vocos.onnx", broken / "vocos.onnx")
    (broken / "tokenizer.json").write_text("{}")
    r = CliRunner().invoke(main, ["synth", "--artifact", str(broken), "--text", "你好", "--out", str(tmp_path / "x.wav")])
    assert "tokenizer" in _error(r)
    r = CliRunner().invoke(main, ["synth", "--artifact", str(tmp_path / "none"), "--text", "你好", "--out", "x.wav"])
    assert "does not exist" in _error(r)


def test_speaker_random_out_and_from_file(art, tmp_path):
    from chattts_forge.runtime.chattts_speaker import decode_speaker

    spk_file = tmp_path / "spk.txt"
    common = ["--artifact", art, "--text", "你好。", "--seed", "2", "--no-refine", "--max-new-token", "12",
              "--min-new-token", "12"]
    r = synth(*common, "--speaker", "random", "--speaker-out", str(spk_file), "--out", str(tmp_path / "a.wav"),
              "--codes-out", str(tmp_path / "a.npy"))
    assert r.exit_code == 0, r.output
    assert decode_speaker(spk_file.read_text().strip()).shape == (64,)  # the tiny model's hidden size
    r = synth(*common, "--speaker", str(spk_file), "--out", str(tmp_path / "b.wav"), "--codes-out", str(tmp_path / "b.npy"))
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    r = synth(*common, "--out", str(tmp_path / "c.wav"), "--codes-out", str(tmp_path / "c.npy"))
    assert not np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "c.npy"))  # the speaker matters
