"""Where a drop-in `Chat` (runtime.compat) loads from: ChatTTS's `device` as an onnxruntime
provider, an artifact folder or a version folder's chosen variant (`VARIANT_PREFERENCE`), and the
`coef` check against the artifact's DVAE coefficients.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pybase16384 as b14

from chattts_forge.artifact import ARTIFACT_JSON
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.runtime.compat_params import CompatArgumentError
from chattts_forge.runtime.pipeline import Pipeline
from chattts_forge.runtime.providers import resolve_provider

if TYPE_CHECKING:
    from chattts_forge.runtime.autotune import AutotuneSettings

VARIANT_PREFERENCE = {
    # int8-dynamic-kv8: int8-dynamic's weights with an INT8 KV cache (faster at batch, a quarter of the
    # cache memory), measured on CPU GroupQueryAttention only: not a CUDA preference.
    "cpu": ("int8-dynamic", "int8-dynamic-kv8", "auto", "fp32", "int8-static", "int4", "fp16"),
    "cuda": ("fp16", "fp32", "int8-dynamic", "auto", "int8-static", "int4"),
}
SOURCE_HINT = (
    "chattts_forge.compat runs a converted artifact: call load(source='custom', custom_path=DIR) with DIR "
    "an artifact folder (holding artifact.json) or a published version folder artifacts/<model>/<version>/"
)


@dataclass(frozen=True)
class LoadConfig:
    """What `Chat.load` opens once ChatTTS's arguments are mapped: the folder, the onnxruntime provider
    (resolved from ChatTTS's `device`), ChatTTS's `coef` (checked against the artifact's) and our extras."""

    path: Path
    provider: str = "cpu"
    coef: str | None = None
    variant: str | None = None
    threads: int | None = None
    engine: str = "auto"
    public_key: str | Path | None = None
    verify: str = "sha256"
    autotune: bool | AutotuneSettings | None = None


def provider_of(device: Any) -> str:
    """ChatTTS's `device` (None, a string or a torch.device) -> the onnxruntime provider (cpu or cuda).

    None picks CUDA when this onnxruntime can use it, as ChatTTS's `select_device` picks a GPU."""
    if device is None:
        return resolve_provider("auto")
    kind = re.split(r"[:\s]", str(device).strip().lower())[0]
    if kind not in VARIANT_PREFERENCE:
        raise CompatArgumentError(f"load: device={str(device)!r} is not supported (cpu or cuda)")
    return resolve_provider(kind)


def resolve_artifact(path: str | Path, variant: str | None, provider: str = "cpu") -> Path:
    """An artifact folder, or the chosen variant folder of a version folder (see the module docstring)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise BadInput(f"load: custom_path {folder} is not a folder")
    if (folder / ARTIFACT_JSON).is_file():
        if variant is not None and variant != folder.name:
            raise CompatArgumentError(f"load: variant={variant!r} given, but {folder} is one artifact")
        return folder
    present = sorted(p.name for p in folder.iterdir() if (p / ARTIFACT_JSON).is_file())
    if not present:
        raise ForgeError(f"load: {folder} holds no artifact (no {ARTIFACT_JSON} in it or in its subfolders)")
    if variant is not None:
        if variant not in present:
            raise CompatArgumentError(f"load: variant={variant!r} is not in {folder} (it has: {', '.join(present)})")
        return folder / variant
    for name in VARIANT_PREFERENCE[provider]:
        if name in present:
            return folder / name
    return folder / present[0]


def artifact_coef(pipe: Pipeline) -> str | None:
    """The artifact's DVAE coefficients as ChatTTS's `coef` string (pybase16384 of float32), if recorded."""
    path = pipe.artifact.file("dvae_coef")
    try:
        coef = json.loads(path.read_text(encoding="utf-8"))["dvae"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return b14.encode_to_string(np.asarray(coef, dtype=np.float32).tobytes())
