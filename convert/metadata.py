"""artifact.json, ONNX metadata_props and the support files of an artifact folder.

See docs/artifact-format.md (the contract every later stage reads).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from chattts_forge import __version__
from chattts_forge.artifact import SUPPORT_FILES, ArtifactMeta
from chattts_forge.checkpoint.layout import ASSET_FILES, Dims, read_marker
from chattts_forge.convert.components import ComponentSpec
from chattts_forge.errors import ForgeError
from chattts_forge.folder_files import file_record
from chattts_forge.fsutil import portable_path
from chattts_forge.gate import stream_threshold_db
from chattts_forge.integrity import sha256_file
from chattts_forge.versions import build_timestamp, library_versions, toolchain_info

# Special tokens recorded for the runtime (ChatTTS's tokenizer and Speaker use them).
SPECIAL_TOKENS = {
    "spk_emb": "[spk_emb]",
    "empty_spk": "[empty_spk]",
    "Stts": "[Stts]",
    "Ptts": "[Ptts]",
    "Sbreak": "[Sbreak]",
    "Pbreak": "[Pbreak]",
    "break_0": "[break_0]",
    "Ebreak": "[Ebreak]",
}


def metadata_props(spec: ComponentSpec, dims: Dims, precision: str, converter: str) -> dict[str, str]:
    return {
        "component": spec.name,
        "precision": precision,
        "sample_rate": str(dims.sample_rate),
        "hop_length": str(dims.hop_length),
        "num_vq": str(dims.num_vq),
        "n_mels": str(dims.n_mels),
        "hidden_size": str(dims.hidden_size),
        "num_hidden_layers": str(dims.num_hidden_layers),
        "num_audio_tokens": str(dims.num_audio_tokens),
        "num_text_tokens": str(dims.num_text_tokens),
        "converter": converter,
        "chattts_forge_version": __version__,
    }


def io_description(spec: ComponentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def one(io: Any) -> dict[str, Any]:
        return {"name": io.name, "shape": list(io.shape), "dtype": io.dtype}

    return [one(i) for i in spec.inputs], [one(o) for o in spec.outputs]


def special_tokens(tokenizer_json: Path, dims: Dims) -> dict[str, int]:
    # tokenizers: only when a tokenizer is read; 6 ms to import
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    out: dict[str, int] = {}
    for key, token in SPECIAL_TOKENS.items():
        idx = tok.token_to_id(token)
        if idx is None:
            raise ForgeError(f"{tokenizer_json}: special token {token} is missing")
        out[key] = int(idx)
    out["eos_code"] = dims.eos_token
    return out


def source_record(asset_dir: Path, artifact_dir: Path) -> dict[str, Any]:
    """The checkpoint an artifact was converted from; `asset_dir` is recorded relative to `artifact_dir`."""
    marker = read_marker(asset_dir)
    hashes = {rel: sha256_file(asset_dir / rel) for rel in ASSET_FILES if (asset_dir / rel).is_file()}
    rec: dict[str, Any] = {"kind": "synthetic" if marker else "real", "asset_dir": portable_path(asset_dir, artifact_dir)}
    if marker:
        rec["preset"] = marker.get("preset")
        rec["seed"] = marker.get("seed")
    rec["hashes"] = hashes
    return rec


def write_support_files(out_dir: Path, asset_dir: Path, chat: Any) -> dict[str, dict[str, Any]]:
    """tokenizer.json, speaker_stats.npy, dvae_coef.json, homophones_map.json; returns the `files` map
    ({key: {"file", "bytes", "sha256"}}: what the runtime checks each file against before using it)."""
    # ChatTTS: the PyTorch reference only; 7.9 s to import
    import ChatTTS

    shutil.copyfile(asset_dir / "tokenizer" / "tokenizer.json", out_dir / SUPPORT_FILES["tokenizer"])
    std = chat.speaker.std.detach().cpu().numpy().astype(np.float16)
    mean = chat.speaker.mean.detach().cpu().numpy().astype(np.float16)
    np.save(out_dir / SUPPORT_FILES["speaker_stats"], np.stack([std, mean]))
    coef = {
        "decoder": [float(x) for x in chat.decoder.coef.detach().cpu().numpy().reshape(-1)],
        "dvae": [float(x) for x in chat.dvae.coef.detach().cpu().numpy().reshape(-1)],
    }
    (out_dir / SUPPORT_FILES["dvae_coef"]).write_text(json.dumps(coef) + "\n", encoding="utf-8")
    homophones = Path(ChatTTS.__file__).parent / "res" / "homophones_map.json"
    shutil.copyfile(homophones, out_dir / SUPPORT_FILES["homophones"])
    return {key: file_record(out_dir, name) for key, name in SUPPORT_FILES.items()}


def write_artifact_json(
    out_dir: Path,
    *,
    variant: str,
    dims: Dims,
    tokens: dict[str, int],
    components: dict[str, dict[str, Any]],
    files: dict[str, dict[str, Any]],
    source: dict[str, Any],
    fp16: dict[str, Any] | None,
    threads: int | None = 2,
) -> ArtifactMeta:
    """Write `out_dir/artifact.json` once, with the stream look-ahead measured on the finished graphs
    (runtime.stream_lookahead, against the shipped gate's seam threshold)."""
    # runtime.stream_lookahead loads soundfile (12 ms): needed only here
    from chattts_forge.runtime.stream_lookahead import measure_artifact

    meta = ArtifactMeta(
        name="chattts",
        variant=variant,
        dims=dims.to_dict(),
        audio={
            "sample_rate": dims.sample_rate,
            "hop_length": dims.hop_length,
            "n_mels": dims.n_mels,
            "num_vq": dims.num_vq,
        },
        tokens=tokens,
        components=components,
        files=files,
        source=source,
        fp16=fp16,
        quantization=None,
        versions=library_versions(),
        toolchain=toolchain_info(),
        created_at=build_timestamp(),
    )
    meta.streaming = measure_artifact(out_dir, meta, threshold_db=stream_threshold_db(), threads=threads)
    meta.write(out_dir)
    return meta
