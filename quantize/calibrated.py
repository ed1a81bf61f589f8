"""What the calibrated methods add to `quantize_artifact`: static INT8 on both GPT graphs, INT4 with
an algorithm (rtn, k_quant, gptq) and `auto`'s search, behind one small `Plan` the driver calls.

`check_request` validates everything up front (input artifact sizes and sha256, the calibration
folder, options, the gate) before any work. The plan then quantizes one graph at a time with the same
per-MatMul choices for `gpt.onnx`, `head_code.onnx` and the fused `gpt_fast.onnx`, so the runtime's
fast graph is the calibrated one too (see `fused.py` for the parity check between the two).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chattts_forge.artifact import FAST_GPT, FAST_GPT_FILE, METHOD_PRECISION, METHOD_VARIANT, ArtifactMeta
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import portable_path
from chattts_forge.log import get_logger

if TYPE_CHECKING:
    from chattts_forge.quantize.quantize import QuantizeConfig

log = get_logger(__name__)

PARITY_SAMPLES = 8


@dataclass
class Plan:
    """The calibrated part of one quantize run (empty for dynamic and plain RTN INT4)."""

    src: Path
    meta: ArtifactMeta
    method: str
    store: CalibrationStore | None = None
    algorithm: str = "rtn"
    gate: Any = None
    block_size: int = 128
    accuracy_level: int = 4
    activation_type: str = "uint8"
    threads: int = 2
    legacy_static: bool = False  # entropy/percentile/symmetric ranges: onnxruntime's quantize_static, plain graph only
    handles: set[str] = field(default_factory=set)
    needs_trajectories: bool = False
    auto: dict[str, Any] | None = None
    quantize_head: bool = True
    _head_record: dict[str, Any] = field(default_factory=dict)
    work: Path = Path(".")  # the run's scratch folder (set by before_quantizing)
    _samples: dict[str, list[dict[str, np.ndarray]]] = field(default_factory=dict)

    def samples(self, component: str) -> list[dict[str, np.ndarray]]:
        if component not in self._samples:
            assert self.store is not None
            self._samples[component] = list(self.store.iter_samples(component))
        return self._samples[component]

    def before_quantizing(self, work: Path, trajectories: Any) -> None:
        self.work = work
        if self.method != "auto":
            return
        from chattts_forge.quantize.auto import search
        from chattts_forge.quantize.static_fused import quantize_static_inputs

        # The code head is static INT8 in every candidate: quantize it first, so that the search
        # measures what the gate will judge (the artifact's own head, not the FP32 one).
        head = self.meta.component_file(self.src, "head_code")
        if self.quantize_head:
            self._head_record = quantize_static_inputs(head, work / "head_code.auto.onnx", self.samples("head_code"),
                                                       activation_type=self.activation_type, threads=self.threads)
            head = work / "head_code.auto.onnx"
        self.auto = search(self.src, self.meta, work, self.samples("gpt"), trajectories, self.gate, head=head,
                           block_size=self.block_size, accuracy_level=self.accuracy_level, threads=self.threads)

    def quantize_graph(self, component: str, src: Path, dst: Path, exclude: list[str], work: Path) -> dict[str, Any]:
        """Quantize one plain graph (gpt or head_code) of the artifact."""
        from chattts_forge.quantize.static_fused import quantize_static_inputs

        if self.method == "auto" and component == "head_code":  # quantized before the search
            assert self.auto is not None
            if self.auto["head_code"] == "fp32":
                shutil.copyfile(src, dst)
                return {"kept": "fp32 (auto: no candidate met the gate with the INT8 code head)"}
            shutil.copyfile(work / "head_code.auto.onnx", dst)
            return dict(self._head_record)
        if self.method == "static":
            return quantize_static_inputs(src, dst, self.samples(component), activation_type=self.activation_type,
                                          exclude_nodes=exclude, threads=self.threads)
        if self.method == "int4":
            from chattts_forge.quantize.int4 import quantize_int4_graph

            feeds = self.samples(component) if self.algorithm == "gptq" else None
            return quantize_int4_graph(src, dst, self.block_size, self.accuracy_level, exclude_nodes=exclude,
                                       algorithm=self.algorithm, feeds=feeds)
        return self._mixed(src, dst, work, plain=True)

    def _mixed(self, src: Path, dst: Path, work: Path, plain: bool) -> dict[str, Any]:
        import onnx

        from chattts_forge.quantize.auto import plain_nodes, quantize_mixed
        from chattts_forge.quantize.static_fused import const_weight_matmuls

        assert self.auto is not None
        assignment = self.auto["assignment"]
        if plain:  # map the fused graph's (packed) projections onto gpt.onnx's MatMuls
            model = onnx.load(str(src), load_external_data=False)
            names = [n.name for n in model.graph.node]
            assignment = {p: choice for node, choice in assignment.items() for p in plain_nodes(node, names)}
            inputs = {n.name: n.input[0] for n in const_weight_matmuls(onnx.load(str(src)))}
            del model
            unmapped = sorted(set(inputs) - set(assignment))
            if unmapped:
                raise ForgeError(f"auto: {len(unmapped)} MatMul(s) of {src.name} have no fused counterpart "
                                 f"(first: {unmapped[0]})")
        rec = quantize_mixed(src, dst, assignment, work, block_size=self.block_size,
                             accuracy_level=self.accuracy_level)
        return {"format": "mixed: dynamic INT8 (DynamicQuantizeMatMul, per-projection weight scales) + "
                          "INT4 MatMulNBits (rtn) + FP32",
                "assignment": {c: sum(1 for v in assignment.values() if v == c) for c in ("fp32", "int8", "int4")},
                **rec}

    def write_fast_graph(self, tmp: Path, qmeta: ArtifactMeta) -> str:
        from chattts_forge.quantize.fused import write_fast_graph
        from chattts_forge.quantize.static_fused import fused_feed, quantize_static_inputs

        # The fused graph's label, as the dynamic/int4 rebuilds record theirs: the variant ("mixed" for auto).
        precision = METHOD_PRECISION[self.method] if self.method == "auto" else METHOD_VARIANT[self.method]

        def quantize(src: Path, dst: Path) -> dict[str, Any]:
            if self.method == "static":
                return quantize_static_inputs(src, dst, (fused_feed(s) for s in self.samples("gpt")),
                                              activation_type=self.activation_type, threads=self.threads)
            if self.method == "int4":
                from chattts_forge.quantize.int4 import quantize_int4_graph

                feeds = [fused_feed(s) for s in self.samples("gpt")] if self.algorithm == "gptq" else None
                return quantize_int4_graph(src, dst, self.block_size, self.accuracy_level, algorithm=self.algorithm,
                                           feeds=feeds)
            return self._mixed(src, dst, self.work, plain=False)

        record = write_fast_graph(self.src, self.meta, tmp, precision, quantize, self.samples("gpt")[:PARITY_SAMPLES],
                                  threads=self.threads)
        qmeta.components[FAST_GPT] = record
        return f"quantized from the FP32 {FAST_GPT_FILE} with the same choices as gpt.onnx ({precision})"

    def record(self, out_dir: Path) -> dict[str, Any]:
        """Additions to artifact.json's `quantization` block of the artifact written to `out_dir`."""
        out: dict[str, Any] = {}
        if self.method == "int4":
            out["algorithm"] = self.algorithm
        if self.auto is not None:
            out["auto"] = dict(self.auto)
            gate = dict(out["auto"]["gate"])  # recorded relative to the artifact, as every path is
            out["auto"]["gate"] = gate | {"path": portable_path(gate["path"], out_dir)}
        return out


def plan_request(src: Path, meta: ArtifactMeta, cfg: QuantizeConfig, calibration: Any, algorithm: str | None,
                 gate: Any, threads: int | None) -> Plan:
    """Validate the request before any work; returns the plan `quantize_artifact` follows."""
    from chattts_forge.quantize.inputs import check_input_artifact, open_calibration
    from chattts_forge.quantize.int4 import MIN_GPTQ_SAMPLES, check_gptq_block, check_int4_options

    method, block_size, accuracy_level = cfg.method, cfg.block_size, cfg.accuracy_level
    check_input_artifact(src, meta)
    plan = Plan(src, meta, method, block_size=block_size, accuracy_level=accuracy_level,
                activation_type=cfg.activation_type, threads=threads or 2, quantize_head=cfg.quantize_head)
    if method == "int4":
        # With --kv-cache int8 the calibration folder serves the cache scales of the rebuilt (rtn) fused graph.
        plan.algorithm = algorithm or ("gptq" if calibration is not None and cfg.kv_cache == "fp32" else "rtn")
        check_int4_options(block_size, accuracy_level, plan.algorithm)
    elif method == "auto":
        check_int4_options(block_size, accuracy_level, "rtn")
        if algorithm not in (None, "rtn"):
            raise ForgeError("--algorithm applies to --method int4 (auto's INT4 MatMuls use rtn)")
    elif algorithm is not None:
        raise ForgeError(f"--algorithm applies to --method int4, not {method}")
    needs_calibration = method in ("static", "auto") or (method == "int4" and plan.algorithm == "gptq")
    if needs_calibration and calibration is None:
        raise ForgeError(f"--method {method}{' --algorithm gptq' if method == 'int4' else ''} needs --calibration "
                         "CALIB_DIR (make one with `chattts-forge calibrate`)")
    if method == "auto":
        if not meta.has_component(FAST_GPT):
            raise ForgeError(f"--method auto searches on the fused {FAST_GPT_FILE}, which {src} lacks (re-run convert)")
        from chattts_forge.quantize.auto import fidelity_targets

        plan.gate = fidelity_targets(gate)["path"]
        plan.needs_trajectories = True
    elif gate is not None:
        raise ForgeError("--gate applies to --method auto")
    if calibration is not None and method == "dynamic":
        if cfg.kv_cache == "fp32":
            log.info("--calibration is only used by --kv-cache int8 with --method dynamic; ignoring it")
    elif calibration is not None:
        comps = ("gpt", "head_code") if cfg.quantize_head and (method != "int4" or plan.algorithm == "gptq") else ("gpt",)
        plan.store = open_calibration(calibration, src, meta, comps)
        if plan.algorithm == "gptq" and method == "int4":
            for c in comps:
                if plan.store.count(c) < MIN_GPTQ_SAMPLES:
                    raise ForgeError(f"calibration {calibration} has {plan.store.count(c)} {c} samples; GPTQ needs at "
                                     f"least {MIN_GPTQ_SAMPLES} (record more with `calibrate --max-samples`)")
                check_gptq_block(meta.component_file(src, c), block_size)
    if method == "static":
        plan.legacy_static = cfg.calibrate_method != "minmax" or cfg.symmetric_activations
        if not plan.legacy_static:
            plan.handles.add("static")
    elif method == "auto" or (method == "int4" and plan.algorithm != "rtn"):
        plan.handles.add(method)
    return plan
