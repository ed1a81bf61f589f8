"""Median over rounds of run_memory.sh's JSON: peak RSS (MiB, as bench reports it), load RSS,
GPT step, real-time streams at batch 8, first audio at batch 1. usage: summarize_memory.py DIR"""

import glob
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
for path in sorted(glob.glob(f"{sys.argv[1]}/*-r*.json")):
    label, batch, steps, _ = Path(path).stem.rsplit("-", 3)
    doc = json.loads(Path(path).read_text())
    key = f"{batch}-{steps}"
    res = doc["results"]["onnx"][batch[1:]]
    rows[label][f"peak {key}"].append(doc["memory"]["process_peak_rss_mb"])
    rows[label]["loaded"].append(doc["memory"]["onnx"]["load_rss_mb"])
    rows[label][f"step {key}"].append(res["gpt_step_ms_ctx400"]["median"])
    if batch == "b8":
        rows[label]["streams b8"].append(res["streams"]["median"])
    if "first_audio_s" in res:
        rows[label]["first audio b1"].append(res["first_audio_s"]["median"])
cols = ["peak b1-200", "peak b1-422", "peak b8-422", "loaded", "step b1-422", "step b8-422", "streams b8", "first audio b1"]
print("| artifact | " + " | ".join(cols) + " |")
print("| --- " * (len(cols) + 1) + "|")
for label, r in rows.items():
    cells = [f"{statistics.median(r[c]):.3g}" if r.get(c) else "-" for c in cols]
    print(f"| {label} | " + " | ".join(cells) + " |")
