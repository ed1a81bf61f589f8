"""Signing and verifying folders in the OpenSSF Model Signing format (the `model-signing` library).

A signed folder holds `model.sig` (a Sigstore bundle: a DSSE envelope over an in-toto statement that
lists every other file of the folder with its sha256, signed by an elliptic-curve key). It is what
`model_signing sign key DIR --private_key K --signature DIR/model.sig` writes, and
`model_signing verify key DIR --signature DIR/model.sig --public_key P` (the library's own command,
nothing of ours needed) checks it. Signing works offline: key-based, no transparency log.

Keys: `resolve_signing_key(path)` takes a PEM private key (EC P-256/384/521), or, given none, the
user's own pair in `$XDG_CONFIG_HOME/chattts-forge/` (else `~/.config/chattts-forge/`), made on first
use (`signing-key.pem`, mode 0600, and `signing-key.pub`).

`sign_folder(folder, key, ignore=...)` signs every file under `folder` except `model.sig` and the
`ignore`d sub-paths (a version folder ignores its variant folders, which carry their own signatures);
the ignored paths are recorded in the signature, so the library's verifier ignores them too.
ECDSA signatures are randomized, so two signings of the same bytes give two different `model.sig`s
(both valid); nothing else in the folder changes.

`verify_folder(folder, public_key)` checks a signature with the library (it re-hashes the folder);
`verify_folder(..., hashes=fn)` lets the caller supply the sha256 of each file (the runtime's
verified-hash cache), so a load checks the signature without hashing the artifact a second time.

The `model-signing` library (and the `pyOpenSSL` it imports) is the optional `sign` extra; it is
imported only here, inside the functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import atomic_write_bytes
from chattts_forge.integrity import SIGNATURE_NAME
from chattts_forge.log import get_logger

log = get_logger(__name__)

KEY_DIR_NAME = "chattts-forge"
PRIVATE_KEY_NAME = "signing-key.pem"
PUBLIC_KEY_NAME = "signing-key.pub"
# Paths the library's hasher skips by default (ignore_git_paths): a folder must not rely on them.
_GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")


def _require_library() -> Any:
    try:
        # model_signing: only when signing or verifying; 0.56 s to import
        import model_signing  # noqa: F401
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as e:
        raise ForgeError(
            f"signing and signature checks need the 'sign' extra ({e.name or e}): pip install 'chattts-forge[sign]'"
        ) from None
    return model_signing


def user_config_dir() -> Path:
    """$XDG_CONFIG_HOME/chattts-forge, else ~/.config/chattts-forge."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / KEY_DIR_NAME


@dataclass(frozen=True)
class SigningKey:
    private_path: Path
    public_pem: bytes  # SubjectPublicKeyInfo PEM

    @property
    def fingerprint(self) -> str:
        """sha256 of the public key PEM: the key hint the library writes into every signature."""
        return hashlib.sha256(self.public_pem).hexdigest()


def _public_pem(private_key: Any) -> bytes:
    # cryptography: only when a key is read; 30 ms to import
    from cryptography.hazmat.primitives import serialization

    return private_key.public_key().public_bytes(
        encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """A PEM private key (unencrypted EC P-256, P-384 or P-521: what the format supports)."""
    # cryptography: only when a key is read; 30 ms to import
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path).expanduser()
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise NotFound(f"signing key {path} does not exist") from None
    except TypeError:
        raise BadInput(f"signing key {path} is encrypted; give an unencrypted PEM key") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"signing key {path} is not a PEM private key ({str(e).splitlines()[0]})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in ("secp256r1", "secp384r1", "secp521r1"):
        raise ForgeError(f"signing key {path} is not an EC P-256/P-384/P-521 key (the only kind the OpenSSF "
                         "Model Signing key format takes)")
    return SigningKey(path, _public_pem(key))


def user_signing_key(key_dir: Path | None = None) -> SigningKey:
    """The user's own key pair, made once (private half 0600) and reused."""
    # cryptography: only when a key is read; 30 ms to import
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_dir = key_dir or user_config_dir()
    private_path = key_dir / PRIVATE_KEY_NAME
    if not private_path.is_file():
        key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        fd, tmp = tempfile.mkstemp(prefix=f".{PRIVATE_KEY_NAME}.", suffix=".tmp", dir=key_dir)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, private_path)  # fails if another process made the key first: then use that one
                log.info("made a signing key pair: %s (private, mode 0600) and %s", private_path,
                         key_dir / PUBLIC_KEY_NAME)
            except FileExistsError:
                pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    key = load_signing_key(private_path)
    public_path = key_dir / PUBLIC_KEY_NAME
    if not public_path.is_file() or public_path.read_bytes() != key.public_pem:
        atomic_write_bytes(public_path, key.public_pem)
    return key


def resolve_signing_key(path: str | os.PathLike[str] | None) -> SigningKey:
    """`path` (a PEM private key) or, when None, the user's own key pair."""
    return load_signing_key(path) if path is not None else user_signing_key()


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """A PEM public key's bytes (checked to be an EC key the format takes)."""
    # cryptography: only when a key is read; 30 ms to import
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
        key = serialization.load_pem_public_key(data)
    except FileNotFoundError:
        raise NotFound(f"public key {path} does not exist") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"public key {path} is not a PEM public key ({str(e).splitlines()[0]})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ForgeError(f"public key {path} is not an EC key (the OpenSSF Model Signing key format uses EC keys)")
    return data


def _hashing_config(model_signing: Any, ignore: Iterable[str]) -> Any:
    """The library's default file hashing (sha256 per file: what its CLI verifies with), ignoring
    model.sig and `ignore` (paths relative to the folder, as the library takes them)."""
    return model_signing.hashing.Config().set_ignored_paths(paths=[SIGNATURE_NAME, *ignore], ignore_git_paths=True)


def sign_folder(folder: str | os.PathLike[str], key: SigningKey, ignore: Iterable[str] = ()) -> Path:
    """Write `folder/model.sig` over every file of `folder` but `ignore` (relative paths); returns it."""
    model_signing = _require_library()
    folder = Path(folder)
    for name in _GIT_PATHS:
        if (folder / name).exists():
            raise ForgeError(f"{folder / name}: a git path inside a folder to sign (the format skips it, so it "
                             "would go unsigned)")
    signature = folder / SIGNATURE_NAME
    tmp = folder / f".{SIGNATURE_NAME}.{os.getpid()}.tmp"
    ignore = list(ignore)
    try:
        config = model_signing.signing.Config().use_elliptic_key_signer(private_key=key.private_path)
        # The library hashes the folder first and writes the signature after, so the temporary file
        # is not among what it signs; model.sig is ignored as the library's own CLI ignores it.
        config.set_hashing_config(_hashing_config(model_signing, ignore)).sign(folder, tmp)
        os.replace(tmp, signature)
    except ForgeError:
        raise
    except Exception as e:  # the library raises ValueError, OSError, cryptography errors
        raise ForgeError(f"signing {folder} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return signature


# The library's message is the repr of a list of strings, so its quotes may come escaped.
_DIFF = re.compile(r"Hash mismatch for \\*'([^'\\]+)\\*'|Extra files found in model \\*'[^'\\]*\\*': ([^,'\"\\\]]+)"
                   r"|Missing files in model \\*'[^'\\]*\\*': ([^,'\"\\\]]+)")


def _describe_mismatch(folder: Path, message: str) -> str:
    """The library's mismatch message as one line naming the files that differ (the first by path)."""
    changed, extra, missing = [], [], []
    for m in _DIFF.finditer(message):
        if m.group(1):
            changed.append(m.group(1))
        elif m.group(2):
            extra += [x.strip() for x in m.group(2).split(",")]
        else:
            missing += [x.strip() for x in m.group(3).split(",")]
    everything = sorted(changed + extra + missing)
    if not everything:
        return message.splitlines()[0] if message else "signature mismatch"
    first = everything[0]
    why = ("differs from the file that was signed" if first in changed else
           "not part of what was signed (extra file)" if first in extra else "signed, but missing")
    others = f" (also: {', '.join(everything[1:])})" if len(everything) > 1 else ""
    return f"{folder / first}: {why}{others}"


def verify_folder(
    folder: str | os.PathLike[str],
    public_key: str | os.PathLike[str],
    hashes: Callable[[Path, list[str]], dict[str, str]] | None = None,
) -> None:
    """Check `folder/model.sig` with `public_key`; a one-line ForgeError naming the file that differs
    (or saying the key or signature is wrong). `hashes(folder, rel_paths) -> {rel: sha256}`: where the
    file hashes come from (default: the library hashes the folder itself)."""
    model_signing = _require_library()
    folder = Path(folder)
    public_key = Path(public_key).expanduser()
    load_public_key(public_key)
    signature = folder / SIGNATURE_NAME
    if not signature.is_file():
        raise ForgeError(f"{signature}: missing (the folder is not signed)")
    config = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public_key)
    config.set_hashing_config(_cached_hashing(model_signing, hashes) if hashes is not None
                              else _hashing_config(model_signing, ()))
    try:
        config.verify(folder, signature)
    except ValueError as e:
        text = str(e)
        if "Signature mismatch" in text:
            raise ForgeError(_describe_mismatch(folder, text)) from None
        if "Key mismatch" in text:
            raise ForgeError(f"{signature}: signed with another key than {public_key}") from None
        raise BadInput(f"{signature}: not a valid signature ({text.splitlines()[0] if text else 'ValueError'})") from None
    except Exception as e:  # a broken bundle: JSON, protobuf or cryptography errors
        name = type(e).__name__
        if name == "InvalidSignature":
            raise ForgeError(f"{signature}: the signature does not verify with {public_key} (another key, or "
                             "the signature was changed)") from None
        raise BadInput(f"{signature}: unreadable signature ({name}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _cached_hashing(model_signing: Any, hashes: Callable[[Path, list[str]], dict[str, str]]) -> Any:
    """A hashing configuration of the library whose file digests come from `hashes` (the runtime's
    checked, cached sha256s) instead of a second read of every file. Its manifest is built exactly as
    the library's file serialization builds one: every file under the folder but the ignored paths."""
    # model_signing: only when signing or verifying; 0.56 s to import
    from model_signing import manifest as ms_manifest
    from model_signing._hashing import hashing as ms_hashing

    class CachedHashing(model_signing.hashing.Config):  # type: ignore[misc, name-defined]
        def hash(self, model_path: Any, *, files_to_hash: Any = None) -> Any:
            root = Path(model_path)
            ignored = [root / p for p in self._ignored_paths] + [root / p for p in _GIT_PATHS]
            ignored.append(root / SIGNATURE_NAME)
            rels: list[str] = []
            for path in sorted(root.rglob("*")):
                if path.is_symlink():
                    raise ValueError(f"Cannot use '{path}' because it is a symlink.")
                if path.is_file() and not any(path.is_relative_to(i) for i in ignored):
                    rels.append(path.relative_to(root).as_posix())
            digests = hashes(root, rels)
            items = [ms_manifest.FileManifestItem(path=Path(rel), digest=ms_hashing.Digest("sha256", bytes.fromhex(digests[rel])))
                     for rel in rels]
            return ms_manifest.Manifest(root.name, items, ms_manifest._FileSerialization("sha256", False, []))

    return CachedHashing()


def signature_key_hint(signature: str | os.PathLike[str]) -> str | None:
    """The public-key hint (sha256 of the signer's public key PEM) a signature carries, or None."""
    try:
        doc = json.loads(Path(signature).read_text(encoding="utf-8"))
        return str(doc["verificationMaterial"]["publicKey"]["hint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
