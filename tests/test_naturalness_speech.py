"""DNSMOS on real speech: the same sentences (Flite slt, tests/data/speech) clean, with white noise at
10 dB SNR and requantised to 4 bits. Clean OVRL must be above both damaged copies (issue 25's
acceptance), the drop resolved by its paired bootstrap interval; noise shows up in BAK."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from chattts_forge.evaluate.cli import score as score_cmd
from chattts_forge.evaluate.naturalness import Dnsmos
from chattts_forge.evaluate.stats import paired_bootstrap_interval

IDS = ("006", "007", "008", "009", "010")
SETS = {"clean": "voices/slt", "noise10db": "degraded/slt-noise10db", "crush4bit": "degraded/slt-crush4bit"}


@pytest.fixture(scope="module")
def scores(data_dir: Path) -> dict[str, dict[str, list[float]]]:
    dnsmos = Dnsmos.load(threads=2)
    out: dict[str, dict[str, list[float]]] = {}
    for name, rel in SETS.items():
        per_utt = [dnsmos.score(*sf.read(data_dir / "speech" / rel / f"{i}.wav", dtype="float32")) for i in IDS]
        out[name] = {k: [s[k] for s in per_utt] for k in per_utt[0]}
    return out


@pytest.mark.parametrize("damaged", ["noise10db", "crush4bit"])
def test_clean_ovrl_is_above_the_damaged_copy(scores, damaged: str) -> None:
    clean, worse = scores["clean"], scores[damaged]
    assert np.mean(clean["ovrl"]) > np.mean(worse["ovrl"]), (clean["ovrl"], worse["ovrl"])
    lo, _hi = paired_bootstrap_interval(clean["ovrl"], worse["ovrl"])
    assert lo > 0, (damaged, lo)  # the drop is not an accident of these five sentences
    assert np.mean(clean["p808"]) > np.mean(worse["p808"])


def test_noise_is_heard_as_background_and_in_every_sentence(scores) -> None:
    clean, noisy = scores["clean"], scores["noise10db"]
    assert np.mean(noisy["bak"]) < np.mean(clean["bak"]) - 1.0  # BAK: background noise
    assert all(c > n for c, n in zip(clean["ovrl"], noisy["ovrl"], strict=True))


def test_score_cli_mos(data_dir: Path, tmp_path: Path, scores) -> None:
    folder = tmp_path / "clips"
    folder.mkdir()
    for i in IDS[:2]:
        shutil.copy(data_dir / "speech" / "voices" / "slt" / f"{i}.wav", folder / f"{i}.wav")
    out = tmp_path / "mos.json"
    res = CliRunner().invoke(score_cmd, ["--audio-dir", str(folder), "--mos", "--threads", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text(encoding="utf-8"))
    nat = data["naturalness"]
    assert nat["n"] == 2 and "P.808" in nat["model"]["model"]
    per_utt = {u["id"]: u["dnsmos"] for u in data["utterances"]}
    assert per_utt["006"]["ovrl"] == pytest.approx(scores["clean"]["ovrl"][0], abs=1e-4)
    assert nat["ovrl"]["mean"] == pytest.approx(np.mean(scores["clean"]["ovrl"][:2]), abs=1e-4)
    lo, hi = nat["ovrl"]["interval"]
    assert lo <= nat["ovrl"]["mean"] <= hi
    assert "dnsmos (n=2): sig=" in res.output and "006\tsig=" in res.output
