"""`serve --ray`: the same app as a Ray Serve deployment on a real local Ray cluster (the `scale` extra).

The cluster is started here (`ray.init(address="local")`, 2 CPUs, no dashboard, loopback only) with
three replicas (each reserves a share of the 2 CPUs) behind Ray Serve's HTTP proxy; the same
requests (fixed seeds) are sent through the proxy and to a plain `chattts-forge serve` server of the
same version, one at a time, and must give the same bytes, whole (wav) and streamed (pcm).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the scale extra (Ray) is not installed")
pytest.importorskip("ray.serve", reason="Ray Serve's dependencies (fastapi, grpcio-reflection) are not installed",
                    exc_type=ImportError)
httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
pytest.importorskip("starlette", reason="serve needs the serve extra")

from stand_in_report import publish_stand_in_version  # noqa: E402

from chattts_forge.errors import ForgeError  # noqa: E402
from chattts_forge.runtime.serve.config import ServeConfig  # noqa: E402
from chattts_forge.runtime.serve.ray_serve import start_ray_serve, stop_ray_serve  # noqa: E402
from chattts_forge.runtime.serve.server import make_server  # noqa: E402

REQUESTS = [
    {"input": "Please hold on a moment.", "voice": "alloy", "seed": 3, "max_new_token": 20, "response_format": "wav",
     "stream": False},
    {"input": "请稍等。", "voice": "default", "seed": 7, "max_new_token": 30, "response_format": "pcm"},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready after {timeout} s")


@pytest.fixture(scope="module")
def version(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return publish_stand_in_version(tiny_artifacts, tmp_path_factory.mktemp("ray-version"), {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)}})


@pytest.fixture(scope="module")
def plain(version: Path) -> Iterator[str]:
    server = make_server(ServeConfig(artifact=str(version), port=free_port(), threads=1, drain_s=2),
                         install_signals=False)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}"
    wait_ready(url)
    yield url
    server.should_exit = True
    thread.join(timeout=60)


@pytest.fixture(scope="module")
def ray_url(version: Path) -> Iterator[str]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    cfg = ServeConfig(artifact=str(version), port=free_port(), threads=1, drain_s=2)
    try:
        start_ray_serve(cfg, "local", replicas=3)  # 3 on 2 CPUs: each reserves a share of them
        url = f"http://127.0.0.1:{cfg.port}"
        wait_ready(url)
        yield url
        stop_ray_serve("local")
    finally:
        ray.shutdown()


def speech(url: str, body: dict) -> tuple[bytes, dict[str, str]]:
    with httpx.stream("POST", url + "/v1/audio/speech", json={"model": "tts-1", **body}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return b"".join(r.iter_bytes()), dict(r.headers)


def test_ray_serve_replicas_answer_what_the_plain_server_answers(ray_url: str, plain: str) -> None:
    from ray import serve

    status = serve.status().applications["chattts-forge"]
    [deployment] = status.deployments.values()
    assert deployment.replica_states.get("RUNNING") == 3
    for body in REQUESTS:
        via_ray, headers = speech(ray_url, body)
        direct, _ = speech(plain, body)
        assert len(direct) > 1000 and via_ray == direct, body["input"]
        assert headers["x-forge-variant"] == "fp32" and headers["content-type"].startswith("audio/")
    # A bad body is refused by the replica with the server's one-line error, through the proxy.
    r = httpx.post(ray_url + "/v1/audio/speech", json={"model": "tts-1", "input": ""}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert "forge_sentences_total" in httpx.get(ray_url + "/metrics", timeout=30).text


def test_ray_serve_refuses_zero_replicas(version: Path) -> None:
    with pytest.raises(ForgeError, match="--replicas must be >= 1"):
        start_ray_serve(ServeConfig(artifact=str(version)), "local", replicas=0)


def test_replicas_without_ray_is_a_one_line_error(version: Path) -> None:
    from click.testing import CliRunner

    from chattts_forge.cli import main

    result = CliRunner().invoke(main, ["serve", "--artifact", str(version), "--replicas", "2"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == (
        "error: --replicas needs --ray (one server process serves one replica)")
