"""How far two calibration folders' statistics are apart: `python compare_calibration.py A B`.

Per graph: the largest relative difference of any tensor's min/max and mean square, the largest
|x|-histogram L1 difference (as a share of its count), the KV-cache maxima, and whether the
sentences, step counts and raw-sample keys are the same.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from chattts_forge.calibration_data.store import CalibrationStore


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12), initial=0.0))


def main() -> int:
    a, b = CalibrationStore(sys.argv[1]), CalibrationStore(sys.argv[2])
    out: dict = {
        "same_sentences": a.manifest["sentence_sha256"] == b.manifest["sentence_sha256"],
        "same_gpt_samples": a.manifest["gpt_samples"] == b.manifest["gpt_samples"],
        "same_raw_keys": all(a.manifest["components"][c]["keys"] == b.manifest["components"][c]["keys"]
                             for c in a.manifest["components"]),
        "graphs": {},
    }
    for g, tensors in b.statistics.graphs.items():
        worst = {"range_rel": 0.0, "mean_square_rel": 0.0, "hist_l1_share": 0.0, "tensors": len(tensors)}
        for name, st in tensors.items():
            other = a.statistics.graphs[g][name]
            worst["range_rel"] = max(worst["range_rel"], _rel([other.min, other.max], [st.min, st.max]))
            worst["mean_square_rel"] = max(worst["mean_square_rel"], _rel(other.sum_sq, st.sum_sq))
            worst["hist_l1_share"] = max(worst["hist_l1_share"],
                                         float(np.abs(other.hist - st.hist).sum() / max(st.hist.sum(), 1)))
        out["graphs"][g] = worst
    out["kv_absmax_rel"] = max((_rel(a.statistics.kv[k].absmax, b.statistics.kv[k].absmax) for k in b.statistics.kv),
                               default=0.0)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
