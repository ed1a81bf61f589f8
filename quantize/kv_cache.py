"""Scales of an INT8 key/value cache, calibrated from the recorded calibration set.

onnxruntime's CPU GroupQueryAttention (`kv_cache_bit_width=8`, `k_quant_type/v_quant_type`
PER_CHANNEL) stores each new key/value as `round(x / scale)` clipped to int8 and multiplies by the
scale when it reads the cache. The scales are constants of the graph, so they must cover every
value the cache will hold: per layer, per (kv head, channel), the largest |key| and |value| seen at
the valid (unmasked) past positions of every recorded GPT step of `chattts-forge calibrate` (the
plain graph's past inputs are exactly the cache contents, rotary applied to keys), divided by 127.
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
from chattts_forge.errors import ForgeError

INT8_MAX = 127
# A channel never seen non-zero still needs a positive scale; values that small round to 0 anyway.
_MIN_SCALE = np.float32(1e-8)


def kv_cache_scales(
    calibration: str | os.PathLike[str], num_layers: int, *, headroom: float = 1.0
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Per-channel int8 scales of every layer's keys and values, and their artifact.json record.

    `headroom` > 1 widens every range (values beyond the calibrated maximum are clipped by the op).
    """
    if not headroom >= 1.0:
        raise ForgeError(f"KV cache scale headroom must be >= 1, got {headroom}")
    store = CalibrationStore(calibration)
    absmax: dict[str, np.ndarray] = {}
    samples = positions = 0
    for sample in store.iter_samples("gpt"):
        mask = sample.get("attention_mask")
        first = sample.get("past_key_values.0.key")
        if mask is None or first is None or first.shape[2] == 0:
            continue  # a prefill: no past
        past = first.shape[2]
        valid = mask[:, :past].astype(bool)  # [B, P]: padded slots hold no real key
        if not valid.any():
            continue
        samples += 1
        positions += int(valid.sum())
        for i in range(num_layers):
            for kind in ("key", "value"):
                name = f"past_key_values.{i}.{kind}"
                if name not in sample:
                    raise ForgeError(f"calibration {store.path}: GPT sample lacks {name} (recorded for another model?)")
                x = np.abs(sample[name]).transpose(0, 2, 1, 3)[valid]  # [positions, kv_heads, head_dim]
                m = x.max(axis=0)
                key = f"{i}.{kind}"
                absmax[key] = m if key not in absmax else np.maximum(absmax[key], m)
    if not samples:
        raise ForgeError(
            f"calibration {store.path} has no recorded GPT decode step with a past: cannot calibrate a KV cache "
            "(record with --decode-positions >= 1)"
        )
    scales = {
        k: np.maximum(m * np.float32(headroom) / INT8_MAX, _MIN_SCALE).astype(np.float32)[None, :, None, :]
        for k, m in absmax.items()
    }
    record = {
        "dtype": "int8",
        "quant_type": "PER_CHANNEL (one scale per layer, key/value, kv head and channel)",
        "scales": "max |x| / 127 over the valid past positions of the calibration set's recorded GPT steps",
        "headroom": headroom,
        "calibration_samples": samples,
        "calibration_positions": positions,
        "max_abs": {
            "key": float(max(float(v.max()) for k, v in absmax.items() if k.endswith("key"))),
            "value": float(max(float(v.max()) for k, v in absmax.items() if k.endswith("value"))),
        },
    }
    return scales, record
