"""Joining a Ray cluster (the optional `scale` extra): `evaluate --ray` and `make artifacts RAY=...`.

Nothing imports `ray` at module level: without the extra, every other command works and `--ray` is a
one-line error saying how to install it.
"""

from __future__ import annotations

from typing import Any

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger

log = get_logger(__name__)

SCALE_HINT = "pip install 'chattts-forge[scale]'"


def import_ray() -> Any:
    """The `ray` module, or a one-line error saying how to install it."""
    try:
        # ray: only with --ray; 0.46 s to import
        import ray
    except ImportError:
        raise BadInput(f"--ray needs Ray, which is not installed ({SCALE_HINT})") from None
    return ray


def connect(address: str) -> Any:
    """Join the Ray cluster at `address` ("local": start one on this machine; reuse an initialized one)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    try:
        if address == "local":
            # A single-node cluster for this process only; it stops when the process ends.
            ray.init(address="local", include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ForgeError(f"cannot connect to the Ray cluster at {address}: {first}") from None
    log.info("joined Ray cluster at %s (%s CPUs)", address, ray.cluster_resources().get("CPU"))
    return ray
