"""Text corpora for calibration and evaluation: loading, validation, manifests and the split rule.

Layout (versioned; a new version is a new folder, old ones stay so recorded hashes stay reproducible)::

    calibration_data/corpora/v1/manifest.json
    calibration_data/corpora/v1/calibration/<name>.txt   # what `calibrate` records inputs from
    calibration_data/corpora/v1/evaluation/<name>.txt    # held out: fidelity and the quality gate

One sentence per line, UTF-8, blank lines ignored. A sentence goes to the evaluation split when the
first byte of sha256(sentence) is below 256/6 (about 1/6 of lines), so the split of a sentence never
depends on its file or position, and the two splits can never share a sentence.

Anyone can add a corpus: drop a `.txt` file anywhere and pass its path (or a folder of `.txt` files)
to `chattts-forge calibrate --corpus` / `measure_fidelity(corpus=...)`; `load_corpus` validates it
(missing, empty or not UTF-8 -> ForgeError). Built-in corpora are named `builtin:calibration`,
`builtin:evaluation` (every file of that split of the newest version), `v1:evaluation` (a version),
or `v1:calibration/zh_everyday` (one file). After editing built-in files run
`python -m chattts_forge.calibration_data.corpus` to rewrite the manifest (a test checks it).

Library::

    corpus = load_corpus("builtin:calibration")   # -> Corpus(name, sentences, sha256, files, ...)
    corpus.sha256      # sha256 of the normalised text ("\\n".join(sentences) + "\\n"), the corpus id
    build_manifest(version_dir) / write_manifest(version_dir) / check_manifest(version_dir)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.integrity import sha256_file

CORPORA_DIR = Path(__file__).resolve().parent / "corpora"
MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = "chattts-forge/corpora/1"
SPLITS = ("calibration", "evaluation")
# 1/6 of sentences are held out for evaluation (first sha256 byte < 43 ~ 16.8 %).
_EVAL_THRESHOLD = 43

# Language and purpose of the built-in files, by file stem (new files default to "unknown").
FILE_INFO: dict[str, tuple[str, str]] = {
    "zh_customer_service": ("zh", "customer service: orders, refunds, delivery, banking, telecom, travel, healthcare"),
    "zh_everyday": ("zh", "everyday conversation"),
    "zh_numbers_dates": ("zh", "numbers, amounts, dates, times, codes in Mandarin context"),
    "zh_phone_address": ("zh", "fictional phone numbers and addresses"),
    "zh_short_replies": ("zh", "short replies (1-6 characters)"),
    "zh_long_paragraphs": ("zh", "long paragraphs (several sentences; long-context decode)"),
    "en_customer_service": ("en", "customer service: orders, refunds, delivery, banking, telecom, travel, healthcare"),
    "en_everyday": ("en", "everyday conversation"),
    "en_numbers_addresses": ("en", "numbers, dates, fictional phone numbers and addresses"),
    "en_short_replies": ("en", "short replies"),
    "en_long_paragraphs": ("en", "long paragraphs (several sentences; long-context decode)"),
    "mixed_zh_en": ("zh-en", "code-switched Mandarin/English"),
}


@dataclass
class Corpus:
    """A validated list of sentences and where they came from."""

    name: str
    sentences: list[str]
    files: list[Path] = field(default_factory=list)
    language: str = "unknown"
    origins: list[int] = field(default_factory=list)  # index into `files` of each sentence (if known)
    root: Path | None = None  # what `files` are recorded relative to: the built-in corpora, the folder given


    @property
    def sha256(self) -> str:
        return hashlib.sha256(("\n".join(self.sentences) + "\n").encode("utf-8")).hexdigest()

    def recorded_files(self) -> list[str]:
        """`files` as records name them: relative to `root` (POSIX), else by file name, never by a path
        of the machine (a build records the same bytes wherever the checkout and the corpus sit)."""
        out = []
        for p in self.files:
            try:
                out.append(Path(p).resolve().relative_to(Path(self.root).resolve()).as_posix() if self.root
                           else Path(p).name)
            except ValueError:
                out.append(Path(p).name)
        return out

    def describe(self) -> dict[str, Any]:
        """What a manifest records about this corpus: its name, content hash and files (each with its
        sha256, keyed by file name)."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "sentences": len(self.sentences),
            "language": self.language,
            "files": self.recorded_files(),
            "file_sha256": {Path(f).name: sha256_file(f) for f in self.files},
        }


def split_of(sentence: str) -> str:
    """The split a sentence belongs to: a pure function of its text (see module docstring)."""
    first = hashlib.sha256(sentence.strip().encode("utf-8")).digest()[0]
    return "evaluation" if first < _EVAL_THRESHOLD else "calibration"


def read_sentences(path: str | Path) -> list[str]:
    """Sentences of one corpus file: stripped, blank lines dropped. ForgeError on any bad file."""
    path = Path(path)
    if not path.exists():
        raise NotFound(f"corpus file {path} does not exist")
    if not path.is_file():
        raise BadInput(f"corpus {path} is not a file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(f"corpus file {path} is unreadable: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ForgeError(f"corpus file {path} is not UTF-8 (bad byte at offset {e.start}, line {line})") from None
    sentences = [line.strip() for line in text.lstrip("\ufeff").splitlines()]
    sentences = [s for s in sentences if s]
    if not sentences:
        raise BadInput(f"corpus file {path} is empty (no non-blank lines)")
    return sentences


def latest_version(corpora_dir: Path = CORPORA_DIR) -> str:
    versions = sorted(
        (p.name for p in corpora_dir.iterdir() if p.is_dir() and p.name[:1] == "v" and p.name[1:].isdigit()),
        key=lambda v: int(v[1:]),
    )
    if not versions:
        raise ForgeError(f"no corpus versions under {corpora_dir}")
    return versions[-1]


def _language_of(paths: list[Path]) -> str:
    langs = {FILE_INFO.get(p.stem, ("unknown", ""))[0] for p in paths}
    return langs.pop() if len(langs) == 1 else "mixed"


def _builtin_files(spec: str) -> tuple[str, list[Path]]:
    """`builtin:SPLIT`, `vN:SPLIT` or `vN:SPLIT/stem` -> (name, files)."""
    prefix, _, rest = spec.partition(":")
    version = latest_version() if prefix == "builtin" else prefix
    split, _, stem = rest.partition("/")
    if split not in SPLITS:
        raise BadInput(f"unknown corpus split '{split}' in '{spec}'; use one of {', '.join(SPLITS)}")
    split_dir = CORPORA_DIR / version / split
    if not split_dir.is_dir():
        raise ForgeError(f"built-in corpus version '{version}' has no {split} split ({split_dir})")
    if stem:
        path = split_dir / f"{stem}.txt"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in split_dir.glob("*.txt")))
            raise NotFound(f"no built-in corpus '{stem}' in {version}/{split}; known: {known}")
        return f"{version}:{split}/{stem}", [path]
    return f"{version}:{split}", sorted(split_dir.glob("*.txt"))


def is_builtin_spec(spec: str) -> bool:
    prefix = spec.partition(":")[0]
    return ":" in spec and (prefix == "builtin" or (prefix[:1] == "v" and prefix[1:].isdigit()))


def load_corpus(spec: str | Path, max_sentences: int | None = None) -> Corpus:
    """Load a corpus from a built-in name, a `.txt` file or a folder of `.txt` files.

    Sentences keep file order (files sorted by name); duplicates are dropped (first kept).
    `max_sentences` truncates after de-duplication (deterministic). Raises ForgeError when the
    corpus is missing, empty or not UTF-8.
    """
    spec_str = str(spec)
    if isinstance(spec, str) and is_builtin_spec(spec):
        name, files = _builtin_files(spec)
        root = CORPORA_DIR
    else:
        path = Path(spec)
        if not path.exists():
            raise NotFound(f"corpus {path} does not exist (a .txt file, a folder of .txt files or builtin:SPLIT)")
        if path.is_dir():
            files = sorted(path.glob("*.txt"))
            if not files:
                raise ForgeError(f"corpus folder {path} contains no .txt files")
        else:
            files = [path]
        name = path.stem if path.is_file() else path.name
        root = path if path.is_dir() else path.parent
    if not files:
        raise BadInput(f"corpus '{spec_str}' has no files")
    seen: set[str] = set()
    sentences: list[str] = []
    origins: list[int] = []
    for i, f in enumerate(files):
        for s in read_sentences(f):
            if s not in seen:
                seen.add(s)
                sentences.append(s)
                origins.append(i)
    if max_sentences is not None:
        if max_sentences < 1:
            raise BadInput(f"max_sentences must be >= 1, got {max_sentences}")
        sentences, origins = sentences[:max_sentences], origins[:max_sentences]
    return Corpus(name=name, sentences=sentences, files=files, language=_language_of(files), origins=origins,
                  root=root)


def build_manifest(version_dir: Path) -> dict[str, Any]:
    """The manifest of one corpus version folder, computed from its files."""
    entries = []
    totals: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
    for split in SPLITS:
        for path in sorted((version_dir / split).glob("*.txt")):
            sentences = read_sentences(path)
            language, purpose = FILE_INFO.get(path.stem, ("unknown", "user-added corpus"))
            entries.append(
                {
                    "path": f"{split}/{path.name}",
                    "name": path.stem,
                    "split": split,
                    "language": language,
                    "purpose": purpose,
                    "lines": len(sentences),
                    "chars": sum(len(s) for s in sentences),
                    "sha256": sha256_file(path),
                }
            )
            totals[split][language] = totals[split].get(language, 0) + len(sentences)
    return {
        "schema": MANIFEST_SCHEMA,
        "version": version_dir.name,
        "format": "UTF-8, one sentence per line, blank lines ignored",
        "license": "written for chattts-forge (no third-party text); names, numbers and addresses are fictional",
        "split_rule": f"evaluation iff sha256(sentence)[0] < {_EVAL_THRESHOLD} (about 1/6), else calibration",
        "totals": totals,
        "files": entries,
    }


def write_manifest(version_dir: Path) -> Path:
    out = version_dir / MANIFEST_NAME
    atomic_write_json(out, build_manifest(version_dir))
    return out


def check_manifest(version_dir: Path) -> list[str]:
    """Differences between the stored manifest and the files (empty list: consistent)."""
    path = version_dir / MANIFEST_NAME
    if not path.is_file():
        return [f"{path} is missing"]
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        return [f"{path}: unreadable ({str(e)[:200]})"]
    listed = stored.get("files", []) if isinstance(stored, dict) else None
    if not isinstance(listed, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in listed):
        return [f"{path}: 'files' must be a list of {{path, ...}} entries"]
    fresh = build_manifest(version_dir)
    problems = []
    stored_files = {e["path"]: e for e in listed}
    fresh_files = {e["path"]: e for e in fresh["files"]}
    for p in sorted(set(stored_files) | set(fresh_files)):
        if p not in fresh_files:
            problems.append(f"{p}: listed in the manifest but missing")
        elif p not in stored_files:
            problems.append(f"{p}: not listed in the manifest")
        elif stored_files[p] != fresh_files[p]:
            problems.append(f"{p}: manifest entry is stale")
    return problems


def resplit(version_dir: Path) -> None:
    """Re-file every sentence of a version into the split `split_of` assigns (after edits)."""
    by_name: dict[str, list[str]] = {}
    for split in SPLITS:
        for path in sorted((version_dir / split).glob("*.txt")):
            by_name.setdefault(path.stem, []).extend(read_sentences(path))
    for name, sentences in by_name.items():
        for split in SPLITS:
            keep = [s for s in dict.fromkeys(sentences) if split_of(s) == split]
            target = version_dir / split / f"{name}.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            if keep:
                target.write_text("\n".join(keep) + "\n", encoding="utf-8")
            elif target.exists():
                target.unlink()


if __name__ == "__main__":  # maintenance: python -m chattts_forge.calibration_data.corpus [VERSION]
    import sys

    vdir = CORPORA_DIR / (sys.argv[1] if len(sys.argv) > 1 else latest_version())
    resplit(vdir)
    print(write_manifest(vdir))
