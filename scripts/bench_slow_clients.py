"""Healthy requests while slow clients hold connections: p50/p99 latency of small speech requests with
and without N half-open connections (half send nothing, half stop inside their headers; reopened as
the server closes them), interleaved round by round; how fast the held ones are closed and whether
`forge_open_fds` returns to its idle count.

    python scripts/bench_slow_clients.py --url http://127.0.0.1:8000 --held 500 --rounds 4 --seconds 8

Each phase sends requests back to back for `--seconds` (longer than the server's header timeout, so
held connections are closed and reopened inside it).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import numpy as np

BODY = {"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "pcm", "max_new_token": 8,
        "min_new_token": 8, "refine": False, "stream": False}


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


class SlowClients:
    """`n` connections kept half-open: each one closed by the server is opened again until stop()."""

    def __init__(self, host: str, port: int, n: int) -> None:
        self.host, self.port, self.n = host, port, n
        self.stop_event = threading.Event()
        self.closed_after: list[float] = []  # seconds each held connection lasted before the server closed it
        self.threads = [threading.Thread(target=self._hold, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)

    def _hold(self, i: int) -> None:
        while not self.stop_event.is_set():
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
            except OSError:
                time.sleep(0.1)
                continue
            t0 = time.monotonic()
            with s:
                if i % 2:
                    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
                s.settimeout(0.5)
                while not self.stop_event.is_set():
                    try:
                        if not s.recv(4096):
                            self.closed_after.append(time.monotonic() - t0)
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        self.closed_after.append(time.monotonic() - t0)
                        break


def latencies(url: str, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=120) as client:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = client.post(url + "/v1/audio/speech", json=BODY)
            r.raise_for_status()
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--held", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    url = args.url.rstrip("/")
    where = urlparse(url)
    latencies(url, 1.0)  # warm
    idle_fds = metric(url, "forge_open_fds")
    plain: list[float] = []
    held: list[float] = []
    closed: list[float] = []
    peak_fds = idle_fds
    for _ in range(args.rounds):
        plain += latencies(url, args.seconds)
        slow = SlowClients(where.hostname or "127.0.0.1", where.port or 80, args.held)
        slow.start()
        time.sleep(1.0)
        peak_fds = max(peak_fds, metric(url, "forge_open_fds"))
        held += latencies(url, args.seconds)
        slow.stop()
        closed += slow.closed_after
    deadline = time.monotonic() + 30
    while metric(url, "forge_open_fds") > idle_fds + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    result = {
        "held_connections": args.held, "rounds": args.rounds, "seconds_per_phase": args.seconds,
        "requests": {"plain": len(plain), "held": len(held)},
        "plain_p50_s": float(np.percentile(plain, 50)), "plain_p99_s": float(np.percentile(plain, 99)),
        "held_p50_s": float(np.percentile(held, 50)), "held_p99_s": float(np.percentile(held, 99)),
        "p99_ratio": float(np.percentile(held, 99) / np.percentile(plain, 99)),
        "held_closed_by_server": len(closed),
        "held_lifetime_s": {"median": float(np.median(closed)), "max": float(np.max(closed))} if closed else None,
        "open_fds": {"idle": idle_fds, "peak": peak_fds, "after": metric(url, "forge_open_fds")},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
