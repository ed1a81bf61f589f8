"""The quantization method registry (quantize/methods.py): which class a request gets and what it
says about itself. No graph is quantized here (test_quantize*.py run the methods)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_forge.artifact import QUANTIZE_METHODS, ArtifactMeta
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.quantize import QuantizeConfig
from chattts_forge.quantize.config import METHOD_CONFIGS, AutoOptions, FallbackOptions
from chattts_forge.quantize.fast_gpt import QUANTIZE_METHODS as REBUILT
from chattts_forge.quantize.fast_gpt import fast_gpt_quantizer
from chattts_forge.quantize.methods import (
    METHODS,
    Auto,
    DynamicInt8,
    Int4,
    LegacyStaticInt8,
    StaticInt8,
    method_class,
    open_method,
)

SRC = Path("unused-fp32")
META = ArtifactMeta(variant="fp32", components={})


def _open(method: str, **options: object):
    return open_method(QuantizeConfig(method, **options), SRC, META)  # type: ignore[arg-type]


def test_the_registry_holds_every_method_of_the_contract() -> None:
    assert tuple(METHODS) == QUANTIZE_METHODS
    assert all(cls.name == name for name, cls in METHODS.items())
    assert method_class("int4") is Int4
    with pytest.raises(ForgeError, match="unknown method 'int3'"):
        method_class("int3")


def test_options_select_the_class_and_its_defaults() -> None:
    assert type(_open("static")) is StaticInt8
    assert type(_open("static", calibrate_method="entropy")) is LegacyStaticInt8
    assert type(_open("static", calibrate_method="percentile")) is StaticInt8  # the streamed histograms
    assert type(_open("static", symmetric_activations=True)) is LegacyStaticInt8
    assert _open("static").per_channel and not _open("dynamic").per_channel
    assert not _open("static", per_channel=False).per_channel
    assert isinstance(_open("dynamic"), DynamicInt8) and isinstance(_open("auto"), Auto)
    assert _open("dynamic", kv_cache="int8").variant == "int8-dynamic-kv8"


def test_int4_takes_its_algorithm_from_the_request() -> None:
    plain = _open("int4")
    assert plain.algorithm == "rtn" and plain.rebuilds_fast_graph and not plain.needs_calibration
    calibrated = _open("int4", calibration="calib")
    assert calibrated.algorithm == "gptq" and calibrated.needs_calibration and not calibrated.rebuilds_fast_graph
    # an int8 KV cache needs the rebuilt (rtn) fused graph: the folder then serves the cache scales
    assert _open("int4", calibration="calib", kv_cache="int8").algorithm == "rtn"
    assert _open("int4", algorithm="k_quant").calibration_components == ("gpt",)
    importance = _open("int4", algorithm="importance", calibration="calib")
    assert importance.needs_calibration and not importance.rebuilds_fast_graph


def test_what_each_method_needs_and_allows() -> None:
    needs = {m: _open(m).needs_calibration for m in QUANTIZE_METHODS}
    assert needs == {"dynamic": False, "static": True, "int4": False, "auto": True}
    # which options a method reads is its config type's business
    assert [m for m in QUANTIZE_METHODS if issubclass(METHODS[m].config_type, FallbackOptions)] == ["dynamic", "static"]
    assert [m for m in QUANTIZE_METHODS if issubclass(METHODS[m].config_type, AutoOptions)] == ["auto"]
    assert all(type(_open(m).cfg) is METHODS[m].config_type is METHOD_CONFIGS[m] for m in QUANTIZE_METHODS)
    assert [m for m in QUANTIZE_METHODS if _open(m).rebuilds_fast_graph] == ["dynamic", "int4"]
    assert not _open("static", calibrate_method="percentile").rebuilds_fast_graph
    assert _open("auto").needs_trajectories and not _open("static").needs_trajectories


def test_record_options_are_the_methods_own() -> None:
    static = _open("static").options_record().to_dict()
    assert static["calibrate_method"] == "minmax" and static["block_size"] is None and "algorithm" not in static
    int4 = _open("int4", block_size=32).options_record().to_dict()
    assert (int4["block_size"], int4["algorithm"], int4["activation_type"]) == (32, "rtn", None)
    auto = _open("auto", block_size=32)
    assert auto.options_record().block_size == 32 and auto.rebuild_options() == {}
    assert _open("int4", block_size=32).rebuild_options() == {"block_size": 32, "accuracy_level": 4}


def test_fast_graph_quantizers_come_from_the_registry() -> None:
    assert REBUILT == ("dynamic", "int4")
    q = fast_gpt_quantizer("int4", block_size=32)
    assert (q.method, q.precision, q.pack_projections) == ("int4", "int4", True)
    assert fast_gpt_quantizer("dynamic").pack_projections is False  # per-tensor INT8: unpacked
    for name in ("static", "auto", "int3"):
        with pytest.raises(ForgeError, match="choose from: dynamic, int4"):
            fast_gpt_quantizer(name)


def test_options_of_another_method_never_reach_a_method() -> None:
    with pytest.raises(BadInput, match=r"^--min-agreement does not apply to --method int4 \(it applies to: dynamic, static\)$"):
        _open("int4", min_agreement=0.9)
    with pytest.raises(BadInput, match=r"^--algorithm does not apply to --method dynamic \(it applies to: int4\)$"):
        _open("dynamic", algorithm="gptq")
    with pytest.raises(BadInput, match=r"^--gate does not apply to --method static \(it applies to: auto\)$"):
        _open("static", gate="g.toml")
    assert _open("int4").cfg.targets.any() is False  # a method without the fallback has no targets
