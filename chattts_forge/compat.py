"""`import chattts_forge.compat as ChatTTS`: the drop-in ChatTTS 0.2.5 API on an artifact.

The implementation lives in `chattts_forge.runtime.compat` (torch-free); see its docstring.
"""

from chattts_forge.runtime.compat import (
    VARIANT_PREFERENCE,
    Chat,
    CompatArgumentError,
    Normalizer,
    resolve_artifact,
)

__all__ = ["VARIANT_PREFERENCE", "Chat", "CompatArgumentError", "Normalizer", "resolve_artifact"]
