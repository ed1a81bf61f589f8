"""Issue 37: a server that holds for hours - the soak driver, reloads under traffic (and a `kill -9`
in the middle of one), overload refusals with a Retry-After from the measured drain rate, and the
memory ceiling. Mechanisms only, on the tiny synthetic checkpoint, in seconds: the soak's figures
are measurements (docs/measurements/2026-12-03-epyc/soak.md), never assertions here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
pytest.importorskip("starlette", reason="serve needs the serve extra")
pytest.importorskip("uvicorn", reason="serve needs the serve extra")

from stand_in_report import publish_stand_in_version, write_stand_in_report  # noqa: E402
from test_serve import CACHE_KNOBS, PHRASES, STEPS, TEXT, free_port, running  # noqa: E402

from chattts_forge.cli import main  # noqa: E402
from chattts_forge.errors import ForgeError  # noqa: E402
from chattts_forge.evaluate.soak import SoakConfig, check_audio, run_soak  # noqa: E402
from chattts_forge.fsutil import atomic_symlink  # noqa: E402
from chattts_forge.runtime.memory import RequestMemory  # noqa: E402
from chattts_forge.runtime.phrase_cache_build import build_phrase_cache  # noqa: E402
from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams  # noqa: E402
from chattts_forge.runtime.serve.guard import NORMAL, REFUSE, SHED, DrainRate, MemoryGuard, parse_size  # noqa: E402

ALL_PASS = {"short": (True, 1.0), "medium": (True, 1.0), "long": (True, 1.0)}
ALL_FAIL = {"short": (False, 1.0), "medium": (False, 1.0), "long": (False, 1.0)}


@pytest.fixture(scope="module")
def versions(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two published versions (publish keeps one copy of identical bytes per model: the second under a
    model name of its own): fp32 routes every bucket, fp16 is published but opened only when a request
    names it; the first has a phrase cache of two phrases."""
    from chattts_forge.publish.version_files import publish_version_files

    tmp = tmp_path_factory.mktemp("soak-versions")
    v1 = publish_stand_in_version(tiny_artifacts, tmp, {"fp32": ALL_PASS, "fp16": ALL_FAIL})
    phrases = tmp / "phrases.txt"
    phrases.write_text("\n".join(PHRASES) + "\n", encoding="utf-8")
    cache = tmp / "phrase_cache.bin"
    build_phrase_cache(v1, phrases, cache, SynthParams(code=InferCodeParams(seed=0, max_new_token=STEPS)), threads=1)
    publish_version_files(v1, cache_file=cache)
    v2 = _publish_as(tiny_artifacts, tmp, "soak-next")  # the same bytes under a model name of their own
    assert model_id(v1) != model_id(v2) and v1.parent.parent == v2.parent.parent
    return v1, v2


def _publish_as(artifacts: dict[str, Path], work: Path, model: str) -> Path:
    from chattts_forge.publish import publish_artifact
    from chattts_forge.publish.version_files import publish_version_files

    for variant, buckets in (("fp32", ALL_PASS), ("fp16", ALL_FAIL)):
        rdir = work / "reports" / variant
        write_stand_in_report(rdir, artifacts[variant], buckets=buckets)
        result = publish_artifact(artifacts[variant], rdir, work / "artifacts", model=model)
    publish_version_files(result.path.parent)
    return result.path.parent


def model_id(version: Path) -> str:
    return f"{version.parent.name}/{version.name}"


# ---- the soak driver --------------------------------------------------------------------------------


def test_soak_sends_the_whole_mix_reloads_samples_and_writes_json_and_plot(versions, tmp_path: Path) -> None:
    v1, _ = versions
    with running(v1, max_batch=4, max_queue=32) as srv:
        out, png = tmp_path / "soak.json", tmp_path / "soak.png"
        cfg = SoakConfig(url=srv.url, seconds=10, concurrency=3, artifact=str(v1), reload_every=3,
                         admin_token=srv.cfg.admin_token, sample_every=1, window_s=5, max_steps=40)
        report = run_soak(cfg, json_out=str(out), plot_out=str(png))
        assert json.loads(out.read_text()) == json.loads(json.dumps(report))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        kinds = report["by_kind"]
        assert set(kinds) == {"stream", "whole", "hit", "hangup", "malformed"}, kinds
        assert report["lost_healthy"] == 0 and report["malformed_not_4xx"] == 0
        assert kinds["malformed"]["ok"] == kinds["malformed"]["sent"] >= 1
        assert report["hit_ratio"] == 1.0  # the cache's own knobs: every hit served from it
        assert report["reloads"] and all(r["status"] == 200 for r in report["reloads"])
        assert srv.metric("forge_reloads_total", result="ok") == len(report["reloads"])
        assert sum(report["healthy_ok_by_format"].values()) == kinds["stream"]["ok"] + kinds["whole"]["ok"] + \
            kinds["hit"]["ok"]
        sample = report["samples"][-1]
        assert {"rss", "fds", "threads", "queue", "running"} <= set(sample)
        assert report["drift"]["fds_last"] == sample["fds"] and report["windows"][0]["misses"] >= 1
        assert "artifact" in report["config"] and str(v1.parent) not in out.read_text()  # no path of this machine


def test_soak_fails_on_a_lost_healthy_request(versions, tmp_path: Path) -> None:
    """A server whose deadline cuts every miss: the soak writes its JSON, then exits non-zero naming it."""
    v1, _ = versions
    with running(v1, max_batch=2, deadline_s=0.05) as srv:
        out = tmp_path / "soak.json"
        res = CliRunner().invoke(main, ["bench", "--artifact", str(v1), "--soak", "3", "--url", srv.url,
                                        "--concurrency", "2", "--json", str(out)])
        assert res.exit_code == 2 and "healthy request(s) lost" in res.output, res.output
        report = json.loads(out.read_text())
        assert report["lost_healthy"] >= 1 and report["lost"][0]["reason"]


def test_a_phrase_cache_for_variants_this_host_does_not_route_to_still_serves(versions, tiny_artifacts, tiny_kv8,
                                                                             tmp_path: Path) -> None:
    """A version whose routes (a host's autotune moves them) miss every variant its phrase cache was
    built for: the server starts and speaks the phrases as misses; found by the soak on a host that
    routes to fp16. A cache built for another version altogether is still refused."""
    from chattts_forge.publish.version_files import publish_version_files

    v1, _ = versions
    fp16_routed = publish_stand_in_version(tiny_artifacts, tmp_path, {"fp32": ALL_FAIL, "fp16": ALL_PASS})
    publish_version_files(fp16_routed, cache_file=v1 / "phrase_cache.bin")  # built for fp32 (same bytes)
    with running(fp16_routed, max_batch=2) as srv:
        r = httpx.post(srv.url + "/v1/audio/speech", timeout=60,
                       json={"model": "tts-1", "input": PHRASES[1], "response_format": "pcm", **CACHE_KNOBS})
        assert r.status_code == 200 and r.headers["x-forge-variant"] == "fp16"
        assert r.headers["x-forge-cached"] == "false" and len(r.content) > 0
        r = httpx.post(srv.url + "/v1/audio/speech", timeout=60, json={
            "model": "fp32", "input": PHRASES[1], "response_format": "pcm", **CACHE_KNOBS})
        assert r.status_code == 200 and r.headers["x-forge-cached"] == "true"  # fp32 opened: its cache attached
    kv8 = publish_stand_in_version({"fp32": tiny_artifacts["fp32"], "int8-dynamic-kv8": tiny_kv8},
                                   tmp_path / "kv8", {"fp32": ALL_FAIL, "int8-dynamic-kv8": ALL_PASS})
    (tmp_path / "kv8" / "phrases.txt").write_text(PHRASES[1] + "\n", encoding="utf-8")
    kv8_cache = tmp_path / "kv8_phrase_cache.bin"  # built for int8-dynamic-kv8, which v1 does not publish
    build_phrase_cache(kv8, tmp_path / "kv8" / "phrases.txt", kv8_cache,
                       SynthParams(code=InferCodeParams(seed=0, max_new_token=STEPS)), threads=1)
    from chattts_forge.runtime.serve.config import ServeConfig
    from chattts_forge.runtime.serve.engine import ServedVersion

    with pytest.raises(ForgeError, match="was built for other artifacts"):
        ServedVersion(v1, ServeConfig(artifact=str(v1), threads=1, phrase_cache=str(kv8_cache)))


def test_a_phrase_this_host_routes_elsewhere_is_served_from_the_build_routes_entry(tiny_artifacts,
                                                                                 tmp_path: Path) -> None:
    """The tiny soak's fresh host: the deferred autotune moved buckets off the build's routes, for which
    the version's phrase cache was warmed, and 97% of the phrases became misses. A routed phrase is
    still a hit, from the build route's entry through the shared vocoder (the same audio as before the
    move, the header naming whose entry it is); a request naming the new variant is a miss."""
    from chattts_forge.publish.version_files import publish_version_files

    fast, slow = {b: (True, 1.0) for b in ALL_PASS}, {b: (True, 2.0) for b in ALL_PASS}
    version = publish_stand_in_version(tiny_artifacts, tmp_path, {"fp32": fast, "fp16": slow})
    assert {b["variant"] for b in json.loads((version / "routing.json").read_text())["buckets"]} == {"fp32"}
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(PHRASES[1] + "\n", encoding="utf-8")
    cache = tmp_path / "phrase_cache.bin"
    build_phrase_cache(version, phrases, cache, SynthParams(code=InferCodeParams(seed=0, max_new_token=STEPS)),
                       threads=1)
    publish_version_files(version, cache_file=cache)
    body = {"model": "tts-1", "input": PHRASES[1], "response_format": "pcm", **CACHE_KNOBS}
    with running(version, max_batch=2) as srv:
        before = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=60)
        assert before.headers["x-forge-cached"] == "true" and before.headers["x-forge-variant"] == "fp32"
        served = srv.state.current
        served._open("fp16")  # what tune_deferred does before it applies a measured route
        served.router.routes = dict.fromkeys(served.router.routes, "fp16")
        after = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=60)
        assert after.status_code == 200 and after.headers["x-forge-cached"] == "true"
        assert after.headers["x-forge-variant"] == "fp32" and after.content == before.content
        named = httpx.post(srv.url + "/v1/audio/speech", json={**body, "model": "fp16"}, timeout=60)
        assert named.status_code == 200 and named.headers["x-forge-cached"] == "false"
        other = httpx.post(srv.url + "/v1/audio/speech", json={**body, "input": TEXT}, timeout=60)
        assert other.headers["x-forge-cached"] == "false" and other.headers["x-forge-variant"] == "fp16"


def test_open_loop_soak_meets_refusals_and_every_client_honouring_them_gets_through(versions, tmp_path: Path) -> None:
    """`--rate`: arrivals faster than one row can serve; the queue of one refuses (429 + Retry-After),
    the clients come back after it, and every request is served in the end (issue 37 item 5)."""
    v1, _ = versions
    with running(v1, max_batch=1, max_queue=1) as srv:
        cfg = SoakConfig(url=srv.url, seconds=1, artifact=str(v1), rate=20, retries=100, sample_every=0.5,
                         window_s=1, max_steps=300, mix={"stream": 0.5, "whole": 0.5})
        report = run_soak(cfg, json_out=str(tmp_path / "overload.json"))
    assert report["config"]["rate"] == 20 and report["requests"] >= 5
    assert report["lost_healthy"] == 0 and report["healthy"] == report["requests"]
    refusals = report["refusals"]
    assert refusals["count"] >= 1 and refusals["count"] == report["retried_after_refusal"]
    assert refusals["retry_after_min_s"] >= 1
    assert report["admitted_p99_s"] is not None and report["misses_per_s"] > 0


def test_soak_hits_come_from_the_phrase_cache_named(versions, tmp_path: Path) -> None:
    from chattts_forge.errors import BadInput
    from chattts_forge.evaluate.soak import _phrases

    v1, _ = versions
    texts, fields = _phrases(None, str(v1 / "phrase_cache.bin"))  # a variant folder served with --phrase-cache
    assert sorted(texts) == sorted(PHRASES) and fields["max_new_token"] == STEPS and fields["refine"] is False
    assert _phrases(str(v1)) == (texts, fields)  # the version's own cache
    assert _phrases(str(tmp_path)) == ([], {})  # none: no hits in the mix
    with pytest.raises(BadInput, match="is not a file"):
        _phrases(str(v1), str(tmp_path / "missing.bin"))


def _os_threads() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc")
def test_the_thread_count_is_final_once_ready(versions) -> None:
    """Every thread a request can need exists when /readyz answers (the work pool's start at load; a
    refined request's text head, opened on first use, adds none), so a soak sees a flat count."""
    v1, _ = versions
    with running(v1, max_batch=2) as srv:
        from chattts_forge.runtime.serve.state import work_threads

        assert len(srv.state.work._threads) == work_threads()
        before = _os_threads()
        for refine in (False, True):
            for stream in (False, True):
                r = httpx.post(srv.url + "/v1/audio/speech", timeout=120, json={
                    "model": "tts-1", "input": TEXT, "response_format": "pcm", "refine": refine, "stream": stream,
                    "max_new_token": 12, "min_new_token": 12})
                assert r.status_code == 200
        assert _os_threads() == before


def test_soak_options_are_checked() -> None:
    r = CliRunner().invoke(main, ["bench", "--artifact", "x", "--soak", "5"])
    assert r.exit_code == 2 and "--soak needs --url" in r.output
    r = CliRunner().invoke(main, ["bench", "--artifact", "x", "--reload-every", "5"])
    assert r.exit_code == 2 and "--reload-every does not apply to the plain benchmark (it applies to: --soak)" in r.output


def test_check_audio_refuses_a_cut_or_undecodable_reply() -> None:
    steps = 10
    whole = b"\0\0" * 256 * (2 * steps - 1)
    check_audio(whole, "pcm", steps)
    with pytest.raises(ForgeError, match="cut or padded"):
        check_audio(whole[:-512], "pcm", steps)
    with pytest.raises(ForgeError, match="RIFF"):
        check_audio(whole, "wav", steps)
    with pytest.raises(ForgeError, match="no audio"):
        check_audio(b"", "opus", None)
    # aac: its 1,024 samples of priming and the last frame's padding are within the lossy slack; twice or
    # three times the length is not
    import numpy as np

    from chattts_forge.runtime.serve.formats import encode_whole

    aac = encode_whole(np.full(256 * (2 * steps - 1), 0.1, np.float32), 24000, "aac")
    check_audio(aac, "aac", steps)
    with pytest.raises(ForgeError, match="cut or padded"):
        check_audio(aac + aac, "aac", steps)
    with pytest.raises(ForgeError, match="cut or padded"):
        check_audio(encode_whole(np.full(256 * (2 * 3 * steps - 1), 0.1, np.float32), 24000, "aac"), "aac", steps)


# ---- reloads: one complete version, never a mix ----------------------------------------------------------


def test_a_switched_current_link_never_mixes_versions_in_one_served_version(versions, tmp_path: Path) -> None:
    """Served through a `current` link: a variant opened on first use after the link moved to v2 still
    comes from v1's folder (the version the server loaded), until a reload takes v2 whole."""
    v1, v2 = versions
    link = tmp_path / "current"
    atomic_symlink(v1, link)
    with running(link, max_batch=2) as srv:
        atomic_symlink(v2, link)
        body = {"model": "fp16", "input": "Hi.", "response_format": "pcm", **CACHE_KNOBS}
        r = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200 and r.headers["x-forge-model"] == model_id(v1)
        opened = srv.state.current.pipes["fp16"].artifact.path
        assert Path(opened).resolve().parent == v1.resolve()  # not v2's fp16 inside v1's version
        reload = httpx.post(srv.url + "/admin/reload", json={"artifact": str(link)}, headers=srv.admin(), timeout=120)
        assert reload.status_code == 200 and reload.json()["model"] == model_id(v2)
        r = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=120)
        assert r.headers["x-forge-model"] == model_id(v2)
        assert Path(srv.state.current.pipes["fp16"].artifact.path).resolve().parent == v2.resolve()


def test_the_server_trims_the_c_heap_until_it_shuts_down(versions) -> None:
    v1, _ = versions
    with running(v1, heap_trim_s=0.05) as srv:
        t_end = time.monotonic() + 20
        while srv.state.heap_trims < 3 and time.monotonic() < t_end:
            time.sleep(0.05)
        assert srv.state.heap_trims >= 3
    trims = srv.state.heap_trims
    time.sleep(0.3)
    assert srv.state.heap_trims == trims


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_malloc_arenas_are_capped_unless_the_environment_sets_them() -> None:
    code = "from chattts_forge.runtime.heap import cap_malloc_arenas; print(cap_malloc_arenas(2))"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    capped = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert capped.stdout.strip() == "True"
    kept = subprocess.run([sys.executable, "-c", code], env={**env, "MALLOC_ARENA_MAX": "4"}, capture_output=True,
                          text=True, check=True)
    assert kept.stdout.strip() == "False"


def test_a_reload_frees_the_retired_version_and_trims_the_heap(versions, monkeypatch) -> None:
    """The retired version (its sessions) is freed once drained, then the heap is trimmed: a soak with
    a reload at half time otherwise kept the old version's pages and read it as RSS drift."""
    import weakref

    from chattts_forge.runtime.serve import state as state_module

    trims: list[int] = []
    monkeypatch.setattr(state_module, "release_free_heap", lambda: trims.append(1))
    v1, v2 = versions
    with running(v1, max_batch=2) as srv:
        r = httpx.post(srv.url + "/v1/audio/speech", timeout=120, json={
            "model": "tts-1", "input": TEXT, "response_format": "pcm", "max_new_token": 12, "min_new_token": 12})
        assert r.status_code == 200
        old = weakref.ref(srv.state.current)
        old_session = weakref.ref(next(iter(srv.state.current.pipes.values())).artifact)
        reload = httpx.post(srv.url + "/admin/reload", json={"artifact": str(v2)}, headers=srv.admin(), timeout=120)
        assert reload.status_code == 200
        deadline = time.monotonic() + 30
        while srv.state.retired < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.state.retired == 1 and trims == [1]
        assert old() is None and old_session() is None  # nothing holds the old version or its artifact
        r = httpx.post(srv.url + "/v1/audio/speech", timeout=120, json={
            "model": "tts-1", "input": TEXT, "response_format": "pcm", "max_new_token": 12, "min_new_token": 12})
        assert r.status_code == 200 and r.headers["x-forge-model"] == model_id(v2)


def test_an_idle_connection_outlives_a_retry_after(versions) -> None:
    """A client honouring a Retry-After of a few seconds comes back on its kept-alive connection and is
    answered (uvicorn's default closed it after 5 s idle, as the client sent: a lost request)."""
    import socket

    def get(sock: socket.socket) -> bytes:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += sock.recv(65536)
        return head

    v1, _ = versions
    with running(v1, max_batch=2) as srv, socket.create_connection(("127.0.0.1", srv.cfg.port), timeout=30) as sock:
        assert get(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6.5)  # longer than uvicorn's default keep-alive, as long as a short Retry-After
        assert get(sock).startswith(b"HTTP/1.1 200")


def test_atomic_symlink_replaces_a_link_in_one_rename(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    link = tmp_path / "current"
    atomic_symlink(a, link)
    assert link.resolve() == a.resolve()
    atomic_symlink(b, link)
    assert link.resolve() == b.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "current"]  # no temporary link left
    (tmp_path / "plain").mkdir()
    with pytest.raises(ForgeError, match="not a symlink"):
        atomic_symlink(a, tmp_path / "plain")


def _start(link: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact", str(link),
                                 "--port", str(port), "--threads", "1", "--admin-loopback"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> dict:
    deadline = time.time() + 180
    while time.time() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(url + "/readyz", timeout=5)
            if r.status_code == 200:
                return r.json()
        assert proc.poll() is None, log.read_text()
        time.sleep(0.2)
    raise AssertionError("not ready: " + log.read_text())


def test_kill_9_in_the_middle_of_a_reload_then_a_restart_serves_one_complete_version(versions, tmp_path) -> None:
    from chattts_forge.publish.verify import verify_path

    v1, v2 = versions
    link = tmp_path / "current"
    atomic_symlink(v1, link)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = _start(link, port, log)
    try:
        assert _wait_ready(url, proc, log)["model"] == model_id(v1)
        body = {"model": "tts-1", "input": TEXT, "response_format": "pcm", **CACHE_KNOBS}
        statuses: list[int] = []
        stop = threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    statuses.append(httpx.post(url + "/v1/audio/speech", json=body, timeout=30).status_code)

        worker = threading.Thread(target=traffic, daemon=True)
        worker.start()
        deadline = time.time() + 120
        while not statuses and time.time() < deadline:  # traffic flows before the reload begins
            time.sleep(0.05)
        atomic_symlink(v2, link)  # the install: one rename
        proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 60
        while "SIGHUP: reloading" not in log.read_text() and time.time() < deadline:
            time.sleep(0.01)
        assert "reload:" not in log.read_text()  # killed while the new version loads, before the swap
        proc.kill()
        proc.wait(timeout=30)
        stop.set()
        worker.join(timeout=60)
        assert statuses and set(statuses) == {200}
        proc = _start(link, port, log)
        ready = _wait_ready(url, proc, log)
        served = link.resolve()
        assert ready["model"] == model_id(served) == model_id(v2)
        assert verify_path(served).ok, verify_path(served).problems  # every file its manifest lists, no other
        manifests = [json.loads((served / v / "manifest.json").read_text()) for v in ("fp32", "fp16")]
        assert {(m["model"], m["version"]) for m in manifests} == {(served.parent.name, served.name)}
        r = httpx.post(url + "/v1/audio/speech", json=body, timeout=60)
        assert r.status_code == 200 and r.headers["x-forge-model"] == model_id(v2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- overload: 429 with a Retry-After from the drain rate -----------------------------------------------


def test_drain_rate_and_its_retry_after() -> None:
    now = [100.0]
    rate = DrainRate(window_s=10, clock=lambda: now[0])
    assert rate.rate() is None and rate.retry_after(5, fallback_s=3) == 3
    for _ in range(4):
        now[0] += 1
        rate.completed()
    assert rate.rate() == pytest.approx(4 / 4)  # 4 in the 4 s measured so far
    assert rate.retry_after(6, 1) == 6
    now[0] += 20  # a window with nothing finished: no measurement
    assert rate.rate() is None
    for _ in range(20):
        now[0] += 0.5
        rate.completed()
    assert rate.rate() == pytest.approx(20 / 10)
    assert rate.retry_after(3, 1) == math.ceil(3 / 2) and rate.retry_after(10_000, 1) == 120


def test_refusals_are_429_with_a_measured_retry_after_and_a_client_honouring_it_gets_through(versions) -> None:
    v1, _ = versions
    # Long enough that five requests released together overlap on any CPU (a 60-step request took
    # ~25 ms on CI's machine, shorter than the clients' old 50 ms stagger: nothing was ever refused).
    body = {"model": "fp32", "input": TEXT, "response_format": "pcm", "refine": False, "max_new_token": 600,
            "min_new_token": 600}
    with running(v1, max_batch=1, max_queue=1, retry_after_s=97) as srv:
        refusals: list[tuple[str, str]] = []
        got: list[int] = []
        # one completion first, so the drain rate is measured before the burst
        assert httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=120).status_code == 200
        release = threading.Barrier(5)

        def client() -> None:
            release.wait()
            for _ in range(40):
                r = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=120)
                if r.status_code != 429:
                    got.append(r.status_code)
                    return
                refusals.append((r.headers["retry-after"], r.json()["error"]["message"]))
                time.sleep(int(r.headers["retry-after"]) / 10)  # honoured (scaled down to keep the test short)

        threads = [threading.Thread(target=client) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [200] * 5  # every client got through
        assert refusals and all(int(after) >= 1 for after, _ in refusals)
        assert all("drains in about" in message for _, message in refusals)
        measured = [int(a) for a, _ in refusals if a != "97"]  # 97: the stand-in before any completion
        assert measured, "no Retry-After came from a measured drain rate"
        assert srv.metric("forge_drain_rate", variant="fp32") > 0
        assert srv.metric("forge_errors_total", kind="queue_full") == len(refusals)


# ---- the memory ceiling ------------------------------------------------------------------------------


def test_parse_size() -> None:
    assert parse_size("6G") == 6 * 2**30 and parse_size("512m") == 512 * 2**20 and parse_size("1500") == 1500
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    with pytest.raises(ForgeError):
        parse_size("lots")
    r = CliRunner().invoke(main, ["serve", "--artifact", ".", "--memory-limit", "lots"])
    assert r.exit_code == 2


def test_the_memory_guard_admits_a_long_miss_alone_while_shedding_and_nothing_while_refusing() -> None:
    rss = [96]
    guard = MemoryGuard(100, lambda: rss[0], lower_batch=lambda lower: None, evict=lambda: 0, long_chars=20)
    assert guard.check() == REFUSE
    assert not guard.admits(5, 1, 4) and not guard.admits(5, 0, 4)  # the ceiling first
    rss[0] = 90
    assert guard.check() == SHED
    short = guard.admits(5, 3, 4)  # short misses run while shedding, while a row is free
    assert short is not None
    assert not guard.admits(5, 4, 4)  # but none queues
    assert not guard.admits(50, 1, 4)  # long ones one at a time:
    assert not guard.admits(50, 0, 4)  # over the budget while a miss still holds its reservation (decoding)
    short.release()
    assert guard.admits(50, 0, 4)  # alone
    assert guard.shed.counts == {"batch": 1, "evict": 1, "refuse_budget": 1, "refuse_long": 1, "refuse_queue": 1,
                                 "refuse": 2, "serial": 1}


def test_the_ledger_admits_misses_while_floor_and_reservations_fit_under_the_shedding_mark() -> None:
    rss = [40]
    guard = MemoryGuard(100, lambda: rss[0], lower_batch=lambda lower: None, evict=lambda: 0)
    assert guard.check() == NORMAL and guard.floor == 40  # nothing reserved: the floor is the RSS
    a, b = guard.admits(5, 0, 4, need=20), guard.admits(5, 1, 4, need=20)  # 40 + 20 + 20 <= 85
    assert a is not None and b is not None and guard.reserved == 40
    assert guard.admits(5, 2, 4, need=20) is None  # 40 + 40 + 20 > 85
    assert guard.shed.counts["refuse_budget"] == 1
    rss[0] = 70  # the two have mapped part of what they reserved: the floor holds
    guard.check()
    assert guard.floor == 40
    rss[0] = 84  # more than floor + reservations: what the estimates missed joins the floor
    guard.check()
    assert guard.floor == 44 and guard.level == NORMAL
    a.release()
    a.release()  # once only
    assert guard.reserved == 20
    c = guard.admits(5, 1, 4, need=20)  # 44 + 20 + 20 <= 85
    assert c is not None and guard.admits(5, 2, 4, need=2) is None  # 44 + 40 + 2 > 85
    b.release()
    c.release()
    assert guard.reserved == 0
    rss[0] = 60
    guard.check()
    assert guard.floor == 60  # nothing reserved: back to the RSS
    assert guard.admits(5, 0, 4, need=50) is not None  # alone, a miss runs even over the budget
    assert guard.shed.counts["refuse_budget"] == 2


def test_the_ledger_counts_only_as_many_whole_decodes_as_run_at_once_and_trims_after_a_request_ends(
        monkeypatch) -> None:
    import chattts_forge.runtime.serve.guard as guard_module

    trims: list[int] = []
    monkeypatch.setattr(guard_module, "release_free_heap", lambda: trims.append(1))
    rss = [10]
    guard = MemoryGuard(100, lambda: rss[0], lower_batch=lambda lower: None, evict=lambda: 0, decoders=2)
    guard.check()
    held = [guard.admits(5, i, 8, need=5, decode=d) for i, d in enumerate((20, 10, 30))]
    assert all(held) and guard.reserved == 3 * 5 + 30 + 20  # two decodes at once: the largest two
    assert guard.admits(5, 3, 8, need=5, decode=26) is None  # 10 + 4 x 5 + 30 + 26 > 85
    assert guard.admits(5, 3, 8, need=5, decode=5) is not None  # 10 + 4 x 5 + 30 + 20 = 80
    assert not guard.near_limit()
    rss[0] = 80  # near the limit (over RESUME x limit), where the floor's precision matters
    guard.check()
    assert not trims and guard.near_limit()  # free rows give their memory back now
    held[2].release()
    held[2].release()  # once only
    assert guard.reserved == 3 * 5 + 20 + 10 and not trims  # the guard's thread trims, not the request's end
    guard.check()
    guard.check()
    assert len(trims) == 1  # before the sample after the end, once
    for r in guard._reservations.copy():
        r.release()
    rss[0] = 78
    guard.check()
    assert guard.reserved == 0 and len(trims) == 2 and guard.floor == 78  # trimmed, then the floor read
    rss[0] = 74  # under RESUME x limit: no trim at a request's end (a trim holds the heap's locks)
    guard.check()
    assert not guard.near_limit()
    guard.admits(5, 0, 8, need=5).release()
    guard.check()
    assert len(trims) == 2


def test_reservations_bound_admissions_and_every_way_a_request_ends_releases_its_own(versions) -> None:
    """Under a memory limit, each admitted miss holds its estimate until its response ends: with room
    for two, a third concurrent miss gets 503 with Retry-After; a finished stream, a client hanging
    up mid-stream and a whole reply give their bytes back; the schedulers give free rows' pages back."""
    v1, _ = versions
    limit = 1 << 30
    need = limit // 10
    with running(v1, max_batch=4, max_queue=8, memory_limit=limit) as srv:
        guard, version = srv.state.guard, srv.state.current
        sched = version.schedulers["fp32"]
        assert sched.release_free_rows == guard.near_limit  # the guard says when free rows give memory back
        version.request_memory = lambda prep: RequestMemory(need, 0)  # what each miss reserves, whatever its text
        guard.rss = lambda: int(0.85 * limit) - 5 * need // 2  # room under the shedding mark for two
        guard.check()
        gate = threading.Event()  # holds the GPT steps until both streams are admitted
        step = sched._gpt_step
        sched._gpt_step = lambda: (gate.wait(), step())[1]
        steps = 200
        body = {"model": "fp32", "input": TEXT, "response_format": "pcm", "refine": False,
                "max_new_token": steps, "min_new_token": steps}
        url = srv.url + "/v1/audio/speech"
        got: dict[str, int] = {}

        def stream(name: str, seed: int, hang_up: bool) -> None:
            with httpx.stream("POST", url, json={**body, "seed": seed}, timeout=120) as r:
                got[name + "_status"] = r.status_code
                chunks = r.iter_bytes()
                got[name] = len(next(chunks)) if hang_up else len(b"".join(chunks))

        clients = [threading.Thread(target=stream, args=("whole_stream", 1, False)),
                   threading.Thread(target=stream, args=("hung_up", 2, True))]
        for c in clients:
            c.start()
        t_end = time.monotonic() + 30
        while guard.reserved < 2 * need and time.monotonic() < t_end:
            time.sleep(0.02)
        assert srv.metric("forge_memory_reserved_bytes") == 2 * need
        r = httpx.post(url, json={**body, "stream": False, "seed": 3}, timeout=60)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert srv.metric("forge_shed_total", action="refuse_budget") == 1
        gate.set()
        for c in clients:
            c.join(timeout=120)
        assert got["whole_stream_status"] == got["hung_up_status"] == 200
        assert got["whole_stream"] == 2 * 256 * (2 * steps - 1) and got["hung_up"] > 0
        t_end = time.monotonic() + 30  # the hung-up stream's request ends on the server
        while guard.reserved and time.monotonic() < t_end:
            time.sleep(0.02)
        assert srv.metric("forge_memory_reserved_bytes") == 0
        whole = httpx.post(url, json={**body, "stream": False, "seed": 3}, timeout=120)
        assert whole.status_code == 200 and len(whole.content) == 2 * 256 * (2 * steps - 1)
        assert srv.metric("forge_memory_reserved_bytes") == 0
        assert srv.metric("forge_memory_floor_bytes") == guard.floor > 0


def test_refusing_with_nothing_in_flight_trims_the_heap_and_rereads_rss(monkeypatch) -> None:
    import chattts_forge.runtime.serve.guard as guard_module

    trims: list[int] = []
    monkeypatch.setattr(guard_module, "release_free_heap", lambda: trims.append(1))
    rss = [96]
    guard = MemoryGuard(100, lambda: rss[0], lower_batch=lambda lower: None, evict=lambda: 0)
    assert guard.check() == REFUSE and len(trims) == 1  # the transition's trim
    guard.admits(5, 2, 4)
    assert len(trims) == 1  # misses in flight: their memory is in use
    guard.admits(5, 0, 4)
    guard.admits(5, 0, 4)
    assert len(trims) == 2  # at most once per IDLE_TRIM_S
    rss[0] = 80  # what the trim gave back
    assert guard.check() == SHED and guard.admits(5, 0, 4)


def test_memory_ceiling_sheds_and_admitted_requests_finish(versions) -> None:
    """RSS (as the guard reads it) near the limit: the batch is halved, the phrase cache's decoded
    entries dropped, new misses get 503 with Retry-After (long ones by the shedding rule, short ones
    by the ledger's budget, which RSS is over); over the hard
    mark every new miss is refused while one is in flight but hits are served; the stream admitted
    before finishes whole; with nothing in flight one miss is admitted; /metrics shows it all; under
    the resume mark everything is back."""
    v1, _ = versions
    limit = 1 << 30
    with running(v1, max_batch=4, max_queue=8, memory_limit=limit) as srv:
        guard = srv.state.guard
        rss = [int(0.5 * limit)]
        guard.rss = lambda: rss[0]
        assert guard.check() == NORMAL  # the real RSS at start-up may have been over this small limit
        hit = {"model": "tts-1", "input": PHRASES[1], "response_format": "wav", **CACHE_KNOBS}
        assert httpx.post(srv.url + "/v1/audio/speech", json=hit, timeout=60).headers["x-forge-cached"] == "true"
        cache = srv.state.current.file_cache
        assert cache.lru_bytes > 0
        steps = 200
        long = {"model": "fp32", "input": TEXT * 3, "response_format": "pcm", "refine": False,
                "max_new_token": steps, "min_new_token": steps}
        with httpx.stream("POST", srv.url + "/v1/audio/speech", json=long, timeout=120) as admitted:
            received = admitted.iter_bytes()
            chunks = [next(received)]
            rss[0] = int(0.9 * limit)  # shed
            assert guard.check() == SHED  # returns once the watcher's transition is carried out
            assert all(s.max_batch == 2 for s in srv.state.current.schedulers.values() if hasattr(s, "max_batch"))
            assert cache.lru_bytes == 0
            r = httpx.post(srv.url + "/v1/audio/speech", json={**long, "stream": False}, timeout=60)
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            assert "short of memory" in r.json()["error"]["message"]
            short = {"model": "fp32", "input": "Hi.", "response_format": "pcm", "refine": False,
                     "max_new_token": 20, "min_new_token": 20}
            # over the shedding mark with a miss in flight, a short one is over the ledger's budget too
            assert httpx.post(srv.url + "/v1/audio/speech", json=short, timeout=60).status_code == 503
            assert srv.metric("forge_shed_total", action="refuse_budget") == 1
            rss[0] = int(0.97 * limit)  # refuse
            assert guard.check() == REFUSE
            assert httpx.post(srv.url + "/v1/audio/speech", json=short, timeout=60).status_code == 503
            assert httpx.post(srv.url + "/v1/audio/speech", json=hit, timeout=60).status_code == 200
            chunks += list(received)
        assert admitted.status_code == 200 and len(b"".join(chunks)) == 2 * 256 * (2 * steps - 1)
        # Shedding, nothing in flight: a long miss is admitted alone (RSS held by the arenas would
        # otherwise keep the server from ever serving one again).
        t_end = time.monotonic() + 30
        while srv.state.misses_in_flight() and time.monotonic() < t_end:
            time.sleep(0.05)
        rss[0] = int(0.9 * limit)
        assert guard.check() == SHED and srv.state.misses_in_flight() == 0
        assert httpx.post(srv.url + "/v1/audio/speech", json={**long, "stream": False}, timeout=120).status_code == 200
        assert srv.metric("forge_shed_total", action="serial") == 1
        rss[0] = int(0.97 * limit)
        assert guard.check() == REFUSE
        assert srv.metric("forge_memory_limit_bytes") == limit and srv.metric("forge_memory_level") == REFUSE
        for action in ("batch", "evict", "refuse_budget", "refuse_long", "refuse"):
            assert srv.metric("forge_shed_total", action=action) >= 1, action
        assert srv.metric("forge_errors_total", kind="memory") == 3
        assert srv.metric("forge_memory_reserved_bytes") == 0  # every admitted miss released its bytes
        assert srv.metric("forge_batch_limit", variant="fp32") == 2
        rss[0] = int(0.5 * limit)  # resume
        assert guard.check() == NORMAL
        assert srv.metric("forge_batch_limit", variant="fp32") == 4
        assert httpx.post(srv.url + "/v1/audio/speech", json={**long, "stream": False}, timeout=120).status_code == 200
