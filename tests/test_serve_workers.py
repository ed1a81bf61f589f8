"""`serve --workers N` (issue 36 item 4): N processes accepting on one socket, signals forwarded.

Mechanism only (which processes serve, that every request is answered, that SIGTERM ends them all);
the memory shared between the workers and what they do for throughput are measured in
docs/measurements/2026-12-03-epyc/coldstart.md, never asserted.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from stand_in_report import publish_stand_in_version

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
pytest.importorskip("uvicorn", reason="serve needs the serve extra")

from chattts_forge.cli import main  # noqa: E402
from chattts_forge.runtime.serve.config import ServeConfig  # noqa: E402
from chattts_forge.runtime.serve.workers import worker_threads  # noqa: E402

STEPS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
        return [int(c) for c in f.read().split()]


def listening_inodes(pid: int) -> set[str]:
    """The socket inodes a process holds open (the shared listening socket is one of them)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:"):
                out.add(target)
    return out


def test_two_workers_share_the_port_and_stop_on_sigterm(tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    version = publish_stand_in_version(tiny_artifacts, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (True, 1.0), "long": (True, 1.0)}})
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact", str(version),
                                 "--port", str(port), "--workers", "2", "--drain", "5"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while "all 2 workers ready" not in log.read_text() and time.time() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        assert "all 2 workers ready" in text and "with 2 workers (1 onnxruntime threads each)" in text
        shared = listening_inodes(proc.pid)
        # the worker processes: the children that hold the parent's listening socket
        live = [w for w in children(proc.pid) if listening_inodes(w) & shared]
        assert len(live) == 2

        body = {"model": "tts-1", "input": "请稍等", "voice": "alloy", "response_format": "wav",
                "max_new_token": STEPS, "min_new_token": STEPS, "refine": False}

        def speak(_: int) -> int:
            r = httpx.post(url + "/v1/audio/speech", json=body, timeout=120)
            return r.status_code if r.content[:4] == b"RIFF" else -1

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(speak, range(8))) == [200] * 8
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for w in live:  # every worker ended with the command
            assert not Path(f"/proc/{w}").exists() or "zombie" in Path(f"/proc/{w}/status").read_text().lower()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_that_cannot_load_ends_the_command(tmp_path: Path) -> None:
    folder = tmp_path / "v"
    folder.mkdir()
    (folder / "routing.json").write_text("{}", encoding="utf-8")  # passes the CLI's check, fails the load
    res = subprocess.run([sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact", str(folder), "--port",
                          str(free_port()), "--workers", "2", "--admin-loopback"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert res.returncode == 2 and "a worker exited with status 2" in res.stderr.splitlines()[-1]


def test_workers_options() -> None:
    assert worker_threads(ServeConfig(artifact="x", threads=3), 2) == 3
    assert worker_threads(ServeConfig(artifact="x"), 1) is None
    assert worker_threads(ServeConfig(artifact="x"), 2) == max(1, (os.cpu_count() or 1) // 2)
    res = CliRunner().invoke(main, ["serve", "--artifact", "/nonexistent", "--workers", "0"])
    assert res.exit_code == 2 and "--workers" in res.output
