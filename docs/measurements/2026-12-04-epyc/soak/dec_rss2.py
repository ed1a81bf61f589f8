"""dec_rss.py with an onnxruntime session option changed: python dec_rss2.py nopattern|noarena ARTIFACT N."""
import runpy
import sys

import onnxruntime as ort

mode = sys.argv.pop(1)
orig = ort.SessionOptions
def patched():
    o = orig()
    if mode == "noarena":
        o.enable_cpu_mem_arena = False
    if mode == "nopattern":
        o.enable_mem_pattern = False
    return o
ort.SessionOptions = patched
import chattts_forge.runtime.session as S  # noqa: E402 - after the patch

if mode == "noarena":  # no arena: nothing to shrink
    S.SHRINK_ARENA_COMPONENTS = frozenset()
runpy.run_path(str(__import__("pathlib").Path(__file__).with_name("dec_rss.py")), run_name="__main__")
