"""artifact.json's `quantization.options` stays what it was for every method when the options became
one config type per method (issue 51): `tests/data/quantize_recorded_options.json` was recorded from
the union `QuantizeConfig` before (`python tests/test_quantize_recorded_options.py --record`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from chattts_forge.artifact import ArtifactMeta
from chattts_forge.quantize import QuantizeConfig
from chattts_forge.quantize.methods import open_method

RECORD = Path(__file__).parent / "data" / "quantize_recorded_options.json"
# Per method, option sets it reads (each valid before and after): defaults, every recorded option
# moved off its default, and the options the method resolves itself (per_channel, algorithm, ...).
CASES: dict[str, list[dict[str, Any]]] = {
    "dynamic": [{}, {"per_channel": True}, {"exclude": ["a*", "b"], "quantize_head": False, "seed": 3, "decoder": "fp32"},
                {"kv_cache": "int8", "calibration": "c"}, {"min_agreement": 0.9, "step_nodes": 4}],
    "static": [{}, {"per_channel": False}, {"calibrate_method": "percentile"},
               {"calibrate_method": "percentile", "percentile": 99.5}, {"weight_bits": 8}, {"smooth_alpha": 0.5},
               {"smooth": False}, {"calibrate_method": "entropy"},
               {"symmetric_activations": True, "activation_type": "int8"}, {"decoder": "int8-a8", "seed": 2}],
    "int4": [{}, {"block_size": 32}, {"algorithm": "gptq", "calibration": "c"}, {"calibration": "c"},
             {"calibration": "c", "kv_cache": "int8"}, {"accuracy_level": 0, "algorithm": "k_quant"},
             {"algorithm": "importance", "calibration": "c", "per_channel": True}],
    "auto": [{}, {"block_size": 32, "accuracy_level": 0}, {"calibration": "c", "gate": "g.toml", "quantize_head": False}],
}  # fmt: skip


def recorded() -> dict[str, list[dict[str, Any]]]:
    meta = ArtifactMeta(variant="fp32", components={})
    return {method: [open_method(QuantizeConfig(method, **options), Path("src"), meta).options_record().to_dict()
                     for options in cases] for method, cases in CASES.items()}


def test_every_method_records_its_options_as_before() -> None:
    # byte for byte: the keys' order too (QuantizationOptions.to_dict writes artifact.json's)
    assert json.dumps(recorded(), indent=1) + "\n" == RECORD.read_text(encoding="utf-8")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORD.write_text(json.dumps(recorded(), indent=1) + "\n", encoding="utf-8")
