"""Run `chattts-forge serve ARGS` in this process and report what only the garbage collector frees.

GC_AFTER seconds after start (default 40) the probe collects once, then keeps every object that the
next GC_WINDOW seconds (default 30) leave in reference cycles (gc.DEBUG_SAVEALL), collects again and
writes GC_OUT (JSON): the count of cyclic objects, their types, and the exceptions among them. Drive
the server with `chattts-forge bench --soak` meanwhile:

    GC_OUT=gc.json GC_AFTER=15 GC_WINDOW=40 python gc_probe.py --artifact V --port 8871 --admin-loopback
"""
import collections
import gc
import json
import os
import sys
import threading
import time

after = float(os.environ.get("GC_AFTER", "40"))
out = os.environ["GC_OUT"]

def probe() -> None:
    time.sleep(after)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    time.sleep(float(os.environ.get("GC_WINDOW", "30")))
    gc.collect()
    gc.set_debug(0)
    garbage = list(gc.garbage)
    # numpy arrays are not tracked by the collector: they never show here, but die with what holds them
    types = collections.Counter(type(o).__qualname__ for o in garbage)
    errors = collections.Counter(f"{type(o).__name__}: {str(o)[:80]}" for o in garbage if isinstance(o, BaseException))
    with open(out, "w") as f:
        json.dump({"objects": len(garbage), "types": types.most_common(40), "exceptions": errors.most_common(40)},
                  f, indent=1)
    gc.garbage.clear()


threading.Thread(target=probe, daemon=True).start()
from chattts_forge.cli import main  # noqa: E402

sys.argv = ["chattts-forge", "serve", *sys.argv[1:]]
main()
