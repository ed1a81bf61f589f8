"""Run the app with uvicorn: SIGTERM drains, SIGHUP reloads.

SIGTERM (and SIGINT): readiness turns 503 and new speech requests are refused (503) at once, uvicorn
stops accepting connections and lets the open ones finish for at most `drain_s` seconds, then the
schedulers close and the process exits. SIGHUP: reload the `--artifact` path (e.g. a `current`
symlink switched to a new version), as `POST /admin/reload` does; a failed reload is logged and the
old version keeps serving.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import threading
from collections.abc import Iterator
from typing import Any

from chattts_forge.errors import ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.heap import cap_malloc_arenas
from chattts_forge.runtime.serve.app import create_app
from chattts_forge.runtime.serve.config import ServeConfig
from chattts_forge.runtime.serve.guard import MAX_RETRY_AFTER_S
from chattts_forge.runtime.serve.state import ServerState, work_threads

log = get_logger(__name__)
KEEP_ALIVE_S = MAX_RETRY_AFTER_S + 5  # seconds an idle client connection stays open


def make_server(cfg: ServeConfig, state: ServerState | None = None, install_signals: bool = True) -> Any:
    """A uvicorn Server for `cfg` (its `.forge_state` is the ServerState)."""
    try:
        import uvicorn
    except ModuleNotFoundError:
        raise ForgeError("serve needs the serve extra: pip install 'chattts-forge[serve]'") from None
    state = state or ServerState(cfg)
    app = create_app(state)

    class ForgeServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own re-raises SIGTERM after the graceful shutdown (the process would then die of
            # it); a drained server exits 0 instead. SIGHUP reloads.
            if not install_signals or threading.current_thread() is not threading.main_thread():
                yield
                return
            handlers = {signal.SIGINT: self.handle_exit, signal.SIGTERM: self.handle_exit,
                        signal.SIGHUP: lambda *_: threading.Thread(target=_sighup, daemon=True).start()}
            original = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
            try:
                yield
            finally:
                for sig, h in original.items():
                    signal.signal(sig, h)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not state.draining:
                log.info("signal %d: draining (refusing new requests; open streams get %.0f s)", sig, cfg.drain_s)
            state.draining = True
            super().handle_exit(sig, frame)

    def _sighup() -> None:
        log.info("SIGHUP: reloading %s", cfg.artifact)
        try:
            state.reload(cfg.artifact)
        except ForgeError as e:
            log.error("%s", e)

    # log_config=None: uvicorn's records go through the process's own handlers (one format, control
    # characters escaped: log.EscapingFormatter) instead of a handler of its own.
    # Keep-alive past the longest Retry-After: a client that honours one comes back on its connection;
    # uvicorn's 5 s closed it as the client sent (the overload soak lost requests to that race).
    # The h11 protocol with a header timeout, a connection bound and JSON errors (serve.connections).
    # X-Forwarded-For/-Proto are trusted from `forwarded_allow_ips` only (docs/serving.md "Behind a proxy").
    from chattts_forge.runtime.serve.connections import ForgeH11Protocol

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False, log_config=None,
                            timeout_graceful_shutdown=max(1, int(cfg.drain_s)), lifespan="on",
                            timeout_keep_alive=KEEP_ALIVE_S, http=ForgeH11Protocol, proxy_headers=True,
                            forwarded_allow_ips=cfg.forwarded_allow_ips)
    config.forge_header_timeout_s = cfg.header_timeout_s  # type: ignore[attr-defined]
    config.forge_max_connections = _connection_bound(cfg.max_connections)  # type: ignore[attr-defined]
    config.forge_on_refusal = lambda kind: state.metrics.connections_refused.labels(kind=kind).inc()  # type: ignore[attr-defined]
    server = ForgeServer(config)
    server.forge_state = state  # type: ignore[attr-defined]
    return server


FD_RESERVE = 128  # descriptors kept for what is not a client connection: models, logs, threads, Redis


def _connection_bound(wanted: int) -> int:
    """`wanted`, within what the process's open-file limit allows: the soft limit is raised to the hard
    one when needed, and the bound lowered (with a warning) when even that is too few."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < need:
        bound = max(1, soft - FD_RESERVE)
        log.warning("open-file limit %d leaves room for %d connections, not --max-connections %d", soft, bound, wanted)
        return bound
    return wanted


def serve(cfg: ServeConfig) -> None:
    """Serve until SIGTERM/SIGINT; ForgeError when the artifact cannot be loaded."""
    cap_malloc_arenas(work_threads())  # before any thread allocates: one working set, few arenas
    server = make_server(cfg)
    state: ServerState = server.forge_state

    def watch_load() -> None:  # an artifact that fails to load ends the server (one line, exit 2)
        while not state.ready and state.load_error is None:
            threading.Event().wait(0.2)
        if state.load_error is not None:
            server.should_exit = True

    threading.Thread(target=watch_load, daemon=True).start()
    log.info("serving %s on http://%s:%d (max batch %d, queue %d)", cfg.artifact, cfg.host, cfg.port,
             cfg.max_batch, cfg.max_queue)
    server.run()
    if state.load_error is not None:
        raise ForgeError(f"cannot serve {cfg.artifact}: {state.load_error}")
