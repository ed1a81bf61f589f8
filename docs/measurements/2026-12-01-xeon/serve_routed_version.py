"""Publish a full-size int8-dynamic-kv8 artifact and its fp32 source as a routed version (stand-in
reports: every length bucket to int8-dynamic-kv8, fp32 the fallback), then warm a 5-phrase cache
through it (serve.md, 2026-12-02). Run from the repository root:

    python docs/measurements/2026-12-01-xeon/serve_routed_version.py FP32_DIR KV8_DIR WORK
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from stand_in_report import publish_stand_in_version  # noqa: E402

from chattts_forge.publish.version_files import publish_version_files  # noqa: E402
from chattts_forge.runtime.phrase_cache_build import build_phrase_cache  # noqa: E402
from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams  # noqa: E402

fp32, kv8, work = (Path(a) for a in sys.argv[1:4])
t0 = time.time()
every = ("short", "medium", "long")
vdir = publish_stand_in_version({"int8-dynamic-kv8": kv8, "fp32": fp32}, work / "pub",
                                {"fp32": {b: (True, 2.0) for b in every},
                                 "int8-dynamic-kv8": {b: (True, 1.0) for b in every}})
phrases = work / "phrases.txt"
lines = Path("calibration_data/phrases/v1/customer_service.txt").read_text(encoding="utf-8").splitlines()[:5]
phrases.write_text("\n".join(lines) + "\n", encoding="utf-8")
cache = work / "phrase_cache.bin"
build_phrase_cache(vdir, phrases, cache, SynthParams(code=InferCodeParams(seed=0, max_new_token=96)), threads=2)
publish_version_files(vdir, cache_file=cache)
print(f"version {vdir} in {time.time() - t0:.0f} s")
