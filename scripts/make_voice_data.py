#!/usr/bin/env python3
"""Regenerate tests/data/speech/voices/ and tests/data/speech/degraded/ (the scorers' real speech).

    apt-get install -y flite      # CMU Flite 2.2 (Debian), voices slt, rms, awb, kal16 built in
    .venv/bin/python scripts/make_voice_data.py [--out tests/data/speech]

- voices/<voice>/NNN.wav: the ten sentences below spoken by each of four Flite voices (slt: US
  female; rms: US male; awb: Scottish male; kal16: US male, diphone), 16 kHz mono 16-bit PCM, and
  voices/<voice>/transcripts.tsv. Sentences 001-005 are the speaker references, 006-010 the
  held-out test utterances (tests/test_speaker_speech.py).
- degraded/<voice>-noise10db/NNN.wav: white Gaussian noise at 10 dB SNR (seed = sentence number),
  degraded/<voice>-crush4bit/NNN.wav: requantised to 4 bits (evaluate.degrade), for slt;
  the clean counterpart is voices/<voice>/ (tests/test_naturalness_speech.py).
- a SOURCE.txt in each folder (engine, versions, commands).

Flite's output is deterministic, so a rerun reproduces the files byte for byte on the same Flite
build; tests/data/README.md lists their sha256. CI never runs this (the data is committed).
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

VOICES = ("slt", "rms", "awb", "kal16")
DEGRADED_VOICES = ("slt",)
SAMPLE_RATE = 16000
# Written for this project (not taken from any corpus).
SENTENCES = (
    "The library opens at nine on weekdays and closes early on Sundays.",
    "Please remember to water the plants while I am away next week.",
    "A gentle breeze carried the smell of fresh bread down the street.",
    "Our meeting has been moved to the small room on the second floor.",
    "He parked the blue car behind the old barn near the river.",
    "The children laughed as the puppy chased its tail around the garden.",
    "Could you send me the report before lunch tomorrow, please?",
    "Heavy rain is expected tonight, so bring an umbrella to work.",
    "She finally found her keys under a pile of newspapers on the table.",
    "The train to the city leaves every twenty minutes from platform four.",
)


def flite_version() -> str:
    # `flite --version` prints its banner and exits 1; the Debian package version says more.
    out = subprocess.run(["flite", "--version"], capture_output=True, text=True).stdout
    banner = next((line.strip() for line in out.splitlines() if "version:" in line), "flite")
    deb = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "flite"], capture_output=True, text=True).stdout
    return f"{banner.removeprefix('version: ')}, Debian flite {deb or 'unknown'}"


def speak(voice: str, text: str, tmp: Path) -> np.ndarray:
    raw = tmp / "raw.wav"
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(raw)], check=True)
    audio, sr = sf.read(str(raw), dtype="int16")
    if sr != SAMPLE_RATE or audio.ndim != 1:
        raise SystemExit(f"flite voice {voice} wrote {sr} Hz, {audio.ndim} channel(s); expected 16 kHz mono")
    return audio


def write_folder(folder: Path, clips: dict[str, np.ndarray], source: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for utt_id, audio in clips.items():
        sf.write(str(folder / f"{utt_id}.wav"), audio, SAMPLE_RATE, subtype="PCM_16")
    lines = [f"{i:03d}\t{s}" for i, s in enumerate(SENTENCES, 1)]
    (folder / "transcripts.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "SOURCE.txt").write_text(source, encoding="utf-8")


def main() -> int:
    from chattts_forge.evaluate.degrade import bit_crush, white_noise

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/speech")
    args = parser.parse_args()
    if shutil.which("flite") is None:
        raise SystemExit("flite is not installed: apt-get install -y flite")
    version = flite_version()
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    common = (
        "Sentences: written for this project (scripts/make_voice_data.py), used verbatim.\n"
        "Speech: synthetic English speech (text-to-speech), not a human recording.\n"
        f"Engine: CMU Flite ({version}), Debian package flite, built-in voice, default settings.\n"
        f"Generated: {today} (UTC) by scripts/make_voice_data.py\n"
    )
    clean: dict[str, dict[str, np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for voice in VOICES:
            clips = {f"{i:03d}": speak(voice, s, Path(tmp)) for i, s in enumerate(SENTENCES, 1)}
            clean[voice] = clips
            write_folder(
                args.out / "voices" / voice,
                clips,
                f"Folder: voices/{voice}\nContent: 16 kHz mono 16-bit PCM NNN.wav, transcripts.tsv (NNN<TAB>sentence); "
                f"001-005 speaker references, 006-010 held-out tests.\n{common}"
                f'Call: flite -voice {voice} -t "sentence" -o NNN.wav\n',
            )
    for voice in DEGRADED_VOICES:
        for name, damage, how in (
            ("noise10db", lambda a, k: white_noise(a, snr_db=10.0, seed=k), "white_noise(audio, snr_db=10, seed=N)"),
            ("crush4bit", lambda a, k: bit_crush(a, bits=4), "bit_crush(audio, bits=4)"),
        ):
            clips = {}
            for utt_id, audio in clean[voice].items():
                damaged = damage(audio.astype(np.float32) / 32768.0, int(utt_id))
                clips[utt_id] = np.clip(np.round(damaged * 32768.0), -32768, 32767).astype(np.int16)
            write_folder(
                args.out / "degraded" / f"{voice}-{name}",
                clips,
                f"Folder: degraded/{voice}-{name}\nContent: voices/{voice}/NNN.wav (as float, /32768) through "
                f"chattts_forge.evaluate.degrade.{how}, back to 16-bit PCM (clipped, rounded).\n{common}",
            )
    print(f"wrote {len(VOICES)} voices and {2 * len(DEGRADED_VOICES)} degraded sets under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
