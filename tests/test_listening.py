"""The listening rules of the gate on real speech (CMU Flite voices, tests/data/speech): a copy of the
reference voice passes [speaker] and [naturalness]; another voice fails the speaker rules, the same
voice under 10 dB white noise fails the OVRL drop."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chattts_forge.evaluate.degrade import white_noise
from chattts_forge.evaluate.gate import judge, load_gate
from chattts_forge.evaluate.listening import listen_files, naturalness_section, speaker_section

IDS = ("001", "002")


def _voice(data_dir: Path, folder: str) -> dict[str, tuple[np.ndarray, int]]:
    out = {}
    for i in IDS:
        wav, sr = sf.read(str(data_dir / "speech" / folder / f"{i}.wav"), dtype="float32")
        out[i] = (wav, sr)
    return out


@pytest.fixture(scope="module")
def speech(data_dir: Path) -> dict[str, dict[str, tuple[np.ndarray, int]]]:
    ref = _voice(data_dir, "voices/slt")
    return {
        "reference": ref,
        # what a faithful variant gives: the same voice and sentence, barely changed
        "copy": {i: (white_noise(w, 50.0, seed=int(i)), sr) for i, (w, sr) in ref.items()},
        "other_voice": _voice(data_dir, "voices/rms"),
        "noisy": _voice(data_dir, "degraded/slt-noise10db"),
    }


def _listening_gate() -> dict:
    gate = load_gate(None)
    return {**gate, "rules": [r for r in gate["rules"] if r[0] in ("speaker", "naturalness")]}


def _verdict(variant: dict, reference: dict, mos: bool) -> tuple[dict, dict]:
    texts = dict.fromkeys(IDS, "")
    spk = speaker_section(variant, reference, texts, synthetic=False)
    metrics = {"similarity": spk["mean"], "similarity_worst": spk["min"], "ovrl_drop": 0.0}
    if mos:
        nat = naturalness_section(variant, reference, texts, synthetic=False)
        assert nat["measured"], nat
        metrics["ovrl_drop"] = nat["ovrl_drop"]
    return judge(_listening_gate(), metrics), metrics


def test_the_same_voice_passes(speech) -> None:
    verdict, metrics = _verdict(speech["copy"], speech["reference"], mos=True)
    assert verdict["passed"], verdict["failed"]
    assert metrics["similarity"] > 0.9 and abs(metrics["ovrl_drop"]) < 0.15  # 45 dB noise: 0.14, 35 dB: 0.30


def test_another_voice_fails_the_speaker_rules(speech) -> None:
    verdict, metrics = _verdict(speech["other_voice"], speech["reference"], mos=False)
    assert set(verdict["failed"]) == {"similarity", "similarity_worst"}
    assert metrics["similarity"] < 0.8


def test_noise_fails_the_naturalness_rule(speech) -> None:
    verdict, metrics = _verdict(speech["noisy"], speech["reference"], mos=True)
    assert "ovrl_drop" in verdict["failed"] and metrics["ovrl_drop"] > 0.3


def test_synthetic_sections_are_marked(speech) -> None:
    spk = speaker_section(speech["copy"], speech["reference"], dict.fromkeys(IDS, ""), synthetic=True)
    assert spk["synthetic_only"] and "random weights" in spk["reason"]
    nat = naturalness_section(speech["copy"], speech["reference"], dict.fromkeys(IDS, ""), synthetic=True)
    assert nat["synthetic_only"] and len(nat["sentences"]) == 1  # one sentence on random weights


def test_listen_files_are_reproducible_mp3(speech) -> None:
    texts = dict.fromkeys(IDS, "a sentence")
    section, files = listen_files(speech["copy"], speech["reference"], texts, "int8", 1)
    again = listen_files(speech["copy"], speech["reference"], texts, "int8", 1)[1]
    assert files == again  # MP3 and PNG bytes are a pure function of the audio
    assert set(files) == {"listen/001-artifact.mp3", "listen/001-reference.mp3", "listen/001-mel.png"}
    assert files["listen/001-mel.png"][:8] == b"\x89PNG\r\n\x1a\n"
    row = section["sentences"][0]
    assert row["reference"]["seconds"] == pytest.approx(speech["reference"]["001"][0].size / 16000)
    decoded, sr = sf.read(io.BytesIO(files["listen/001-reference.mp3"]), dtype="float32")
    assert sr == 16000 and abs(decoded.shape[0] - speech["reference"]["001"][0].size) < 4000
