#!/bin/bash
# usage: report_vs_bench.sh VERSION_DIR OUTDIR (run from the project root)
# Each published variant's report memory figure (memory.artifact) beside a standalone
# `chattts-forge bench --batch 1` of the same folder (its process peak RSS).
set -u
V=$1; O=$2; mkdir -p "$O"
for v in fp32 int8-dynamic int8-dynamic-kv8 fp16 int8-static auto; do
  [ -d "$V/$v" ] || continue
  .venv/bin/chattts-forge bench --artifact "$V/$v" --batch 1 --threads 2 --json $O/bench-$v.json > $O/bench-$v.log 2>&1
  .venv/bin/python - "$V/$v/report.json" "$O/bench-$v.json" "$v" <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
m=r["memory"]["artifact"]
def find(d,keys=("peak_rss_mb","process_peak_rss_mb")):
    out=[]
    def w(x,p):
        if isinstance(x,dict):
            for k,v in x.items(): w(v,p+"."+k)
        elif any(p.endswith(k) for k in keys): out.append((p,x))
    w(d,""); return out
print(sys.argv[3], "report b1", m.get("peak_rss_mb"), "b8", m.get("peak_rss_mb_by_batch"), "after_load", m.get("after_load_mb"), "probe_s", m.get("seconds"))
print("   bench:", find(b)[:6])
PY
done
