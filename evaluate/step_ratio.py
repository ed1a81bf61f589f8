"""The gate's speed comparison, interleaved: the artifact's GPT decode step over the FP32 reference's.

evaluate times whole syntheses of the reference and then of the artifact; on a shared machine
those two runs see different load, and their RTF ratio moves by 20-30% between runs. Beside it the
report records `latency.ratios.vs_reference_interleaved`: one batch-1 decode step of each at a fixed
context, the two interleaved round by round until the ratio's 90% interval is within `BOUND` or
`TIME_CAP_S` is spent (runtime.interleave; the runtime's own GPT steps, runtime.autotune), with the
interval, the rounds and how it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chattts_forge.runtime.autotune import RuntimeSteps
from chattts_forge.runtime.interleave import RatioSettings, compare_interleaved

BOUND = 0.03
TIME_CAP_S = 3.0  # per evaluation: the build runs one per variant
CONTEXT = 200


def interleaved_step_ratio(artifact: Path, reference: Path, *, threads: int | None = 2, provider: str = "cpu",
                           context: int = CONTEXT, time_cap_s: float = TIME_CAP_S,
                           bound: float = BOUND) -> dict[str, Any]:
    """{"ratio", "low", "high", "spread", "step_ms", "reference_step_ms", "rounds", "stopped", "converged",
    "context", "method"}: the artifact's decode step over the reference's (see the module docstring)."""
    steps = RuntimeSteps(provider, threads)
    try:
        ref_call = steps(Path(reference), context)
        art_call = steps(Path(artifact), context)
        comparison = compare_interleaved(("reference", ref_call), {"artifact": art_call},
                                         RatioSettings(bound=bound, time_cap_s=time_cap_s, warmup_rounds=2))
    finally:
        steps.close()
    est = comparison.to_dict()["candidates"]["artifact"]
    return {**est, "stopped": comparison.stopped, "converged": comparison.converged, "context": context,
            "method": f"batch-1 GPT decode steps at context {context}, artifact and FP32 reference interleaved "
                      f"round by round until the ratio's 90% interval is within +-{bound} or {time_cap_s:g} s"}
