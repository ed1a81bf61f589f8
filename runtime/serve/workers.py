"""`serve --workers N`: N server processes accepting on one listening socket.

The parent binds the socket once and starts the workers one after another, each a fresh
interpreter (multiprocessing "spawn": no onnxruntime thread pool is forked) running the same
uvicorn server on the inherited socket; the kernel hands each connection to one of them. A worker
starts when the previous one is ready, so on a host that has not seen the version the first one
hashes the files and saves the optimized sessions (runtime.saved_sessions) and the next ones load
those: the saved graphs' weight pages are mapped from the same files, shared between the workers
(docs/measurements/2026-12-03-epyc/coldstart.md has the PSS of the pair). Without `--threads` each
worker takes cores / N onnxruntime threads.

Signals: SIGTERM/SIGINT and SIGHUP go to every worker (each drains or reloads as a single server
does). A worker that exits ends the others; the command's exit status is the first failure's.
/readyz, /metrics and /admin/* are answered by whichever worker gets the connection (each reports
its own state); the parent logs when all are ready.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
from dataclasses import replace
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.serve.config import ServeConfig

log = get_logger(__name__)


def worker_threads(cfg: ServeConfig, workers: int) -> int | None:
    """onnxruntime threads per worker: --threads, else the cores shared out (at least one each)."""
    if cfg.threads is not None or workers == 1:
        return cfg.threads
    return max(1, (os.cpu_count() or 1) // workers)


def bind_socket(host: str, port: int) -> socket.socket:
    """The one listening socket every worker accepts on (as uvicorn binds its own)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ForgeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _worker(cfg: ServeConfig, sock: socket.socket, ready: Any, index: int) -> None:
    """One worker: the single-process server on the shared socket; sets `ready` once it serves."""
    from chattts_forge.log import setup_logging
    from chattts_forge.runtime.serve.server import make_server

    setup_logging()
    server = make_server(cfg)
    state = server.forge_state

    def watch() -> None:
        while not state.ready and state.load_error is None:
            threading.Event().wait(0.1)
        if state.load_error is not None:
            server.should_exit = True
        else:
            ready.set()

    threading.Thread(target=watch, daemon=True).start()
    log.info("worker %d (pid %d) serving %s", index, os.getpid(), cfg.artifact)
    server.run(sockets=[sock])
    if state.load_error is not None:
        raise SystemExit(2)


def serve_workers(cfg: ServeConfig, workers: int) -> None:
    """Serve `cfg` with `workers` processes on one socket until SIGTERM/SIGINT (see the module docstring)."""
    if workers < 1:
        raise ForgeError(f"--workers must be >= 1, got {workers}")
    cfg = replace(cfg, threads=worker_threads(cfg, workers))
    sock = bind_socket(cfg.host, cfg.port)
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    stopping = threading.Event()

    def forward(sig: int, frame: Any) -> None:
        if sig != signal.SIGHUP:
            stopping.set()
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, sig)

    original = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    failed: int | None = None
    try:
        log.info("serving %s on http://%s:%d with %d workers (%s onnxruntime threads each)", cfg.artifact, cfg.host,
                 sock.getsockname()[1], workers, cfg.threads if cfg.threads is not None else "default")
        for i in range(workers):
            ready = ctx.Event()
            proc = ctx.Process(target=_worker, args=(cfg, sock, ready, i), name=f"forge-worker-{i}", daemon=False)
            proc.start()
            procs.append(proc)
            # the next worker starts once this one serves: it then loads the saved sessions this one wrote
            while not ready.wait(0.2):
                if not proc.is_alive() or stopping.is_set():
                    break
            if not proc.is_alive():
                failed = proc.exitcode or 2
                break
            if stopping.is_set():
                break
        else:
            log.info("all %d workers ready", workers)
        while failed is None and not stopping.is_set():
            for p in procs:
                p.join(timeout=0.5 / len(procs))
                if p.exitcode is not None:
                    failed = p.exitcode if p.exitcode != 0 or not stopping.is_set() else None
                    if not stopping.is_set():
                        log.error("worker %s exited (status %s): stopping the others", p.name, p.exitcode)
                    break
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join(timeout=cfg.drain_s + 10)
            if p.is_alive():
                p.kill()
                p.join()
        for s, h in original.items():
            signal.signal(s, h)
        sock.close()
    if failed:
        raise ForgeError(f"cannot serve {cfg.artifact}: a worker exited with status {failed} (its log says why)")
