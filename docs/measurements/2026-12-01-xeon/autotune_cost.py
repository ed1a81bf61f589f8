"""The Router autotune's cost at first load, on a cache hit and off, on a tiny version folder.

    .venv/bin/python docs/measurements/2026-12-01-xeon/autotune_cost.py FP32_ARTIFACT FP16_ARTIFACT

fp32 + fp16 tiny artifacts published with stand-in reports (tests/stand_in_report.py): both pass the
short and medium buckets (fp16 the build's faster), fp32 alone the long one. Run from the repo root.
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "tests")
from stand_in_report import write_stand_in_report

from chattts_forge.publish import publish_artifact
from chattts_forge.publish.version_files import publish_version_files
from chattts_forge.runtime.router import Router

work = Path(tempfile.mkdtemp(prefix="autotune-measure-"))
os.environ["XDG_CACHE_HOME"] = str(work / "xdg")
arts = {"fp32": Path(sys.argv[1]), "fp16": Path(sys.argv[2])}
verdicts = {"fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
            "fp16": {"short": (True, 1.0), "medium": (True, 1.0), "long": (False, 1.0)}}
for v, b in verdicts.items():
    write_stand_in_report(work / "r" / v, arts[v], buckets=b)
    res = publish_artifact(arts[v], work / "r" / v, work / "artifacts")
version = res.path.parent
publish_version_files(version)
for label in ("first load", "cache hit", "autotune off"):
    t0 = time.perf_counter()
    r = Router(version, threads=2, autotune=label != "autotune off")
    dt = time.perf_counter() - t0
    rec = r.autotune
    print(json.dumps({"load": label, "router_init_s": round(dt, 3), "source": rec["source"],
                      "autotune_seconds": rec.get("seconds"),
                      "buckets": {n: {"variant": b["variant"], "build": b["build_variant"],
                                      "rounds": (b["comparison"] or {}).get("rounds"),
                                      "stopped": (b["comparison"] or {}).get("stopped"),
                                      "candidates": (b["comparison"] or {}).get("candidates")}
                                  for n, b in rec["buckets"].items()}}))
