"""`verify_path(PATH)`: re-hash one published variant, or a whole `artifacts/` tree, against manifests.

For a variant folder: every file the manifest lists must exist with its size and sha256; no other
file may be there (besides manifest.json and SHA256SUMS); SHA256SUMS must agree with the manifest
and with manifest.json's own bytes. For a tree: every variant folder is checked, every file must
belong to a variant (or be index.json / README.md / .gitkeep / the lock, or be listed in its version
folder's manifest: routing.json, the phrase cache; publish.version_files), and index.json must be
exactly what the manifests say. A version folder (with its version manifest) can be verified alone. Each problem names the file; an empty problem list means verified.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.folder_files import list_files
from chattts_forge.integrity import SIGNATURE_NAME, sha256_file, sha256sums_text
from chattts_forge.publish.history import HISTORY_NAME, history_problems
from chattts_forge.publish.index import (
    INDEX_NAME,
    LOCK_NAME,
    STAGING_NAME,
    build_index,
    index_bytes,
    iter_variant_dirs,
)
from chattts_forge.publish.manifest import (
    MANIFEST_NAME,
    SUMS_NAME,
    load_manifest,
    manifest_file_problems,
    manifest_files,
    parse_sha256sums,
)
from chattts_forge.publish.version_files import is_version_manifest, verify_version
from chattts_forge.signing import load_public_key, verify_folder

PUBLIC_KEY_FILE = "signing-key.pub"  # publish.publish writes it beside the index
# Files allowed at the top of an artifacts tree besides the published variants.
ROOT_FILES = frozenset({INDEX_NAME, LOCK_NAME, "README.md", ".gitkeep", ".gitignore", PUBLIC_KEY_FILE})


@dataclass
class VerifyResult:
    variants: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    versions: list[Path] = field(default_factory=list)  # version folders whose own files were checked
    warnings: list[str] = field(default_factory=list)
    signatures: list[Path] = field(default_factory=list)  # folders whose model.sig verified

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.variants)


def verified_hashes(vdir: Path) -> dict[str, str]:
    """{file: sha256} of a variant folder whose manifest check just passed: the manifest's hashes are
    then the files' own, so the signature check need not read the files a second time."""
    hashes = {rel: e.sha256 for rel, e in manifest_files(load_manifest(vdir / MANIFEST_NAME)).items()}
    for name in (MANIFEST_NAME, SUMS_NAME):
        hashes[name] = sha256_file(vdir / name)
    return hashes


def check_signature(folder: Path, public_key: Path | None, result: VerifyResult | None = None,
                    checked: dict[str, str] | None = None) -> list[str]:
    """The folder's model.sig against `public_key`: [] when it verifies (or no key is given), else one
    problem naming the files that differ. `checked`: sha256s just verified (`verified_hashes`); the
    other files are hashed (without it, the library hashes the whole folder)."""
    if public_key is None:
        return []

    def hashes(root: Path, rels: list[str]) -> dict[str, str]:
        return {rel: checked[rel] if checked and rel in checked else sha256_file(root / rel) for rel in rels}

    try:
        verify_folder(folder, public_key, hashes=hashes if checked else None)
    except ForgeError as e:
        return [str(e)]
    if result is not None:
        result.signatures.append(folder)
    return []


def _variant_with_signature(vdir: Path, public_key: Path | None, result: VerifyResult,
                            check_location: bool) -> list[str]:
    problems = verify_variant(vdir, check_location=check_location)
    checked = verified_hashes(vdir) if public_key is not None and not problems else None
    return problems + check_signature(vdir, public_key, result, checked)


def verify_variant(vdir: Path, check_location: bool = False) -> list[str]:
    """Problems of one published variant folder, each starting with the offending file's path."""
    problems: list[str] = []
    try:
        actual = set(list_files(vdir))
    except ForgeError as e:
        return [str(e)]
    try:
        manifest = load_manifest(vdir / MANIFEST_NAME)
        listed = manifest_files(manifest)
    except ForgeError as e:
        return [str(e)]
    manifest_sha = sha256_file(vdir / MANIFEST_NAME)

    sums: dict[str, str] | None = None
    if SUMS_NAME not in actual:
        problems.append(f"{vdir / SUMS_NAME}: missing")
    else:
        try:
            sums = parse_sha256sums((vdir / SUMS_NAME).read_text(encoding="utf-8"), str(vdir / SUMS_NAME))
        except (ForgeError, UnicodeDecodeError) as e:
            problems.append(str(e) if isinstance(e, ForgeError) else f"{vdir / SUMS_NAME}: not text")
    if sums is not None:
        if sums.get(MANIFEST_NAME) != manifest_sha:
            problems.append(f"{vdir / MANIFEST_NAME}: changed (its sha256 does not match {SUMS_NAME})")
        want = {p: e.sha256 for p, e in listed.items()}
        want[MANIFEST_NAME] = sums.get(MANIFEST_NAME, "")
        for p in sorted(set(sums) | set(want)):
            if sums.get(p) != want.get(p):
                problems.append(f"{vdir / SUMS_NAME}: disagrees with {MANIFEST_NAME} about {p}")
                break
        else:
            # Publish writes one canonical form; any other byte (even whitespace) is a change.
            if (vdir / SUMS_NAME).read_bytes() != sha256sums_text(sums).encode("utf-8"):
                problems.append(f"{vdir / SUMS_NAME}: changed (not the file publish wrote)")

    problems += manifest_file_problems(vdir, listed, actual, {MANIFEST_NAME, SUMS_NAME, SIGNATURE_NAME})

    # A manifest moved to another folder is not the variant that folder claims to be.
    parts = (manifest.get("model"), manifest.get("version"), manifest.get("variant"))
    if check_location and (vdir.parent.parent.name, vdir.parent.name, vdir.name) != parts:
        problems.append(f"{vdir / MANIFEST_NAME}: names {'/'.join(map(str, parts))}, not this folder")
    return problems


def verify_tree(root: Path, public_key: Path | None = None) -> VerifyResult:
    result = VerifyResult()
    variants = iter_variant_dirs(root)
    result.variants = variants
    variant_set = set(variants)
    for vdir in variants:
        result.problems += _variant_with_signature(vdir, public_key, result, check_location=True)
    # A version folder's own files (routing.json, phrase cache) are listed in its version manifest.
    version_dirs = sorted({v.parent for v in variants if is_version_manifest(v.parent / MANIFEST_NAME)})
    for version_dir in version_dirs:
        result.problems += verify_version(version_dir)
        result.problems += check_signature(version_dir, public_key, result)
    result.versions = version_dirs
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_parts = here.relative_to(root).parts
        if rel_parts[:1] == (STAGING_NAME,):
            dirnames.clear()
            result.warnings.append(f"{here}: leftover of an interrupted publish (the next publish removes it)")
            continue
        if len(rel_parts) >= 3 and root.joinpath(*rel_parts[:3]) in variant_set:
            dirnames.clear()  # checked above
            continue
        dirnames.sort()
        for name in sorted(filenames):
            path = here / name
            if len(rel_parts) == 0 and name in ROOT_FILES:
                continue
            if len(rel_parts) == 2 and here in version_dirs:
                continue  # checked by verify_version
            if len(rel_parts) == 1 and name == HISTORY_NAME:
                continue  # checked below, with the index that names it
            if len(rel_parts) >= 3:
                result.problems.append(f"{root.joinpath(*rel_parts[:3]) / MANIFEST_NAME}: missing ({path} is unverifiable)")
            else:
                result.problems.append(f"{path}: extra file, not part of any published variant")
    index_path = root / INDEX_NAME
    if variants:
        if not index_path.is_file():
            result.problems.append(f"{index_path}: missing")
        else:
            try:
                want = index_bytes(build_index(root))
            except ForgeError as e:
                want = None
                result.problems.append(f"{index_path}: cannot be rebuilt from the manifests ({e})")
            if want is not None and index_path.read_bytes() != want:
                result.problems.append(f"{index_path}: does not match the published manifests")
        for model in sorted({v.parent.parent for v in variants}):
            result.problems += history_problems(model)
    return result


def verify_path(path: str | os.PathLike[str], public_key: str | os.PathLike[str] | None = None) -> VerifyResult:
    """Verify a variant folder (has manifest.json) or a tree of them (e.g. artifacts/); with
    `public_key` (PEM), every variant's and version's model.sig too."""
    path = Path(path)
    key = Path(public_key).expanduser() if public_key is not None else None
    if key is not None:
        load_public_key(key)  # a wrong key file is one error, not one per folder
    if not path.is_dir():
        raise BadInput(f"{path} is not a folder")
    if (path / MANIFEST_NAME).is_file() and is_version_manifest(path / MANIFEST_NAME):
        result = VerifyResult(versions=[path])
        result.variants = [p for p in sorted(path.iterdir()) if (p / MANIFEST_NAME).is_file()]
        for v in result.variants:
            result.problems += _variant_with_signature(v, key, result, check_location=True)
        result.problems += verify_version(path) + check_signature(path, key, result)
    elif (path / MANIFEST_NAME).is_file():
        result = VerifyResult(variants=[path])
        result.problems += _variant_with_signature(path, key, result, check_location=False)
    else:
        result = verify_tree(path, key)
        if not result.variants and not result.problems:
            raise NotFound(f"nothing published under {path} (no */*/*/{MANIFEST_NAME})")
        named = path / PUBLIC_KEY_FILE
        if key is not None and named.is_file() and named.read_bytes() != key.read_bytes():
            result.problems.append(f"{named}: another key than {key} (the tree names a key it was not signed with)")
    return result
