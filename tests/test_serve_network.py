"""Issue 49: a server that can face a network. Slow and stalled clients are closed at the header
timeout and give their descriptors back while healthy requests go on; connections past the bound
get a clean 503; malformed HTTP gets the JSON error; web pages of other sites cannot make it work
(a foreign Origin is refused unless --cors-origin allows it, then with CORS headers; a body not
declared JSON is refused); the bearer scheme is case-insensitive; SIGTERM under mixed traffic drains
and exits 0, again and again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
pytest.importorskip("starlette", reason="serve needs the serve extra")
pytest.importorskip("uvicorn", reason="serve needs the serve extra")

from test_serve import Running, free_port, running  # noqa: E402  (the real uvicorn server in a thread)
from test_serve_edges import wait_ready  # noqa: E402

SPEECH = "/v1/audio/speech"
QUICK = {"model": "tts-1", "input": "Hi there.", "voice": "alloy", "response_format": "wav", "max_new_token": 6,
         "refine": False}


def open_fds(srv: Running) -> float:
    return srv.metric("forge_open_fds")


def recv_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """What the server sent before it closed `sock` (socket.timeout if it did not within `timeout`)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_slow_headers_are_closed_at_the_header_timeout_and_fds_return(tiny_artifacts: dict[str, Path]) -> None:
    with running(tiny_artifacts["fp32"], header_timeout_s=1.0) as srv:
        idle = open_fds(srv)
        socks = []
        for i in range(300):  # half never send a byte, half stop in the middle of their headers
            s = socket.create_connection(("127.0.0.1", srv.cfg.port))
            if i % 2:
                s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
            socks.append(s)
        trickler = socket.create_connection(("127.0.0.1", srv.cfg.port))
        assert open_fds(srv) >= idle + 300
        # a healthy request is served while the half-open connections are held
        r = httpx.post(srv.url + SPEECH, json=QUICK, timeout=60)
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        t0 = time.monotonic()
        trickled = 0
        with contextlib.suppress(OSError):  # one header byte at a time never buys more time
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                trickler.send(bytes([byte]))
                trickled += 1
                time.sleep(0.05)
        assert time.monotonic() - t0 < 3.0 and trickled < 100
        answers = [recv_until_closed(s, timeout=5) for s in socks]
        for s in socks:
            s.close()
        trickler.close()
        assert all(a == b"" for a in answers[0::2])  # nothing sent: closed silently
        for a in answers[1::2]:  # headers begun: a 408 with the JSON error, then closed
            head, _, body = a.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "header_timeout"
        deadline = time.monotonic() + 10
        while open_fds(srv) > idle + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert open_fds(srv) <= idle + 2
        assert srv.metric("forge_connections_refused_total", kind="header_timeout") >= 301


def test_connections_past_the_bound_get_a_clean_503(tiny_artifacts: dict[str, Path]) -> None:
    with running(tiny_artifacts["fp32"], max_connections=20, header_timeout_s=30.0) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.cfg.port)) for _ in range(20)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", srv.cfg.port))
        head, _, body = recv_until_closed(extra, timeout=5).partition(b"\r\n\r\n")
        extra.close()
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(srv.url + SPEECH, json=QUICK, timeout=60).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("no request served after the held connections closed")
        assert srv.metric("forge_connections_refused_total", kind="too_many_connections") >= 1


def test_malformed_http_gets_the_json_error(tiny_artifacts: dict[str, Path]) -> None:
    with running(tiny_artifacts["fp32"]) as srv:
        for request in (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: abc\r\n\r\n{}",
                        b"NOT A REQUEST LINE\r\n\r\n"):
            s = socket.create_connection(("127.0.0.1", srv.cfg.port))
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                s.sendall(request)
            head, _, body = recv_until_closed(s, timeout=10).partition(b"\r\n\r\n")
            s.close()
            assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower()
            error = json.loads(body)["error"]
            assert error["type"] == "invalid_request_error" and "not valid HTTP/1.1" in error["message"]


def test_cross_site_requests_are_refused_unless_the_origin_is_allowed(tiny_artifacts: dict[str, Path]) -> None:
    body = json.dumps(QUICK)
    with running(tiny_artifacts["fp32"], cors_origins=("https://app.example",)) as srv:
        # what a page of another site can send without a preflight: text/plain, its Origin
        r = httpx.post(srv.url + SPEECH, content=body, timeout=30,
                       headers={"Content-Type": "text/plain", "Origin": "https://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"
        assert "access-control-allow-origin" not in r.headers
        r = httpx.post(srv.url + SPEECH, content=body, timeout=30,
                       headers={"Content-Type": "application/json", "Origin": "null"})
        assert r.status_code == 403
        r = httpx.post(srv.url + SPEECH, content=body, headers={"Content-Type": "text/plain"}, timeout=30)
        assert r.status_code == 415 and r.json()["error"]["code"] == "content_type"
        r = httpx.post(srv.url + "/v1/chattts/speech", content=json.dumps({"text": "Hi."}), timeout=30,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
        # the allowed origin: the browser's preflight, then the call with CORS headers it may read
        pre = httpx.options(srv.url + SPEECH, timeout=30, headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "content-type" in pre.headers["access-control-allow-headers"].lower()
        r = httpx.post(srv.url + SPEECH, json=QUICK, headers={"Origin": "https://app.example"}, timeout=60)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-forge-model" in r.headers["access-control-expose-headers"].lower()
        bad = httpx.options(srv.url + SPEECH, timeout=30, headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in bad.headers
        assert srv.metric("forge_errors_total", kind="cross_origin") == 2
    with running(tiny_artifacts["fp32"]) as srv:  # no --cors-origin: every Origin is foreign
        r = httpx.post(srv.url + SPEECH, json=QUICK, headers={"Origin": "https://app.example"}, timeout=30)
        assert r.status_code == 403
        assert httpx.post(srv.url + SPEECH, json=QUICK, timeout=60).status_code == 200  # no Origin: not a page


def test_cors_origin_option_is_checked() -> None:
    from click.testing import CliRunner

    from chattts_forge.cli import main

    res = CliRunner().invoke(main, ["serve", "--artifact", ".", "--cors-origin", "app.example"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output


def test_bearer_scheme_is_case_insensitive(tiny_artifacts: dict[str, Path]) -> None:
    with running(tiny_artifacts["fp32"], admin_token="s3cret") as srv:
        for auth, status in (("bearer s3cret", 422), ("BEARER s3cret", 422), ("Bearer  s3cret", 422),
                             ("bearer wrong", 401), ("Basic s3cret", 401), ("s3cret", 401)):
            r = httpx.post(srv.url + "/admin/promote", json={}, headers={"Authorization": auth}, timeout=30)
            assert r.status_code == status, (auth, r.text)  # 422: authorised, nothing to promote


def test_sigterm_under_mixed_traffic_drains_and_exits_0_every_time(tiny_artifacts: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """The shutdown path under streams of every voice kind and format in flight, several times over."""
    bodies = [{**QUICK, "voice": v, "response_format": f, "max_new_token": 40, "min_new_token": 40}
              for v, f in (("coral", "pcm"), ("alloy(2)+nova(1)", "opus"), ("cedar", "mp3"), ("default", "flac"))]
    bodies.append({**QUICK, "voice": "sage", "stream_format": "sse", "max_new_token": 40, "min_new_token": 40})
    for attempt in range(3):
        port = free_port()
        log = tmp_path / f"serve-{attempt}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact",
                                     str(tiny_artifacts["fp32"]), "--port", str(port), "--threads", "1",
                                     "--drain", "20", "--admin-token-file", str(tmp_path / "token")],
                                    stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, lambda proc=proc, log=log: proc.poll() is not None and log.read_text())
            statuses: list[int] = []
            started = threading.Barrier(len(bodies) + 1)

            def call(body: dict, url: str = url, started: threading.Barrier = started,
                     statuses: list[int] = statuses) -> None:
                with httpx.stream("POST", url + SPEECH, json=body, timeout=120) as r:
                    started.wait(timeout=60)
                    b"".join(r.iter_bytes())
                    statuses.append(r.status_code)

            threads = [threading.Thread(target=call, args=(b,)) for b in bodies]
            for t in threads:
                t.start()
            started.wait(timeout=60)
            proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(timeout=60)
            assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
            assert statuses == [200] * len(bodies)
            assert "draining" in log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
