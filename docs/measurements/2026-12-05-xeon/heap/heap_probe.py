"""Run `chattts-forge serve ARGS` in this process, sampling every 5 s its RSS and glibc's heap
(`mallinfo2`: arena = bytes the heaps hold, inuse = allocated, free = held but free, mmap = large
blocks mapped on their own) into $PROBE_OUT (JSON lines, MiB). TRIM_EVERY=S (environment): call
`malloc_trim(0)` every S seconds and record the RSS after it and the call's milliseconds.
HEAP_TRIM_S=S: the server's own heap trim interval (ServeConfig.heap_trim_s; 0: off), which serve has
no option for.

    PROBE_OUT=heap.jsonl TRIM_EVERY=60 python heap_probe.py --artifact V --port 8000
"""

import ctypes
import json
import os
import sys
import threading
import time

FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
out = open(os.environ["PROBE_OUT"], "w")  # noqa: SIM115 - open for the process's life
trim_every = float(os.environ.get("TRIM_EVERY", "0"))


def rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


def sample() -> None:
    t0 = last_trim = time.time()
    while True:
        m = libc.mallinfo2()
        rec = {"t": round(time.time() - t0, 1), "rss": rss_mib(), "arena": m.arena >> 20, "inuse": m.uordblks >> 20,
               "free": m.fordblks >> 20, "mmap": m.hblkhd >> 20, "threads": threading.active_count(),
               "nthreads": len(os.listdir("/proc/self/task"))}
        if trim_every and time.time() - last_trim >= trim_every:
            t = time.perf_counter()
            libc.malloc_trim(0)
            rec["trim_ms"] = round(1000 * (time.perf_counter() - t), 1)
            rec["rss_after_trim"] = rss_mib()
            last_trim = time.time()
        out.write(json.dumps(rec) + "\n")
        out.flush()
        time.sleep(5)


threading.Thread(target=sample, daemon=True).start()
import chattts_forge.runtime.serve.cli as serve_cli  # noqa: E402 - the sampler starts first
from chattts_forge.cli import main  # noqa: E402

if "HEAP_TRIM_S" in os.environ:
    config_of = serve_cli.serve_config

    def serve_config(options: dict) -> object:
        cfg = config_of(options)
        cfg.heap_trim_s = float(os.environ["HEAP_TRIM_S"])
        return cfg

    serve_cli.serve_config = serve_config

sys.argv = ["chattts-forge", "serve", *sys.argv[1:]]
main()
