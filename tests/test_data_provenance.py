"""tests/data is what its README says it is: every file listed with its sha256, and the released
ChatTTS files equal to the hashes ChatTTS itself ships (ChatTTS/res/sha256_map.json)."""

from __future__ import annotations

import re
from pathlib import Path

from chattts_forge.checkpoint.release import release_sha256_map
from chattts_forge.integrity import sha256_file

# tests/data path -> path inside the released ChatTTS asset folder
RELEASED = {
    "chattts-tokenizer/tokenizer.json": "tokenizer/tokenizer.json",
    "chattts-tokenizer/tokenizer_config.json": "tokenizer/tokenizer_config.json",
    "chattts-tokenizer/special_tokens_map.json": "tokenizer/special_tokens_map.json",
    "chattts-release/gpt-config.json": "gpt/config.json",
}


def _readme_table(data_dir: Path) -> dict[str, str]:
    text = (data_dir / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", text, flags=re.MULTILINE))


def test_readme_lists_every_file_with_its_sha256(data_dir: Path) -> None:
    table = _readme_table(data_dir)
    files = {p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*") if p.is_file() and p.name != "README.md"}
    assert set(table) == files
    for rel, digest in table.items():
        assert sha256_file(data_dir / rel) == digest, rel


def test_released_files_match_chattts_sha256_map(data_dir: Path) -> None:
    released, _origin = release_sha256_map()
    for rel, asset_path in RELEASED.items():
        assert sha256_file(data_dir / rel) == released[asset_path], rel


def test_speech_sets_are_complete(data_dir: Path) -> None:
    for lang in ("en", "zh"):
        folder = data_dir / "speech" / lang
        ids = [line.split("\t", 1)[0] for line in (folder / "transcripts.tsv").read_text(encoding="utf-8").splitlines() if line]
        assert ids == [f"{i:03d}" for i in range(1, 31)]
        assert sorted(p.stem for p in folder.glob("*.wav")) == ids


def test_voice_sets_are_complete(data_dir: Path) -> None:
    """Four Flite voices and slt's two damaged copies, ten sentences each, the same transcripts."""
    speech = data_dir / "speech"
    folders = [speech / "voices" / v for v in ("slt", "rms", "awb", "kal16")]
    folders += [speech / "degraded" / d for d in ("slt-noise10db", "slt-crush4bit")]
    expected = [f"{i:03d}" for i in range(1, 11)]
    transcripts = {(f / "transcripts.tsv").read_text(encoding="utf-8") for f in folders}
    assert len(transcripts) == 1
    assert [line.split("\t", 1)[0] for line in transcripts.pop().splitlines()] == expected
    for folder in folders:
        assert sorted(p.stem for p in folder.glob("*.wav")) == expected, folder
        assert (folder / "SOURCE.txt").is_file()
