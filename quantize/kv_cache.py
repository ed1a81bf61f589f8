"""Scales of an INT8 key/value cache, calibrated from the recorded calibration set.

onnxruntime's CPU GroupQueryAttention (`kv_cache_bit_width=8`, `k_quant_type/v_quant_type`
PER_CHANNEL) stores each new key/value as `round(x / scale)` clipped to int8 and multiplies by the
scale when it reads the cache. The scales are constants of the graph, so they must cover every
value the cache will hold: per layer, per (kv head, channel), the largest |key| and |value| seen at
the valid (unmasked) past positions of every recorded GPT step of `chattts-forge calibrate` (the
plain graph's past inputs are exactly the cache contents, rotary applied to keys), divided by 127;
calibrate streams that maximum into its statistics (`calibration_data.statistics.KVStats`).
Per channel rather than per tensor because rotary keys have a few channels far larger than the
rest; a per-tensor scale would spend the 8 bits on them.

Library use::

    from chattts_forge.quantize.kv_cache import kv_cache_scales
    scales, record = kv_cache_scales("build/calib", num_layers=20)
    # scales["3.key"]: float32 [1, kv_heads, 1, head_dim]; record: what artifact.json stores
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.errors import BadInput, ForgeError

INT8_MAX = 127
# A channel never seen non-zero still needs a positive scale; values that small round to 0 anyway.
_MIN_SCALE = np.float32(1e-8)


def kv_cache_scales(
    calibration: str | os.PathLike[str] | CalibrationStore, num_layers: int, *, headroom: float = 1.0
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Per-channel int8 scales of every layer's keys and values, and their artifact.json record, from
    the KV statistics `calibrate` streamed (per-channel max |x| over every recorded decode step).

    `headroom` > 1 widens every range (values beyond the calibrated maximum are clipped by the op).
    """
    if not headroom >= 1.0:
        raise BadInput(f"KV cache scale headroom must be >= 1, got {headroom}")
    store = calibration if isinstance(calibration, CalibrationStore) else CalibrationStore(calibration)
    stats = store.statistics
    if not stats.kv_samples:
        raise BadInput(
            f"calibration {store.path} has no recorded GPT decode step with a past: cannot calibrate a KV cache "
            "(record with --decode-positions >= 1)"
        )
    absmax: dict[str, np.ndarray] = {}
    for i in range(num_layers):
        for kind in ("key", "value"):
            key = f"{i}.{kind}"
            if key not in stats.kv:
                raise ForgeError(f"calibration {store.path}: no statistics of past_key_values.{i}.{kind} "
                                 "(recorded for another model?)")
            absmax[key] = stats.kv[key].absmax
    scales = {
        k: np.maximum(m * np.float32(headroom) / INT8_MAX, _MIN_SCALE).astype(np.float32)[None, :, None, :]
        for k, m in absmax.items()
    }
    record = {
        "dtype": "int8",
        "quant_type": "PER_CHANNEL (one scale per layer, key/value, kv head and channel)",
        "scales": "max |x| / 127 over the valid past positions of the calibration set's recorded GPT steps "
                  "(streamed statistics)",
        "headroom": headroom,
        "calibration_samples": stats.kv_samples,
        "calibration_positions": stats.kv["0.key"].positions,
        "max_abs": {
            "key": float(max(float(v.max()) for k, v in absmax.items() if k.endswith("key"))),
            "value": float(max(float(v.max()) for k, v in absmax.items() if k.endswith("value"))),
        },
    }
    return scales, record
