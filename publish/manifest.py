"""The published variant's `manifest.json` and `SHA256SUMS` (schema documented in docs/manifest.md).

A published variant folder `artifacts/<model>/<version>/<variant>/` holds the artifact's own files
(copied byte for byte), `report.json` (the evaluation report that let it through, verbatim, so its
integrity seal can be checked again), `README.md` (the model card), `manifest.json` and
`SHA256SUMS`. The manifest lists every file except itself and SHA256SUMS; SHA256SUMS lists every
file except itself (manifest.json included), in `sha256sum -c` format (`sha256sums_text`, defined in
chattts_forge.integrity, which the runtime checks it with). `model.sig` signs all of them.

Everything here is a pure function of the artifact and its report: no wall clock (created_at is the
report's), so publishing the same inputs twice gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from chattts_forge import __version__
from chattts_forge.artifact import ARTIFACT_JSON, VOCODER, ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.evaluate.report_record import section_builtins
from chattts_forge.evaluate.report_schema import REPORT_NAME, SealedReport
from chattts_forge.folder_files import FileEntry
from chattts_forge.fsutil import resolve_inside
from chattts_forge.integrity import (
    MISSING,
    PUBLISHED_CARD,
    PUBLISHED_MANIFEST,
    PUBLISHED_NAMES,
    PUBLISHED_SUMS,
    UNRECORDED,
    RecordedFile,
    compare_files,
    sha256_file,
)
from chattts_forge.runtime.spoken import normalizer_identity

MANIFEST_SCHEMA = "chattts-forge/manifest/1"
MANIFEST_NAME = PUBLISHED_MANIFEST  # the runtime reads it back (chattts_forge.integrity)
SUMS_NAME = PUBLISHED_SUMS
CARD_NAME = PUBLISHED_CARD
REPORT_COPY_NAME = REPORT_NAME
# Names publish adds to a variant folder; an artifact carrying one of them is refused. model.sig (the
# OpenSSF Model Signing signature, chattts_forge.signing) is written last, over every other file, and
# so is in neither the manifest nor SHA256SUMS.
RESERVED_NAMES = PUBLISHED_NAMES

LICENSES: dict[str, dict[str, str]] = {
    "chattts_code": {
        "spdx": "AGPL-3.0-or-later",
        "what": "ChatTTS inference code (2noise/ChatTTS) the graphs were exported from",
        "url": "https://github.com/2noise/ChatTTS/blob/main/LICENSE",
    },
    "chattts_weights": {
        "spdx": "CC-BY-NC-4.0",
        "what": "ChatTTS model weights (2Noise/ChatTTS): non-commercial use only",
        "url": "https://creativecommons.org/licenses/by-nc/4.0/",
    },
    "toolchain": {
        "spdx": "AGPL-3.0-or-later",
        "what": "chattts-forge, the toolchain that built and published this artifact",
        "url": "",
    },
}

# Distributions whose versions every manifest names (from the artifact's own record when it has one).
MANIFEST_VERSIONS = ("torch", "chattts", "onnx", "onnxruntime", "onnxconverter-common", "wetext", "kaldifst")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def check_safe_name(kind: str, name: str) -> str:
    """Model, version and variant names become folder names: keep them plain."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or name in {".", ".."}:
        raise BadInput(f"invalid {kind} name {name!r}: use letters, digits, '.', '_', '+', '-'")
    return name


def component_precisions(meta: ArtifactMeta) -> dict[str, str]:
    """{component: precision}; the vocoder must be FP32 (the artifact contract)."""
    out: dict[str, str] = {}
    for name, comp in sorted(meta.components.items()):
        precision = comp.get("precision")
        if not isinstance(precision, str):
            raise BadInput(f"{ARTIFACT_JSON}: component {name!r} has no precision")
        out[name] = precision
    vocoders = [n for n in out if n.startswith(VOCODER)]
    if not vocoders:
        raise BadInput(f"{ARTIFACT_JSON}: no vocos component")
    for name in vocoders:
        if out[name].lower() not in {"fp32", "float32"}:
            raise BadInput(f"{ARTIFACT_JSON}: vocoder {name!r} is {out[name]}, it must stay fp32")
    return out


def component_opsets(meta: ArtifactMeta) -> dict[str, int | None]:
    return {name: comp.get("opset") for name, comp in sorted(meta.components.items())}


def source_checkpoint(meta: ArtifactMeta) -> dict[str, Any]:
    src = meta.source or {}
    kind = src.get("kind")
    if kind not in {"real", "synthetic"}:
        raise BadInput(f"{ARTIFACT_JSON}: source.kind must be 'real' or 'synthetic', not {kind!r}")
    out: dict[str, Any] = {"kind": kind}
    for key in ("preset", "seed"):
        if src.get(key) is not None:
            out[key] = src[key]
    hashes = src.get("hashes")
    if not isinstance(hashes, dict) or not hashes:
        raise BadInput(f"{ARTIFACT_JSON}: source.hashes (the checkpoint file hashes) is missing")
    out["hashes"] = dict(sorted(hashes.items()))
    return out


def source_fingerprint(source: dict[str, Any]) -> str:
    """One hash naming the source checkpoint: variants of one version share it."""
    ident = {"kind": source["kind"], "hashes": source["hashes"]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def default_model_name(meta: ArtifactMeta, source: dict[str, Any]) -> str:
    """`chattts` for a real checkpoint; synthetic ones say so in their name, so no one mistakes them."""
    base = str(meta.name or "chattts")
    if source["kind"] == "synthetic":
        tag = "synthetic"
        if "preset" in source:
            tag += f"-{source['preset']}"
        if "seed" in source:
            tag += f"-seed{source['seed']}"
        return check_safe_name("model", f"{base}-{tag}")
    return check_safe_name("model", base)


def _first(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


def calibration_corpus(quant: dict[str, Any] | None) -> dict[str, Any] | None:
    """The calibration corpus (name, sha256, samples) the quantize stage recorded, if any."""
    if not isinstance(quant, dict):
        return None
    calib = _first(quant, "calibration", "calibration_data", "calibration_corpus")
    if not isinstance(calib, dict):
        return None
    corpus = calib.get("corpus") if isinstance(calib.get("corpus"), dict) else calib
    name = _first(corpus, "name", "corpus_name", "corpus", "path", "file")
    used = calib.get("sentences")
    return {
        "name": Path(str(name)).name if name is not None else None,
        "sha256": _first(corpus, "sha256", "corpus_sha256"),
        # Recorded inputs per graph ({"gpt": 210, ...}) or one count, as the calibrate stage wrote them.
        "samples": _first(calib, "samples", "n_samples", "num_samples", "sample_count", "max_samples"),
        "sentences": used.get("used") if isinstance(used, dict) else used,
    }


def library_versions_of(meta: ArtifactMeta) -> dict[str, str | None]:
    """Versions the artifact was built with (its own record); publish-time versions fill any gap."""
    from chattts_forge.versions import library_versions

    recorded = meta.versions or {}
    now = library_versions(MANIFEST_VERSIONS)
    out: dict[str, str | None] = {}
    for name in MANIFEST_VERSIONS:
        out[name] = recorded.get(name) if name in recorded else now.get(name)
    for name, v in sorted(recorded.items()):
        out.setdefault(name, v)
    return out


def gate_section(report: SealedReport) -> dict[str, Any]:
    """The manifest's ``gate``: the sealed report's identity and the record's sections a reader of the
    manifest needs, encoded as the report holds them (so the bytes match the report's)."""
    record = report.record
    return {
        "passed": record.passed,
        "report": REPORT_COPY_NAME,
        "report_sha256": report.sha256,
        "report_schema": record.schema,
        "report_integrity": record.integrity,
        "evaluated_at": record.created_at,
        "thresholds": dict(record.gate.thresholds),
        "results": [section_builtins(check) for check in record.gate.checks],
        "headline": section_builtins(record.headline),
        "machine": section_builtins(record.machine),
        "corpus": section_builtins(record.corpus),
        "reference": section_builtins(record.reference),
        "notes": list(record.notes),
    }


def build_manifest_core(
    *,
    model: str,
    version: str,
    variant: str,
    meta: ArtifactMeta,
    report: SealedReport,
    regression: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest without its `files` list (which needs the card written first). `regression`: the
    build's comparison with the previous version (publish.regression), absent when none was made."""
    source = source_checkpoint(meta)
    quant = meta.quantization
    toolchain = meta.toolchain or {}
    return {
        "schema": MANIFEST_SCHEMA,
        "model": model,
        "version": version,
        "variant": variant,
        # The evaluation that certified these bytes; never the wall clock at publish time.
        "created_at": report.record.created_at,
        "precision": component_precisions(meta),
        "opset": component_opsets(meta),
        "source_checkpoint": source,
        "quantization": quant,
        "calibration_corpus": calibration_corpus(quant),
        "fp16": meta.fp16,
        "gate": gate_section(report),
        "versions": library_versions_of(meta),
        "toolchain": {
            "name": toolchain.get("name", "chattts-forge"),
            "version": toolchain.get("version"),
            "git_commit": toolchain.get("git_commit"),
            "published_with": __version__,
        },
        # what turns written text into the spoken text the runtime feeds this variant (runtime.spoken)
        "text_normalizer": normalizer_identity(),
        "licenses": LICENSES,
        **({"regression": regression} if regression is not None else {}),
    }


def finish_manifest(core: dict[str, Any], files: dict[str, FileEntry]) -> dict[str, Any]:
    manifest = dict(core)
    manifest["total_bytes"] = sum(f.bytes for f in files.values())
    manifest["files"] = [files[p].to_dict() for p in sorted(files)]
    return manifest


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def read_json_document(path: str | os.PathLike[str], what: str = "file") -> Any:
    """Parse a JSON file; missing, a folder, unreadable, not UTF-8 or not JSON: a one-line ForgeError."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"{path}: missing") from None
    except IsADirectoryError:
        raise ForgeError(f"{path}: is a folder, not a {what}") from None
    except OSError as e:
        raise BadInput(f"{path}: unreadable ({e.strerror})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise BadInput(f"{path}: not valid JSON ({str(e)[:200]})") from None


def load_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A variant's manifest.json, validated (schema; the files list; the keys the index reads)."""
    path = Path(path)
    manifest = read_json_document(path, "manifest")
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else None
        raise BadInput(f"{path}: unknown manifest schema {str(got)[:80]!r} (expected {MANIFEST_SCHEMA})")
    if not isinstance(manifest.get("files"), list):
        raise BadInput(f"{path}: manifest has no files list")
    check_file_entries(manifest["files"], path)
    check_manifest_fields(manifest, path)
    return manifest


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def check_file_entries(entries: Any, where: str | os.PathLike[str]) -> None:
    """A `files` list: [{"path": str, "bytes": int >= 0, "sha256": 64 hex}], paths unique."""
    if not isinstance(entries, list):
        raise BadInput(f"{where}: 'files' must be a list")
    seen: set[str] = set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise BadInput(f"{where}: files[{i}] is not an object")
        rel, size, sha = e.get("path"), e.get("bytes"), e.get("sha256")
        if not isinstance(rel, str) or not rel:
            raise BadInput(f"{where}: files[{i}].path must be a non-empty string")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadInput(f"{where}: files[{i}].bytes must be a whole number >= 0, got {str(size)[:40]!r}")
        if not isinstance(sha, str) or not _HEX64.match(sha):
            raise BadInput(f"{where}: files[{i}].sha256 must be 64 lowercase hex digits")
        if rel in seen:
            raise BadInput(f"{where}: files[{i}].path {rel!r} is listed twice")
        seen.add(rel)


def check_manifest_fields(manifest: dict[str, Any], where: str | os.PathLike[str]) -> None:
    """Types of the keys `index.json` is built from (model/version/variant names, gate, source)."""
    for key in ("model", "version", "variant", "created_at"):
        if not isinstance(manifest.get(key), str):
            raise BadInput(f"{where}: '{key}' must be a string")
    for key in ("gate", "source_checkpoint"):
        if not isinstance(manifest.get(key), dict):
            raise BadInput(f"{where}: '{key}' must be an object")
    source = manifest["source_checkpoint"]
    if not isinstance(source.get("kind"), str) or not isinstance(source.get("hashes"), dict):
        raise BadInput(f"{where}: source_checkpoint needs a 'kind' string and a 'hashes' object")
    if not isinstance(manifest["gate"].get("passed"), bool):
        raise BadInput(f"{where}: gate.passed must be true or false")
    if manifest["gate"].get("headline") is not None and not isinstance(manifest["gate"]["headline"], dict):
        raise BadInput(f"{where}: gate.headline must be an object")
    if not isinstance(manifest.get("precision"), dict):
        raise BadInput(f"{where}: 'precision' must be an object")
    total = manifest.get("total_bytes")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
        raise BadInput(f"{where}: total_bytes must be a whole number")


def manifest_file_problems(folder: Path, listed: dict[str, FileEntry], present: set[str], own: set[str]) -> list[str]:
    """Problems of a published folder's files against its manifest's list, each naming the file: a
    listed file missing or changed, then a file the list does not name (besides `own`: the manifest,
    its checksums, the signature), through the one file-against-record comparison
    (integrity.compare_files); a file is hashed only when its size matches."""
    problems: list[str] = []
    expected: dict[str, RecordedFile] = {}
    for rel, entry in sorted(listed.items()):
        try:
            resolve_inside(folder, rel, file=folder / MANIFEST_NAME, field=f"files[{rel!r}].path")
        except ForgeError as e:
            problems.append(str(e))
            continue
        expected[rel] = RecordedFile(rel, entry.bytes, entry.sha256, MANIFEST_NAME)
    sizes = {rel: (folder / rel).stat().st_size for rel in present - own if rel in expected or rel not in listed}
    digests = {rel: sha256_file(folder / rel) for rel, e in expected.items() if sizes.get(rel) == e.bytes}
    for m in compare_files(expected, sizes, digests, complete=True):
        if m.problem == MISSING:
            problems.append(f"{folder / m.rel}: missing")
        elif m.problem == UNRECORDED:
            problems.append(f"{folder / m.rel}: extra file not in {MANIFEST_NAME}")
        else:
            problems.append(f"{folder / m.rel}: changed (sha256/size differ from {MANIFEST_NAME})")
    return problems


def manifest_files(manifest: dict[str, Any]) -> dict[str, FileEntry]:
    check_file_entries(manifest.get("files"), MANIFEST_NAME)
    out: dict[str, FileEntry] = {}
    for e in manifest["files"]:
        out[e["path"]] = FileEntry(e["path"], int(e["bytes"]), e["sha256"])
    return out


_SUMS_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def parse_sha256sums(text: str, where: str = SUMS_NAME) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(text.rstrip("\n").split("\n"), 1):
        m = _SUMS_LINE.match(line)
        if not m:
            raise BadInput(f"{where}: line {n} is not '<sha256>  <path>'")
        out[m.group(2)] = m.group(1)
    return out
