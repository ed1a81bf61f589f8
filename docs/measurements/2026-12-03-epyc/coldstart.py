"""Cold start of the runtime, per phase, timed from process start (issue 36).

    python coldstart.py phases TARGET --text T --steps N [--variant V] [--threads 2] [--refine]
        one fresh process: the stamps of every phase since this process was started (the parent's
        CLOCK_MONOTONIC when it launched us, COLDSTART_T0; else this interpreter's first line) and the
        process's CPU seconds at each (cpu_*: on a loaded machine the wall clock waits for a core), JSON
    python coldstart.py runs TARGET --text T --steps N [--variant V] [--fresh] [--reps 5] [--cache DIR]
        `phases` in REPS fresh processes, each with the host caches (verified hashes, autotune) of DIR
        ($XDG_CACHE_HOME); --fresh: an empty cache folder for every run (a host that never saw the version)
    python coldstart.py serve TARGET [--fresh] [--reps 3] [--port 8931] [--warm-phrases N]
        `chattts-forge serve` started REPS times: seconds to /readyz 200 and to the first reply (one
        short /v1/audio/speech request), and its RSS then (serve's --warm-phrases: 0 unless given)
    python coldstart.py workers TARGET [--reps 3] [--requests 16] [--concurrency 4]     # at commit ffee273 (serve --workers)
        `serve` (one process) and `serve --workers 2`, interleaved REPS times on the same host cache:
        PSS of all its processes (/proc/PID/smaps_rollup) once every worker is ready and warm, then
        REQUESTS short requests at CONCURRENCY: sentences/s and the processes' CPU seconds

TARGET: a published version folder (routing.json) or one variant folder. Figures are medians over the
runs with min and max; the machine's load at the time matters (see README.md beside this file).
"""

from __future__ import annotations

import time

_T_SCRIPT = time.monotonic()  # before any import of ours

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402


def _rss_mb(pid: int | str = "self") -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def phases(args: argparse.Namespace) -> None:
    t0 = float(os.environ.get("COLDSTART_T0", _T_SCRIPT))
    stamps: dict[str, float] = {"python_up": _T_SCRIPT - t0}

    def stamp(name: str) -> None:
        stamps[name] = time.monotonic() - t0
        stamps[f"cpu_{name}"] = time.process_time()  # this process's CPU seconds (every thread) so far

    import numpy  # noqa: F401

    stamp("import_numpy")
    import onnxruntime  # noqa: F401

    stamp("import_onnxruntime")
    from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, RefineTextParams, SynthParams
    from chattts_forge.runtime.router import ROUTING_NAME, Router

    stamp("import_runtime")
    target = Path(args.target)
    kwargs = {"threads": args.threads}
    info: dict[str, object] = {}
    if (target / ROUTING_NAME).is_file():
        router = Router(target, variant=args.variant, **kwargs)
        stamp("router_autotune")
        info["autotune"] = router.autotune["source"]
        variant = router.route(args.text)[0]
        stamp("front_route")
        pipe = router.pipeline(variant)
    else:
        variant = target.name
        pipe = Pipeline(target, **kwargs)
    stamp("integrity")
    info["variant"] = variant
    info["verification"] = pipe.artifact.verification.summary()
    order = ["embed", pipe.engine == "fast" and "gpt_fast" or "gpt", "head_code", "decoder", "vocos"]
    if args.refine:
        order.insert(3, "head_text")
    for name in order:
        pipe.artifact.session(name)
        stamp(f"session_{name}")
    if pipe.engine == "fast":
        pipe.gpt  # noqa: B018 - the fused step's IO binding and KV buffers
        stamp("gpt_step_ready")
    params = SynthParams(code=InferCodeParams(seed=0, max_new_token=args.steps, min_new_token=args.steps),
                         refine=RefineTextParams(seed=0) if args.refine else None)
    first = None
    for chunk in pipe.stream([args.text], params):
        if first is None and any(len(c) for c in chunk):
            first = True
            stamp("first_audio")
    stamp("all_audio")
    stamps.update({f"rss_{k}": v for k, v in _rss_mb().items()})
    print(json.dumps({"stamps": stamps, **info}))


def _summary(rows: list[dict[str, float]]) -> dict[str, list[float]]:
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    return {k: [round(min(r[k] for r in rows), 3), round(statistics.median(r[k] for r in rows), 3),
                round(max(r[k] for r in rows), 3)] for k in keys}


def runs(args: argparse.Namespace) -> None:
    base = [sys.executable, __file__, "phases", args.target, "--text", args.text, "--steps", str(args.steps),
            "--threads", str(args.threads)] + (["--variant", args.variant] if args.variant else []) + \
        (["--refine"] if args.refine else [])
    rows, infos = [], []
    for _ in range(args.reps):
        cache = tempfile.mkdtemp(prefix="coldstart-cache-") if args.fresh else args.cache
        env = {**os.environ, "XDG_CACHE_HOME": cache, "COLDSTART_T0": repr(time.monotonic())}
        out = subprocess.run(base, env=env, check=True, capture_output=True, text=True).stdout
        record = json.loads(out.strip().splitlines()[-1])
        rows.append(record.pop("stamps"))
        infos.append(record)
        if args.fresh:
            shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps({"runs": len(rows), "fresh": args.fresh, "first": infos[0],
                      "stamps_min_median_max": _summary(rows)}, indent=1))


def serve(args: argparse.Namespace) -> None:
    import httpx

    rows = []
    for _ in range(args.reps):
        cache = tempfile.mkdtemp(prefix="coldstart-cache-") if args.fresh else args.cache
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact", args.target,
                                 "--port", str(args.port), "--threads", str(args.threads),
                                 "--warm-phrases", str(args.warm_phrases)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{args.port}"
        try:
            while True:
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit(f"serve exited with {proc.returncode}")
                time.sleep(0.02)
            ready = time.monotonic() - t0
            r = httpx.post(url + "/v1/audio/speech", timeout=300, json={
                "model": "tts-1", "input": args.text, "voice": "alloy", "response_format": "wav",
                "max_new_token": args.steps, "min_new_token": args.steps, "refine": False})
            r.raise_for_status()
            rows.append({"readyz": ready, "first_reply": time.monotonic() - t0, **_rss_mb(proc.pid)})
        finally:
            proc.terminate()
            proc.wait(60)
            if args.fresh:
                shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps({"runs": len(rows), "fresh": args.fresh, "min_median_max": _summary(rows)}, indent=1))


def _pss_mb(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            if line.startswith(("Pss:", "Pss_Anon:", "Pss_File:", "Rss:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children", encoding="ascii") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return pids


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for p in pids:
        with open(f"/proc/{p}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / os.sysconf("SC_CLK_TCK")


def workers(args: argparse.Namespace) -> None:
    import concurrent.futures

    import httpx

    url = f"http://127.0.0.1:{args.port}"
    body = {"model": "tts-1", "input": args.text, "voice": "alloy", "response_format": "wav",
            "max_new_token": args.steps, "min_new_token": args.steps, "refine": False}

    def one(_: int) -> float:
        t = time.monotonic()
        httpx.post(url + "/v1/audio/speech", timeout=600, json=body).raise_for_status()
        return time.monotonic() - t

    rows: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(args.reps):
        for n in (1, 2):
            cmd = [sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact", args.target, "--port",
                   str(args.port), "--warm-phrases", "0"] + (["--workers", str(n)] if n > 1 else [])
            env = {**os.environ, "XDG_CACHE_HOME": args.cache}
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                want = "all 2 workers ready" if n > 1 else "loaded "
                assert proc.stderr is not None
                for line in proc.stderr:  # the log line that says every worker serves
                    if want in line:
                        break
                else:
                    raise SystemExit(f"serve --workers {n} exited with {proc.wait()}")
                threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
                ready = time.monotonic() - t0
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    list(pool.map(one, range(args.concurrency * 2)))  # every worker has served (warm)
                pids = _tree(proc.pid)
                pss = [_pss_mb(p) for p in pids]
                cpu0, t1 = _cpu_s(pids), time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    latencies = list(pool.map(one, range(args.requests)))
                wall = time.monotonic() - t1
                rows[n].append({"ready_s": ready, "processes": len(pids),
                                "pss_mb": sum(p["Pss"] for p in pss), "pss_anon_mb": sum(p["Pss_Anon"] for p in pss),
                                "pss_file_mb": sum(p["Pss_File"] for p in pss), "rss_mb": sum(p["Rss"] for p in pss),
                                "sentences_per_s": args.requests / wall, "wall_s": wall,
                                "cpu_s": _cpu_s(pids) - cpu0, "latency_p50_s": statistics.median(latencies)})
                print(json.dumps({"workers": n, **rows[n][-1]}), file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(120)
    print(json.dumps({"reps": args.reps, "requests": args.requests, "concurrency": args.concurrency,
                      "load_average": os.getloadavg(),
                      "one_process": _summary(rows[1]), "two_workers": _summary(rows[2])}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["phases", "runs", "serve", "workers"])
    ap.add_argument("target")
    ap.add_argument("--text", default="Hello there, how are you?")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--refine", action="store_true")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cache", default=os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
    ap.add_argument("--port", type=int, default=8931)
    ap.add_argument("--warm-phrases", type=int, default=0)  # serve: phrase-cache entries warmed before ready
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    {"phases": phases, "runs": runs, "serve": serve, "workers": workers}[args.mode](args)


if __name__ == "__main__":
    main()
