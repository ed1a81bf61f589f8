"""`quantize --method auto`: per-MatMul FP32 / INT8 / INT4 assignment, the fastest that meets a gate.

1. Sensitivity (calibration split): each projection MatMul of the fused graph is quantized alone to
   INT4 (round to nearest at the chosen block size, simulated in FP32 through an initializer
   override, so no graph is rewritten per node); the loss is 1 - cosine of the GPT's last hidden
   state against FP32 on (up to `SENSITIVITY_SAMPLES` of) the recorded calibration samples, plus the
   top-1 agreement of the FP32 code head on those states. INT8 error is ~16x smaller per weight and
   follows the same order, so one ranking serves both ends of the ladder.
2. Ladder: nodes ordered by INT4 loss. Candidate i (-N..N) of N nodes: i < 0 keeps the |i| most
   sensitive nodes FP32 and the rest INT8; i = 0 is all INT8; i > 0 puts the i least sensitive
   nodes in INT4 and the rest in INT8. Precision falls and speed rises with i.
3. Search: each candidate tried is built for real (dynamic INT8, see `dynamic_fused`, + INT4
   MatMulNBits) and measured on the held-out split (teacher-forced replay through the runtime's
   `FastGptStep`: code agreement/KL, hidden cosine, mel after the FP32 Decoder: the gate's fidelity
   metrics), for its bytes and its decode-step time: all-INT8 is built first, and every other
   candidate's step is timed interleaved with all-INT8's (`step_vs_int8`: ratio, 90% interval,
   rounds; `LADDER_SETTINGS`), so load that changes during the search does not rank them. The
   ends and the middle are tried, then the boundary between passing and failing candidates is
   bisected (against the gate's thresholds with `SEARCH_HEADROOM`, as evaluate measures on other
   sentences). All-FP32 (-N) is tried only when all-INT8 fails: with all-INT8 passing, the boundary
   lies above 0 and all-FP32, the slowest passing row, could never be chosen.
4. Final timing: the passing candidates within `RETIME_WITHIN` of the fastest (by `step_vs_int8`)
   and all-INT8 (the fixed dynamic INT8 recipe) are timed again, interleaved round by round with all-INT8 as the
   reference until every ratio's 90% interval is within `RETIME_SETTINGS.bound` (or its time cap;
   `runtime.interleave`), so that load on the machine during the build cannot pick the winner. A
   mix is shipped only when its interval lies below 1 (faster than all-INT8 beyond the measured
   noise); otherwise all-INT8 is (the simpler variant), and `final_timing.decision` says so.
   `final_timing` records the comparison (ratios, intervals, rounds, how it stopped) and
   `chosen_vs_reference`. Tiny synthetic checkpoints rank by bytes, untimed: their step time is
   call overhead and ranking by it would be noise.

Everything tried is recorded (artifact.json -> quantization.auto): the sensitivity table, every
candidate (fidelity, bytes, step ms, pass/fail, Pareto-optimal) and the per-MatMul choice.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from chattts_forge.artifact import DECODER, FAST_GPT, HEAD_CODE, ArtifactMeta, Fidelity
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.gate import fidelity_rules, judge, load_gate
from chattts_forge.log import get_logger
from chattts_forge.progress import Progress
from chattts_forge.quantize.dynamic_fused import insert_dynamic_int8
from chattts_forge.quantize.fidelity import code_metrics, cosine_rows, make_session, mel_metrics, replay
from chattts_forge.quantize.int4 import evenly_spaced, quantize_int4_graph
from chattts_forge.quantize.static_fused import const_weight_matmuls, fused_feed
from chattts_forge.runtime.autotune import decode_call_at
from chattts_forge.runtime.fast_gpt import FastGptStep
from chattts_forge.runtime.interleave import Clock, RatioSettings, compare_interleaved, prefer_simpler
from chattts_forge.runtime.timing import quantiles, time_calls

log = get_logger(__name__)

CHOICES = ("fp32", "int8", "int4")  # a MatMul's precision in an assignment
FP32, INT8, INT4 = CHOICES
SENSITIVITY_SAMPLES = 8
# The search judges a candidate on other sentences (and fewer steps) than evaluate will: a candidate
# just over a threshold here can land just under it there (tiny: 0.748 vs 0.698 worst-stream
# agreement). So thresholds of the metrics bounded by 1 (agreement, cosine) are tightened by this
# fraction of their distance to 1 (0.70 -> 0.76, 0.98 -> 0.984); KL, LSD and SNR are used as given.
SEARCH_HEADROOM = 0.2
# The final timing: passing candidates whose first timing is within this factor of the fastest
# passing one, and the all-INT8 candidate (the fixed recipe auto must beat), timed again interleaved.
RETIME_WITHIN = 1.25
RETIME_CONTEXT = 200
# The final timing stops when every finalist's ratio to all-INT8 is known to +-2% (90% interval) or
# after a minute; each sample is >= 50 ms of steps after 2 untimed ones (the previous session's
# thread pool may still spin on the cores).
# Each ladder candidate against all-INT8 (a first ranking; the finalists are timed again, longer).
LADDER_SETTINGS = RatioSettings(bound=0.03, time_cap_s=8.0, min_rounds=6, max_rounds=200, warmup_rounds=1,
                                min_sample_s=0.02, untimed_calls=1)
# Tiny synthetic checkpoints rank by bytes: their ladder timing is a record, kept short.
TINY_LADDER_SETTINGS = RatioSettings(bound=0.05, time_cap_s=0.3, min_rounds=4, max_rounds=50, warmup_rounds=1,
                                     min_sample_s=0.002)
RETIME_SETTINGS = RatioSettings(bound=0.02, time_cap_s=60.0, min_rounds=8, max_rounds=400, warmup_rounds=1,
                                min_sample_s=0.05, untimed_calls=2)
_BOUNDED_BY_ONE = ("code_agreement", "code_agreement_stream", "hidden_cosine", "hidden_cosine_min")
_PROJ = re.compile(r"layers\.(\d+)/(self_attn|mlp)/(\w+?)_proj/MatMul$")
_UNPACKED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


# ---- the gate's fidelity thresholds ------------------------------------------------------------


def fidelity_targets(gate: str | Path | None) -> dict[str, Any]:
    """The fidelity rules of a gate file (the shipped one for None), read by the one gate parser:
    {"path", "sha256", "rules": [[rule, metric, threshold]]}; a gate evaluate would refuse is refused here."""
    parsed = load_gate(gate)
    return {"path": parsed["path"], "sha256": parsed["sha256"], "rules": fidelity_rules(parsed)}


def with_headroom(rules: Sequence[Sequence[Any]], headroom: float) -> list[list[Any]]:
    """The gate's rules as the search applies them (`SEARCH_HEADROOM`)."""
    if not 0.0 <= headroom < 1.0:
        raise BadInput(f"search headroom must lie in [0, 1), got {headroom}")
    return [[rule, metric, round(threshold + headroom * (1.0 - threshold), 6)
             if rule == "min" and metric in _BOUNDED_BY_ONE and threshold < 1.0 else threshold]
            for rule, metric, threshold in rules]


def judge_fidelity(rules: Sequence[Sequence[Any]], fid: dict[str, Any]) -> tuple[bool, list[str]]:
    """(passed, failed metrics) of a candidate's fidelity record under `rules` ([[rule, metric, threshold]]),
    by the gate's own judge (a NaN is never a pass)."""
    verdict = judge({"path": None, "sha256": None, "schema": None,
                     "rules": [("fidelity", rule, metric, threshold) for rule, metric, threshold in rules]},
                    Fidelity.from_dict(fid).gate_metrics())
    return verdict["passed"], verdict["failed"]


# ---- graphs --------------------------------------------------------------------------------------


def plain_nodes(fused_node: str, plain_names: Sequence[str]) -> list[str]:
    """The plain gpt.onnx MatMuls a fused projection stands for (packed QKV -> q, k, v; gate/up)."""
    m = _PROJ.search(fused_node)
    if not m:
        return []
    layer, block, proj = m.groups()
    wanted = {f"layers.{layer}/{block}/{p}_proj/MatMul" for p in _UNPACKED.get(proj, (proj,))}
    return [n for n in plain_names if any(n.endswith(w) for w in wanted)]


def plain_assignment(plain: Path, fused_assignment: dict[str, str]) -> dict[str, str]:
    """The search's assignment (of the fused graph's, possibly packed, projections) as the MatMuls of
    the plain graph `plain` (gpt.onnx); every constant-weight MatMul of it must have a fused counterpart."""
    names = [n.name for n in onnx.load(str(plain), load_external_data=False).graph.node]
    assignment = {p: choice for node, choice in fused_assignment.items() for p in plain_nodes(node, names)}
    matmuls = {n.name for n in const_weight_matmuls(onnx.load(str(plain)))}
    unmapped = sorted(matmuls - set(assignment))
    if unmapped:
        raise ForgeError(f"auto: {len(unmapped)} MatMul(s) of {plain.name} have no fused counterpart "
                         f"(first: {unmapped[0]})")
    return assignment


def quantize_mixed(src: Path, dst: Path, assignment: dict[str, str], work: Path, *, block_size: int,
                   accuracy_level: int, algorithm: str = "rtn") -> dict[str, Any]:
    """Write `src` with each named MatMul in its assigned precision (unnamed ones stay FP32): INT8 as
    dynamic INT8 (`dynamic_fused`), INT4 as MatMulNBits."""
    model = onnx.load(str(src))
    int8 = [n for n, c in assignment.items() if c == INT8]
    int4 = [n for n, c in assignment.items() if c == INT4]
    insert_dynamic_int8(model, int8)
    if not int4:
        onnx.save(model, str(dst))
        return {"int8": len(int8), "int4": 0}
    mid = work / f"{dst.stem}.int8.onnx"
    onnx.save(model, str(mid))
    keep = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in set(int4)]
    del model
    rec = quantize_int4_graph(mid, dst, block_size=block_size, accuracy_level=accuracy_level,
                              exclude_nodes=keep, algorithm=algorithm)
    mid.unlink()
    return {"int8": len(int8), "int4": len(int4), "int4_options": rec}


# ---- measurements -------------------------------------------------------------------------------


def _simulated_int4(w: np.ndarray, block: int) -> np.ndarray:
    """Symmetric round-to-nearest INT4 of B [K, N] in blocks of `block` along K, dequantized."""
    k = w.shape[0]
    pad = (-k) % block
    wp = np.pad(w, ((0, pad), (0, 0))).reshape(-1, block, w.shape[1])
    scale = np.abs(wp).max(axis=1, keepdims=True) / 7.0
    scale = np.where(scale > 0, scale, 1.0)
    return (np.clip(np.rint(wp / scale), -8, 7) * scale).reshape(-1, w.shape[1])[:k].astype(np.float32)


def sensitivity(fast: Path, head: Path, feeds: Sequence[dict[str, np.ndarray]], block_size: int,
                threads: int = 1) -> list[dict[str, Any]]:
    """Per projection MatMul: the loss when it alone is INT4 (see module doc), least sensitive first."""
    model = onnx.load(str(fast))
    inits = {i.name: i for i in model.graph.initializer}
    nodes = [(n.name, n.input[1]) for n in const_weight_matmuls(model)]
    weights = {w: onnx.numpy_helper.to_array(inits[w]) for _, w in nodes}
    del model, inits
    head_sess = make_session(head, threads)

    def run(overrides: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in overrides.items()}
        for k, v in values.items():
            opts.add_initializer(k, v)
        sess = ort.InferenceSession(str(fast), opts, providers=["CPUExecutionProvider"])
        hidden = np.concatenate([sess.run(["last_hidden_state"], f)[0].reshape(-1, f["inputs_embeds"].shape[-1])
                                 for f in feeds])
        return hidden, head_sess.run(["logits"], {"hidden_states": hidden})[0].argmax(-1)

    ref_h, ref_codes = run({})
    rows = []
    with Progress(len(nodes), "auto: sensitivity", "MatMul") as bar:  # a session per MatMul: ~40 s at full size
        for name, w in nodes:
            h, codes = run({w: _simulated_int4(weights[w], block_size)})
            rows.append({"node": name, "weights": int(weights[w].size),
                         "int4_cosine_loss": float(1.0 - cosine_rows(ref_h, h).mean()),
                         "int4_agreement": float((codes == ref_codes).mean())})
            bar.update(1)
    rows.sort(key=lambda r: (r["int4_cosine_loss"], r["node"]))
    return rows


def _fast_step(fast: Path, dims: dict[str, Any], threads: int | None, capacity: int | None = None) -> Any:
    """The runtime's `FastGptStep` on a fused graph file (a candidate, not yet in an artifact folder)."""
    hidden = int(dims["hidden_size"])
    return FastGptStep(make_session(fast, threads), int(dims["num_hidden_layers"]), int(dims["num_key_value_heads"]),
                       hidden // int(dims["num_attention_heads"]), hidden, int(dims.get("max_position_embeddings", 4096)),
                       **({"capacity": capacity} if capacity else {}))


def fast_fidelity(fp32_dir: Path, fast: Path, trajectories: Sequence[Any], dims: dict[str, Any],
                  threads: int | None, head: Path | None = None) -> dict[str, Any]:
    """The gate's fidelity metrics of a fused graph with code head `head` (default: the FP32 one) and
    the FP32 Decoder, teacher-forced on the held-out trajectories."""
    meta = ArtifactMeta.load(fp32_dir)
    head_sess = make_session(head or meta.component_file(fp32_dir, HEAD_CODE), threads)
    dec = make_session(meta.component_file(fp32_dir, DECODER), threads)
    step = _fast_step(fast, dims, threads)
    ref_logits, q_logits, cos, ref_mels, q_mels = [], [], [], [], []
    for t in trajectories:
        hidden, logits = replay(step, head_sess, t)
        q_logits += logits
        ref_logits += t.logits
        ref_h, q_h = np.stack(t.hidden, axis=-1), np.stack(hidden, axis=-1)
        cos.append(cosine_rows(np.moveaxis(ref_h, -1, 1), np.moveaxis(q_h, -1, 1)))
        ref_mels.append(dec.run(["mel"], {"hidden_states": ref_h.astype(np.float32)})[0])
        q_mels.append(dec.run(["mel"], {"hidden_states": q_h.astype(np.float32)})[0])
    c = np.concatenate(cos)
    return {"teacher_forced": code_metrics(ref_logits, q_logits),
            "hidden_cosine": {"mean": float(c.mean()), "min": float(c.min())},
            "mel": mel_metrics(ref_mels, q_mels)}


def _decode_stepper(fast: Path, dims: dict[str, Any], threads: int, past: int, steps: int) -> Callable[[], object]:
    """One decode step of a fused graph per call, batch 1, after a prefill of `past` random positions
    (random, seeded: latency does not depend on the values); each call appends one position, up to
    `steps` calls."""
    hidden = int(dims["hidden_size"])
    step = _fast_step(fast, dims, threads, capacity=past + steps + 8)
    rng = np.random.default_rng(0)
    step.reset(1)
    step(rng.standard_normal((1, past, hidden), dtype=np.float32), np.ones((1, past), np.int64),
         np.arange(past, dtype=np.int64)[None])
    inputs = [rng.standard_normal((1, 1, hidden), dtype=np.float32) for _ in range(steps)]
    done = iter(range(steps))

    def one_step() -> object:
        i = next(done)
        return step(inputs[i], np.ones((1, past + i + 1), np.int64), np.array([[past + i]], np.int64))

    return one_step


def fast_step_ms(fast: Path, dims: dict[str, Any], threads: int, past: int = 200, steps: int = 40) -> float:
    """Median decode-step time of a fused graph through FastGptStep at context `past`, batch 1
    (timed by `runtime.timing`; the first quarter of the steps warms caches and threads)."""
    times = time_calls(_decode_stepper(fast, dims, threads, past, steps), steps - steps // 4, warmup=steps // 4)
    return 1000.0 * (quantiles(times, [50]) or [math.nan])[0]


def repeatable_step(fast: Path, dims: dict[str, Any], threads: int, past: int = RETIME_CONTEXT) -> Callable[[], object]:
    """One decode step of a fused graph at a fixed context of `past` positions, batch 1, repeatable
    (the runtime's `FastGptStep`, rewound before every call; `runtime.autotune.decode_call_at`)."""
    step = _fast_step(fast, dims, threads, capacity=past + 8)
    return decode_call_at(step, int(dims["hidden_size"]), past)


# ---- the search ------------------------------------------------------------------------------------


def ladder_assignment(order: Sequence[str], i: int) -> dict[str, str]:
    """Candidate i of the ladder (module doc): `order` is least to most INT4-sensitive."""
    n = len(order)
    if i < 0:
        return {node: "fp32" if rank >= n + i else "int8" for rank, node in enumerate(order)}
    return {node: "int4" if rank < i else "int8" for rank, node in enumerate(order)}


def pareto(rows: list[dict[str, Any]], cost: str) -> None:
    """Mark the candidates no other candidate beats on both cost and hidden cosine."""
    for r in rows:
        r["pareto"] = not any(
            o is not r and o[cost] <= r[cost] and o["hidden_cosine"] >= r["hidden_cosine"]
            and (o[cost] < r[cost] or o["hidden_cosine"] > r["hidden_cosine"]) for o in rows
        )


def _label(row: dict[str, Any]) -> str:
    return f"{row['head_code']}:{row['candidate']:+d}"


def retime(passing: list[dict[str, Any]], rows: list[dict[str, Any]], graphs: dict[tuple[str, int], Path],
           dims: dict[str, Any], threads: int, *, step_call: Callable[[Path], Callable[[], object]] | None = None,
           settings: RatioSettings = RETIME_SETTINGS, clock: Clock = time.perf_counter) -> dict[str, Any]:
    """The final decision (module doc, 4): the finalists against all-INT8, interleaved until the
    ratios are known to within `settings.bound` (runtime.interleave). A mix is chosen only when its
    ratio's interval lies below 1; inside the noise all-INT8 stays (`decision` says which and why).
    The timed rows' `step_ms` become the interleaved medians (the search's own kept as
    `step_ms_search`). `step_call(graph) -> call` replaces the real decode step (tests)."""
    step_call = step_call or (lambda path: repeatable_step(path, dims, threads))
    # The ladder's interleaved ratios to all-INT8 when every passing row has one, else its step_ms.
    key = "ratio" if all("step_vs_int8" in r for r in passing) else "step_ms"

    def speed(r: dict[str, Any]) -> float:
        return r["step_vs_int8"]["ratio"] if key == "ratio" else r["step_ms"]

    fastest = min(speed(r) for r in passing)
    finalists = [r for r in passing if speed(r) <= RETIME_WITHIN * fastest]
    reference = next((r for r in rows if r["candidate"] == 0 and r["head_code"] == INT8 and (INT8, 0) in graphs),
                     None) or next((r for r in rows if r["candidate"] == 0 and (r["head_code"], 0) in graphs), None)
    if reference is None:  # all-INT8 was not built: the simplest finalist (fewest INT4 MatMuls) is the reference
        reference = min(finalists, key=lambda r: (r["candidate"] > 0, abs(r["candidate"])))
    timed = [reference, *(r for r in finalists if r is not reference and (r["head_code"], r["candidate"]) in graphs)]
    log.info("auto: timing %d candidates against %s again, interleaved (until the ratios' 90%% intervals are "
             "within +-%.3f or %.0f s)", len(timed) - 1, _label(reference), settings.bound, settings.time_cap_s)
    calls = {_label(r): step_call(graphs[(r["head_code"], r["candidate"])]) for r in timed}
    comparison = compare_interleaved((_label(reference), calls.pop(_label(reference))), calls, settings, clock=clock)
    by_label = {_label(r): r for r in timed}
    for label, est in comparison.estimates.items():
        r = by_label[label]
        r["step_ms_search"], r["step_ms"] = r["step_ms"], round(est.seconds * 1e3, 3)
    if comparison.estimates:
        reference["step_ms_search"] = reference["step_ms"]
        reference["step_ms"] = round(next(iter(comparison.estimates.values())).reference_seconds * 1e3, 3)
    eligible = {label for label, r in by_label.items() if r["passed"]}
    if reference["passed"]:
        chosen, reason = prefer_simpler(comparison, _label(reference))
        if chosen != comparison.reference:  # clearly faster ones the clock cannot separate: the fewest bytes
            best = comparison.estimates[chosen]
            tied = [e.name for e in comparison.estimates.values() if e.clearly_faster and e.low <= best.high]
            lightest = min(tied, key=lambda n: (by_label[n]["bytes"], n))
            if lightest != chosen:
                reason += (f"; {lightest} is inside its noise and reads fewer bytes ({by_label[lightest]['bytes']} "
                           f"vs {by_label[chosen]['bytes']}): the cost model picks {lightest}")
                chosen = lightest
    else:  # all-INT8 fails the gate: it is the yardstick, not a choice; the fastest passing one is
        est = min((e for e in comparison.estimates.values() if e.name in eligible), key=lambda e: (e.ratio, e.name))
        chosen, reason = est.name, (f"{_label(reference)} does not pass the gate: {est.name}, the fastest passing "
                                    f"finalist ({est.ratio:.3f}x, interval {est.low:.3f}-{est.high:.3f})")
    for label in by_label:
        r = by_label[label]
        log.info("auto: candidate %s: %.3f ms interleaved (search: %.3f ms)%s", label, r["step_ms"],
                 r.get("step_ms_search", r["step_ms"]),
                 "" if label == comparison.reference else
                 f", {comparison.estimates[label].ratio:.3f}x +-{comparison.estimates[label].spread:.3f}")
    log.info("auto: %s", reason)
    chosen_est = comparison.estimates.get(chosen)
    return {
        "method": f"interleaved with all-INT8 ({_label(reference)}) round by round, decode steps at context "
                  f"{RETIME_CONTEXT}, batch 1, {threads} threads, until every ratio's 90% interval is within "
                  f"+-{settings.bound} or {settings.time_cap_s:g} s (runtime.interleave)",
        "candidates": [{"candidate": r["candidate"], "head_code": r["head_code"]} for r in timed[1:]],
        "reference": {"candidate": reference["candidate"], "head_code": reference["head_code"],
                      "step_ms": reference["step_ms"], "passed": reference["passed"]},
        "comparison": comparison.to_dict(),
        "chosen": {"candidate": by_label[chosen]["candidate"], "head_code": by_label[chosen]["head_code"]},
        "chosen_vs_reference": round(chosen_est.ratio, 4) if chosen_est else 1.0,
        "chosen_vs_reference_interval": [round(chosen_est.low, 4), round(chosen_est.high, 4)] if chosen_est else None,
        "decision": reason,
    }


@dataclass(frozen=True)
class SearchSettings:
    """The search's knobs: the INT4 MatMuls' block settings, threads, what "fastest" means
    (`rank_by`: "step_ms", or "bytes", the default on tiny synthetic checkpoints), its budget."""

    block_size: int = 128
    accuracy_level: int = 4
    threads: int = 1
    rank_by: str | None = None
    max_candidates: int = 8
    headroom: float = SEARCH_HEADROOM


@dataclass
class Ladder:
    """The candidates of one search, tried with one code head at a time: each one built, measured on
    the held-out trajectories and judged against the gate's rules (with headroom)."""

    fp32_dir: Path
    fast: Path  # the FP32 fused graph
    work: Path
    order: list[str]  # projection MatMuls, least INT4-sensitive last
    trajectories: Sequence[Any]
    dims: dict[str, Any]
    rules: list[list[Any]]
    settings: SearchSettings
    # kept for the final timing: passing candidates and all-INT8, per (head label, candidate)
    graphs: dict[tuple[str, int], Path] = field(default_factory=dict)
    # each candidate's step is timed interleaved with all-INT8's (built first) under these settings
    ratio_settings: RatioSettings = LADDER_SETTINGS
    reference_step: Callable[[], object] | None = None

    def time_step(self, path: Path, i: int) -> dict[str, Any]:
        """step_ms of a candidate and, once all-INT8 is built, its interleaved ratio to all-INT8's step."""
        threads = max(self.settings.threads, 1)
        if i == 0 or self.reference_step is None:
            out: dict[str, Any] = {"step_ms": round(fast_step_ms(path, self.dims, threads), 3)}
            if i == 0:
                self.reference_step = repeatable_step(path, self.dims, threads)
                out["step_vs_int8"] = {"ratio": 1.0, "low": 1.0, "high": 1.0, "rounds": 0, "stopped": "reference"}
            return out
        comp = compare_interleaved(("int8", self.reference_step), {"candidate": repeatable_step(path, self.dims, threads)},
                                   self.ratio_settings)
        est = comp.estimates["candidate"]
        return {"step_ms": round(est.seconds * 1e3, 3),
                "step_vs_int8": {"ratio": round(est.ratio, 4), "low": round(est.low, 4), "high": round(est.high, 4),
                                 "rounds": comp.rounds, "stopped": comp.stopped}}

    def trial(self, tried: dict[int, dict[str, Any]], i: int, head_path: Path | None, head_label: str) -> bool:
        """Build candidate `i`, measure and judge it; its row goes into `tried`."""
        if i in tried:
            return tried[i]["passed"]
        st, n = self.settings, len(self.order)
        assignment = ladder_assignment(self.order, i)
        path = self.work / f"auto-candidate-{head_label}-{i + n}.onnx"
        quantize_mixed(self.fast, path, assignment, self.work, block_size=st.block_size,
                       accuracy_level=st.accuracy_level)
        fid = fast_fidelity(self.fp32_dir, path, self.trajectories, self.dims, st.threads, head=head_path)
        ok, failed = judge_fidelity(self.rules, fid)
        figures = Fidelity.from_dict(fid).gate_metrics()
        counts = {c: sum(1 for v in assignment.values() if v == c) for c in CHOICES}
        row = {"candidate": i, "head_code": head_label, **counts, "bytes": path.stat().st_size,
               **self.time_step(path, i),
               "code_agreement": round(figures["code_agreement"], 5),
               "hidden_cosine": round(figures["hidden_cosine"], 6),
               "mel_snr_db": round(figures["mel_snr_db"], 3), "passed": ok, "failed": failed}
        tried[i] = row
        if ok or i == 0:
            self.graphs[(head_label, i)] = path
        else:
            path.unlink()
        log.info("auto: candidate %+d (fp32 %d / int8 %d / int4 %d, head %s): agreement %.4f, cosine %.5f, "
                 "%.2f ms, %.1f MB: %s", i, counts[FP32], counts[INT8], counts[INT4], head_label,
                 row["code_agreement"], row["hidden_cosine"], row["step_ms"], row["bytes"] / 1e6,
                 "pass" if ok else f"fail ({', '.join(failed)})")
        return ok

    def climb(self, head_path: Path | None, head_label: str) -> list[dict[str, Any]]:
        """The ends and the middle, then bisect the pass/fail boundary (fidelity falls along the ladder)."""
        tried: dict[int, dict[str, Any]] = {}
        n = len(self.order)
        # all-INT8 first (the others' steps are timed against it), then the end the boundary lies towards:
        # all-FP32 only when all-INT8 fails (it would be the slowest passing row, never chosen)
        self.trial(tried, 0, head_path, head_label)
        for i in (n,) if tried[0]["passed"] else (n, -n):
            self.trial(tried, i, head_path, head_label)
        lo, hi = (0, n) if tried[0]["passed"] else (-n, 0)
        if tried[hi]["passed"]:
            lo = hi
        while hi - lo > 1 and len(tried) < self.settings.max_candidates:
            mid = (lo + hi) // 2
            if self.trial(tried, mid, head_path, head_label):
                lo = mid
            else:
                hi = mid
        return sorted(tried.values(), key=lambda r: r["candidate"])


def search(fp32_dir: Path, meta: ArtifactMeta, work: Path, samples: list[dict[str, np.ndarray]],
           trajectories: Sequence[Any], gate: str | Path | None, *, head: Path | None = None,
           settings: SearchSettings = SearchSettings()) -> dict[str, Any]:
    """Find the per-MatMul assignment (fused-graph node names) for `quantize --method auto`."""
    targets = fidelity_targets(gate)
    targets["headroom"] = settings.headroom
    targets["search_rules"] = with_headroom(targets["rules"], settings.headroom)
    fast = meta.component_file(fp32_dir, FAST_GPT)
    fp32_head = meta.component_file(fp32_dir, HEAD_CODE)
    dims = meta.dims or {}
    tiny = (meta.source or {}).get("preset") == "tiny"
    rank_by = settings.rank_by or ("bytes" if tiny else "step_ms")
    if rank_by not in ("bytes", "step_ms"):
        raise BadInput(f"rank_by must be 'bytes' or 'step_ms', got {rank_by!r}")
    feeds = [fused_feed(s) for s in samples]
    started = time.time()
    subset = [feeds[i] for i in evenly_spaced(len(feeds), SENSITIVITY_SAMPLES)]
    log.info("auto: sensitivity of each projection MatMul on %d calibration samples", len(subset))
    sens = sensitivity(fast, fp32_head, subset, settings.block_size, settings.threads)
    order = [r["node"] for r in sens]
    log.info("auto: sensitivity done in %.0f s (%d MatMuls)", time.time() - started, len(order))
    ladder = Ladder(fp32_dir, fast, work, order, trajectories, dims, targets["search_rules"], settings,
                    ratio_settings=TINY_LADDER_SETTINGS if tiny else LADDER_SETTINGS)
    try:
        rows = ladder.climb(head, INT8 if head is not None else FP32)
        if head is not None and not any(r["passed"] for r in rows):
            log.info("auto: no candidate passes with the INT8 code head; searching again with the FP32 head")
            rows += ladder.climb(None, FP32)
        passing = [r for r in rows if r["passed"]]
        if not passing:
            raise ForgeError("auto: no candidate, not even all-FP32, meets the gate's fidelity thresholds")
        timing = (retime(passing, rows, ladder.graphs, dims, max(settings.threads, 1))
                  if rank_by == "step_ms" else None)
    finally:
        for path in ladder.graphs.values():
            path.unlink(missing_ok=True)
    pareto(rows, rank_by)
    # With a final timing, its decision is the choice (one clock for every finalist, noise-aware).
    if timing is not None:
        best = next(r for r in rows if (r["candidate"], r["head_code"]) ==
                    (timing["chosen"]["candidate"], timing["chosen"]["head_code"]))
    else:
        best = min(passing, key=lambda r: (r[rank_by], -r["candidate"]))
    assignment = ladder_assignment(order, best["candidate"])
    log.info("auto: chose candidate %+d (fp32 %d / int8 %d / int4 %d, head %s) of %d tried in %.0f s",
             best["candidate"], best[FP32], best[INT8], best[INT4], best["head_code"], len(rows),
             time.time() - started)
    return {
        "gate": targets,
        "ranked_by": rank_by if not tiny else "bytes (tiny synthetic checkpoint: step time is call overhead)",
        "block_size": settings.block_size,
        "accuracy_level": settings.accuracy_level,
        "int4_algorithm": "rtn",
        "ladder": "candidate i<0: |i| most INT4-sensitive MatMuls FP32, rest INT8; 0: all INT8; "
                  "i>0: i least sensitive INT4, rest INT8",
        "sensitivity": [{k: (round(v, 7) if isinstance(v, float) else v) for k, v in r.items()} for r in sens],
        "candidates": rows,
        "chosen": best["candidate"],
        "head_code": best["head_code"],
        "int8": "dynamic: DynamicQuantizeMatMul, run-time uint8 activations, int8 weights with one scale per "
                "projection (quantize/dynamic_fused.py)",
        "assignment": assignment,
        "final_timing": timing,
        "seconds": round(time.time() - started, 1),
    }
