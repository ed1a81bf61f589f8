"""Every shipped graph of every variant is valid ONNX: `onnx.checker.check_model(full_check=True)`.

The checker rejects operators it has no schema for in the standard domain (onnxruntime's internal
`SimplifiedLayerNormalization` once sat there) and contrib operators whose domain the model does
not import; full_check adds strict shape and type inference. The path form of `check_model` reads
graphs with external data too.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from chattts_forge.artifact import COMPONENTS, FAST_GPT, METHOD_VARIANT, VARIANTS, quantized_variant

# Every variant ships every component; the fused GPT comes with FP32 and every quantized variant
# (dynamic/int4 rebuild it, static and auto quantize it with gpt.onnx's choices); FP16 has none.
WITH_FAST_GPT = {"fp32", "int8-dynamic", "int8-static", "int4", "auto", "int8-dynamic-kv8"}


@pytest.fixture(scope="module")
def variant_dirs(tiny_artifacts: dict[str, Path], tiny_quantized: dict[str, Path], tiny_kv8: Path) -> dict[str, Path]:
    dirs = {"fp32": tiny_artifacts["fp32"], "fp16": tiny_artifacts["fp16"]}
    dirs.update({METHOD_VARIANT[method]: folder for method, folder in tiny_quantized.items()})
    dirs[quantized_variant("dynamic", "int8")] = tiny_kv8
    assert set(dirs) == set(VARIANTS)
    return dirs


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_graph_passes_the_onnx_checker(variant_dirs: dict[str, Path], variant: str) -> None:
    folder = variant_dirs[variant]
    meta = json.loads((folder / "artifact.json").read_text(encoding="utf-8"))
    assert meta["variant"] == variant
    assert set(meta["components"]) == set(COMPONENTS) | ({FAST_GPT} if variant in WITH_FAST_GPT else set())
    listed = {comp["file"] for comp in meta["components"].values()}
    graphs = sorted(folder.rglob("*.onnx"))
    assert {g.name for g in graphs} == listed  # no graph shipped unlisted, none listed missing
    for graph in graphs:
        onnx.checker.check_model(str(graph), full_check=True)
        # every non-standard operator domain is imported (the checker enforces it; keep it explicit)
        model = onnx.load(str(graph), load_external_data=False)
        imported = {o.domain for o in model.opset_import}
        used = {n.domain for n in model.graph.node}
        assert used <= imported | {"ai.onnx"}, (graph.name, used - imported)
