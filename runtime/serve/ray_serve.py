"""`chattts-forge serve --ray ADDRESS|local --replicas N`: the same app as a Ray Serve deployment.

Each replica is a Ray actor that builds the server's `ServerState` from the same `ServeConfig`
(loading, verifying and warming the version before Ray Serve counts it as started) and serves the
same Starlette app (`create_app`) behind Ray Serve's HTTP proxy, which listens on `--host/--port`
and spreads requests over the replicas; responses stream through the proxy chunk by chunk. Each
replica has its own schedulers, phrase cache and /metrics (Ray Serve sends a request to one
replica); `--cache-redis` shares the cache between them. The artifact path must exist on every
node that runs a replica. Needs the `scale` extra (Ray with Ray Serve's dependencies).
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from typing import Any

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.raycluster import SCALE_HINT, connect
from chattts_forge.runtime.serve.config import ServeConfig, ensure_admin_token

log = get_logger(__name__)

APP_NAME = "chattts-forge"
DEPLOYMENT_NAME = "ChatTTSForgeServer"


def import_serve() -> Any:
    """`ray.serve`, or a one-line error naming the extra (it also needs fastapi and grpcio-reflection)."""
    try:
        from ray import serve
    except ImportError as e:
        raise ForgeError(f"--ray needs Ray Serve, which cannot be imported ({str(e).splitlines()[0]}; "
                         f"{SCALE_HINT})") from None
    return serve


class ForgeReplica:
    """One replica: the server's state, loaded before the replica answers (Ray Serve then routes to it)."""

    def __init__(self, cfg_fields: dict[str, Any]) -> None:
        from chattts_forge.runtime.serve.state import ServerState

        self.state = ServerState(ServeConfig(**cfg_fields))
        self.state.load_initial()
        if self.state.load_error is not None:  # Ray Serve marks the replica failed and says why
            raise ForgeError(f"cannot serve {self.state.cfg.artifact}: {self.state.load_error}")

    def __serve_build_asgi_app__(self) -> Any:
        from chattts_forge.runtime.serve.app import create_app

        # the app's lifespan closes the state's schedulers when Ray Serve stops the replica
        return create_app(self.state, load_in_background=False)


def build_application(cfg: ServeConfig, replicas: int, replica_cpus: float = 1.0) -> Any:
    """The bound Ray Serve application of `replicas` replicas serving `cfg`."""
    serve = import_serve()
    ingress = serve.ingress()(ForgeReplica)
    deployment = serve.deployment(name=DEPLOYMENT_NAME, num_replicas=replicas,
                                  ray_actor_options={"num_cpus": replica_cpus},
                                  graceful_shutdown_timeout_s=max(1.0, cfg.drain_s))(ingress)
    ensure_admin_token(cfg)  # here, not per replica: every replica takes the same token
    return deployment.bind(dataclasses.asdict(cfg))


def start_ray_serve(cfg: ServeConfig, address: str, replicas: int) -> Any:
    """Join (or start, "local") the cluster, start Ray Serve's proxy on cfg.host:cfg.port and run the
    application; returns once every replica is loaded (`ray.serve`, for `stop_ray_serve`).

    Each replica reserves one CPU, or an equal share of the cluster's CPUs when it has fewer than
    `replicas` (so `--ray local --replicas 4` on two cores starts, oversubscribed, instead of waiting)."""
    if replicas < 1:
        raise BadInput(f"--replicas must be >= 1, got {replicas}")
    serve = import_serve()
    ray = connect(address)
    replica_cpus = min(1.0, float(ray.cluster_resources().get("CPU", 1.0)) / replicas)
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    log.info("Ray Serve: starting %d replica(s) of %s (%.2g CPU reserved each)", replicas, cfg.artifact, replica_cpus)
    try:
        serve.run(build_application(cfg, replicas, replica_cpus), name=APP_NAME, route_prefix="/")
    except Exception as e:  # Ray raises its own types for a deployment whose replicas failed
        stop_ray_serve(address)
        raise ForgeError(f"Ray Serve could not start {cfg.artifact}: {str(e).strip().splitlines()[-1]}") from None
    return serve


def stop_ray_serve(address: str) -> None:
    """Delete the application (replicas drain up to the graceful-shutdown timeout); on a cluster of
    our own ("local") also stop Ray Serve (on a shared one, other applications keep running)."""
    serve = import_serve()
    serve.delete(APP_NAME)
    if address == "local":
        serve.shutdown()


def serve_on_ray(cfg: ServeConfig, address: str, replicas: int) -> None:
    """`serve --ray`: run until SIGTERM/SIGINT, then delete the deployment (a bounded drain) and exit."""
    start_ray_serve(cfg, address, replicas)
    log.info("serving %s on http://%s:%d through Ray Serve (%d replica(s), cluster %s)", cfg.artifact, cfg.host,
             cfg.port, replicas, address)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("stopping: deleting the Ray Serve application (replicas drain up to %.0f s)", cfg.drain_s)
    stop_ray_serve(address)
