"""chattts_forge.integrity on plain files: one comparison, one result type, one stat-keyed cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import chattts_forge.integrity as integrity
from chattts_forge.errors import ArtifactChanged, IntegrityError
from chattts_forge.integrity import (
    MISSING,
    SHA256,
    SIZE,
    RecordedFile,
    VerifiedHashCache,
    check_files,
    sha256_file,
)


def _records(tmp_path: Path) -> dict[str, RecordedFile]:
    files = {"a.bin": b"a" * 10, "b.bin": b"b" * 20, "c.bin": b"c" * 30}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: RecordedFile(name, len(data), hashlib.sha256(data).hexdigest(), "test.json")
            for name, data in files.items()}


def test_the_hasher_matches_hashlib_on_small_and_block_sized_files(tmp_path: Path) -> None:
    for size in (0, 1, 4 << 20, (4 << 20) + 3):
        f = tmp_path / f"f{size}"
        f.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        seen: list[int] = []
        assert sha256_file(f, on_block=seen.append) == hashlib.sha256(f.read_bytes()).hexdigest()
        assert sum(seen) == size


def test_check_raises_the_first_mismatch_or_collects_every_one(tmp_path: Path) -> None:
    expected = _records(tmp_path)
    assert check_files(tmp_path, expected, "full").ok
    (tmp_path / "a.bin").unlink()
    (tmp_path / "b.bin").write_bytes(b"x" * 21)
    (tmp_path / "c.bin").write_bytes(b"x" * 30)
    with pytest.raises(ArtifactChanged, match=r"a\.bin \(listed in test\.json\) is missing") as e:
        check_files(tmp_path, expected, "full")
    assert isinstance(e.value, IntegrityError)
    report = check_files(tmp_path, expected, "full", collect=True)
    assert [(m.rel, m.problem) for m in report.mismatches] == [("a.bin", MISSING), ("b.bin", SIZE), ("c.bin", SHA256)]
    assert report.hashed == ["c.bin"]  # a file of the wrong size is not read


def test_the_driver_side_of_the_cache_hashes_once_per_file_version(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "code.py"
    f.write_text("x = 1\n")
    hashed: list[str] = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p, *a, **k: (hashed.append(Path(p).name), real(p, *a, **k))[1])
    cache = VerifiedHashCache(tmp_path / "hashcache.json", max_entries=100)
    first = cache.sha256(f)
    cache.save()
    again = VerifiedHashCache(tmp_path / "hashcache.json", max_entries=100)
    assert again.sha256(f) == first == real(f) and hashed == ["code.py"]
    f.write_text("x = 2\n")  # a new version: hashed again
    assert again.sha256(f) == real(f) != first and hashed == ["code.py", "code.py"]
    # the runtime's question of the same cache: this stat was found with this sha256
    assert again.hit(f.stat(), real(f))
