"""`score` on real speech (tests/data/speech): clean speech scores well, damaged speech measurably worse.

The clean sets are scored in full once per language (module fixtures); the degraded comparisons use a
few clips each, because Whisper base on Mandarin costs about 1-2 s per clip on two cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.asr import get_backend, load_audio, resample, whisper_base_model_dir
from chattts_forge.evaluate.cli import score as score_cmd
from chattts_forge.evaluate.degrade import DEGRADATIONS, time_stretch
from chattts_forge.evaluate.score import error_rates, read_transcripts, score_audio_dir, score_waveforms

ASR_THREADS = 2
DEGRADED_IDS = {"en": ["001", "004", "010", "021"], "zh": ["003", "020", "027"]}


@pytest.fixture(scope="module")
def backends():
    cache: dict[str, object] = {}

    def get(lang: str):
        if lang not in cache:
            cache[lang] = get_backend("faster-whisper", lang, threads=ASR_THREADS)
        return cache[lang]

    return get


@pytest.fixture(scope="module")
def clean_scores(data_dir: Path, backends):
    cache: dict[str, dict] = {}

    def get(lang: str) -> dict:
        if lang not in cache:
            folder = data_dir / "speech" / lang
            cache[lang] = score_audio_dir(folder, folder / "transcripts.tsv", lang=lang, backend=backends(lang))
        return cache[lang]

    return get


@pytest.mark.parametrize("lang, ceiling", [("en", 0.15), ("zh", 0.25)])
def test_clean_speech_scores_near_the_measured_figures(clean_scores, lang: str, ceiling: float) -> None:
    result = clean_scores(lang)
    corpus = result["corpus"]
    assert corpus["n"] == 30 and len(result["utterances"]) == 30
    # Measured on this data: tiny.en WER 0.06 raw / 0.03 normalised; base CER 0.16 raw / 0.12 normalised.
    assert corpus["error_rate"] < ceiling
    assert corpus["error_rate"] <= corpus[f"{corpus['metric']}_raw"]  # number normalisation only helps
    perfect = sum(u[corpus["metric"]] == 0.0 for u in result["utterances"])
    assert perfect >= 10, f"only {perfect} of 30 clean utterances transcribed without error"
    assert result["asr"]["backend"] == "faster-whisper" and result["lang"] == lang
    for u in result["utterances"]:
        assert set(u) >= {"id", "reference", "hypothesis", "wer", "cer"}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_degraded_speech_scores_measurably_worse(data_dir: Path, backends, clean_scores, lang: str) -> None:
    folder = data_dir / "speech" / lang
    ids = DEGRADED_IDS[lang]
    references = {k: v for k, v in read_transcripts(folder / "transcripts.tsv").items() if k in ids}
    clean_hyp = {u["id"]: u["hypothesis"] for u in clean_scores(lang)["utterances"] if u["id"] in ids}
    clean_rate = error_rates(references, clean_hyp, lang)[0]["error_rate"]
    audio = {k: load_audio(folder / f"{k}.wav") for k in ids}
    for name, damage in DEGRADATIONS.items():
        damaged = {k: (damage(a), 16000) for k, a in audio.items()}
        rate = score_waveforms(damaged, references, backends(lang), lang, progress=False)["corpus"]["error_rate"]
        assert rate > clean_rate + 0.1, f"{lang}/{name}: {rate:.3f} is not clearly worse than clean {clean_rate:.3f}"


def test_score_cli_on_unseen_ids_and_a_wrong_transcript(data_dir: Path, tmp_path: Path) -> None:
    """New file names and ids, one transcript that does not match its audio: only that one scores badly."""
    src = data_dir / "speech" / "en"
    refs = read_transcripts(src / "transcripts.tsv")
    audio_dir = tmp_path / "clips"
    audio_dir.mkdir()
    chosen = {"greeting": "001", "hold": "003", "library": "015"}
    lines = []
    for new_id, old_id in chosen.items():
        shutil.copy(src / f"{old_id}.wav", audio_dir / f"{new_id}.wav")
        lines.append(f"{new_id}\t{refs[old_id]}")
    # A 24 kHz float copy (what the runtime writes), to check resampling on the way in.
    wav16 = load_audio(src / "022.wav")
    sf.write(audio_dir / "tone.wav", resample(wav16, 16000, 24000), 24000, subtype="FLOAT")
    lines.append("tone\tPlease speak clearly after the tone.")
    lines.append("wrong\tThe quick brown fox jumps over a lazy sleeping dog.")
    shutil.copy(src / "024.wav", audio_dir / "wrong.wav")  # actually says "Your package was left at the front desk."
    transcripts = tmp_path / "mine.tsv"
    transcripts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "score.json"
    res = CliRunner().invoke(
        score_cmd,
        ["--audio-dir", str(audio_dir), "--transcripts", str(transcripts), "--json", str(out), "--threads", "2"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["lang"] == "en" and data["corpus"]["n"] == 5
    per_utt = {u["id"]: u for u in data["utterances"]}
    assert set(per_utt) == {"greeting", "hold", "library", "tone", "wrong"}
    assert per_utt["wrong"]["wer"] >= 0.7
    for utt_id in ("greeting", "hold", "library", "tone"):
        assert per_utt[utt_id]["wer"] <= 0.2, per_utt[utt_id]
    assert "corpus (en, n=5" in res.output
    assert data["corpus"]["wer"] > 0.1  # the wrong sentence drags the pooled figure up


def test_pocketsphinx_fallback_transcribes_english(data_dir: Path) -> None:
    folder = data_dir / "speech" / "en"
    refs = {k: v for k, v in read_transcripts(folder / "transcripts.tsv").items() if k in {"001", "030"}}
    result = score_audio_dir(folder, refs, asr="pocketsphinx", lang="en", progress=False)
    assert result["asr"]["backend"] == "pocketsphinx"
    # A weak recogniser, but far from random on clean speech.
    assert result["corpus"]["wer"] < 0.6
    with pytest.raises(ForgeError, match="only has an English"):
        get_backend("pocketsphinx", "zh")


def test_missing_models_and_backends_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="not a faster-whisper model folder"):
        get_backend("faster-whisper", "en", model_dir=tmp_path)
    with pytest.raises(ForgeError, match="does not exist"):
        get_backend("faster-whisper", "en", model_dir=tmp_path / "nope")
    with pytest.raises(ForgeError, match="unknown ASR backend"):
        get_backend("kaldi", "en")
    with pytest.raises(ForgeError, match="audio folder"):
        score_audio_dir(tmp_path / "nope", {"a": "hello"}, lang="en")
    (tmp_path / "t.tsv").write_text("001\thello\n", encoding="utf-8")
    with pytest.raises(ForgeError, match="audio file"):
        score_audio_dir(tmp_path, tmp_path / "t.tsv", lang="en")


def test_whisper_base_is_joined_atomically_and_checked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CHATTTS_FORGE_CACHE", str(tmp_path))
    folder = whisper_base_model_dir()
    assert folder == tmp_path / "asr" / "whisper-base"
    assert {p.name for p in folder.iterdir()} == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt", "joined.json"}
    assert json.loads((folder / "joined.json").read_text())["bytes"] == (folder / "model.bin").stat().st_size
    assert not [p for p in (tmp_path / "asr").iterdir() if p.name.endswith(".partial")]
    # A truncated cache is noticed and rebuilt.
    with open(folder / "model.bin", "r+b") as f:
        f.truncate(1000)
    assert whisper_base_model_dir() == folder
    assert (folder / "model.bin").stat().st_size == json.loads((folder / "joined.json").read_text())["bytes"]


def test_resample_and_time_stretch_lengths() -> None:
    tone = np.sin(2 * np.pi * 440 * np.arange(24000) / 24000).astype(np.float32)
    down = resample(tone, 24000, 16000)
    assert down.shape == (16000,)
    spectrum = np.abs(np.fft.rfft(down))
    assert abs(np.argmax(spectrum) - 440) <= 1  # 1 Hz bins: the tone stays at 440 Hz
    stretched = time_stretch(down, 2.0)
    assert abs(len(stretched) - 8000) <= 256


def test_intelligibility_delta_against_the_reference_audio(data_dir: Path) -> None:
    """The evaluate stage's WER delta: an 'artifact' whose audio is noisier than the reference's."""
    from chattts_forge.evaluate.degrade import white_noise
    from chattts_forge.evaluate.evaluate import score_intelligibility

    folder = data_dir / "speech" / "en"
    refs = read_transcripts(folder / "transcripts.tsv")
    chosen = ["003", "030"]
    sentences = [refs[k] for k in chosen]
    clean = {f"{i + 1:03d}": (load_audio(folder / f"{k}.wav"), 16000) for i, k in enumerate(chosen)}
    noisy = {k: (white_noise(a, snr_db=-5.0), sr) for k, (a, sr) in clean.items()}
    same = score_intelligibility(sentences, {"artifact": clean, "reference": clean}, "faster-whisper", None, 2, False)
    assert same["measured"] and same["wer_delta"] == 0.0 and "cer_delta" not in same
    worse = score_intelligibility(sentences, {"artifact": noisy, "reference": clean}, "faster-whisper", None, 2, False)
    assert worse["wer_delta"] > 0.3 and worse["reference_wer"] == same["wer"]
    assert set(worse["languages"]["en"]["variants"]) == {"artifact", "reference"}
    # The build's shared reference run: the reference's audio transcribed once (score_languages), then
    # only the artifact's; the same figures as scoring both together.
    from chattts_forge.evaluate.evaluate import score_languages

    once = score_languages(sentences, {"reference": clean}, "faster-whisper", None, 2, False)
    shared = score_intelligibility(sentences, {"artifact": noisy}, "faster-whisper", None, 2, False,
                                   reference_scores=once)
    assert (shared["wer"], shared["reference_wer"], shared["wer_delta"]) == (
        worse["wer"], worse["reference_wer"], worse["wer_delta"])
    hyps = {v: [u.get("hypothesis") for u in r["utterances"]] for v, r in worse["languages"]["en"]["variants"].items()}
    assert {v: [u.get("hypothesis") for u in r["utterances"]]
            for v, r in shared["languages"]["en"]["variants"].items()} == hyps
