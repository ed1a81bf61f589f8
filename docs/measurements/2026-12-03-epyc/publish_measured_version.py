"""Publish a full-size routed version to time cold starts on, without the build's evaluation.

    python publish_measured_version.py FP32_FOLDER KV8_FOLDER WORK

FP32 (convert's) and int8-dynamic-kv8 (quantize's) are published with the test suite's stand-in
gate reports (tests/stand_in_report.py: schema-valid, every gate metric at its threshold, no
measurement), so WORK/artifacts/<model>/v1 is a version whose routing.json sends every bucket to
int8-dynamic-kv8 (build RTF 1.0 against fp32's 2.0; both pass everywhere, fp32 the fallback). Its
files, graphs and manifests are what a real build publishes; only the reports' figures are stand-ins,
and nothing here reads them but the routing. Run with the checkout's tests/ on PYTHONPATH.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stand_in_report import publish_stand_in_version

fp32, kv8, work = (Path(a) for a in sys.argv[1:4])
everywhere = {"short": True, "medium": True, "long": True}
version = publish_stand_in_version({"fp32": fp32, "int8-dynamic-kv8": kv8}, work, {
    "fp32": {b: (ok, 2.0) for b, ok in everywhere.items()},
    "int8-dynamic-kv8": {b: (ok, 1.0) for b, ok in everywhere.items()}})
print(version)
