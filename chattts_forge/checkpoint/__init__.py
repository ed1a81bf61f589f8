"""ChatTTS checkpoints: the real layout, synthetic checkpoints, verification and resolution."""

from chattts_forge.checkpoint.layout import (
    ASSET_FILES,
    MARKER_NAME,
    Dims,
    load_dims,
    preset_dims,
    resolve_asset_dir,
)

__all__ = ["ASSET_FILES", "MARKER_NAME", "Dims", "load_dims", "preset_dims", "resolve_asset_dir"]
