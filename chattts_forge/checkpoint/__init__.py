"""ChatTTS checkpoints: the real layout, synthetic checkpoints, verification and resolution.

- `layout`: Dims, presets, the asset folder layout, `resolve_asset_dir` (asset folder, snapshot
  root or Hugging Face cache), `load_dims`.
- `synthesize.synthesize_checkpoint(out_dir, preset, seed)`: a synthetic checkpoint in the exact
  released layout (`inventory` lists its tensors as a pure function of Dims).
- `verify.verify_checkpoint(path)`: "real" / "synthetic" report, or a CheckpointError naming the
  broken file.
- `tokenizer`: the released ChatTTS tokenizer rebuilt from the bert-base-chinese vocabulary.

`synthesize_checkpoint` and `verify_checkpoint` are importable from here; they load lazily so that
importing the layout stays cheap.
"""

from __future__ import annotations

from typing import Any

from chattts_forge.checkpoint.layout import (
    ASSET_FILES,
    MARKER_NAME,
    Dims,
    load_dims,
    preset_dims,
    resolve_asset_dir,
)

__all__ = [
    "ASSET_FILES",
    "MARKER_NAME",
    "Dims",
    "load_dims",
    "preset_dims",
    "resolve_asset_dir",
    "synthesize_checkpoint",
    "verify_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name == "synthesize_checkpoint":
        # a cycle at the top: checkpoint.synthesize leads back to this module
        from chattts_forge.checkpoint.synthesize import synthesize_checkpoint

        return synthesize_checkpoint
    if name == "verify_checkpoint":
        # checkpoint.verify loads tqdm (33 ms): needed only here
        from chattts_forge.checkpoint.verify import verify_checkpoint

        return verify_checkpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
