"""Issue 26: `chattts-forge serve`, driven over real HTTP by real clients (the official `openai` package,
httpx), on a published tiny version (fp16 routed for short texts, fp32 for the rest, a phrase cache).

Each server is a real uvicorn server on a free port, in a thread (the SIGTERM/SIGHUP test runs the
command in a subprocess). Audio is compared with what `chattts-forge synth` writes for the same
knobs and seed: streamed responses with `synth --stream` (the scheduler cuts the stream where a lone
stream is cut), whole responses (`stream: false`) with `synth`; wav/pcm/flac exactly, mp3/opus/aac after
decoding, by SNR against the reference (and far below it against the reference reversed).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

openai = pytest.importorskip("openai", reason="the serve tests need the openai client (dev extra)")
httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
pytest.importorskip("starlette", reason="serve needs the serve extra")
pytest.importorskip("uvicorn", reason="serve needs the serve extra")

from stand_in_report import publish_stand_in_version  # noqa: E402

from chattts_forge.cli import main  # noqa: E402
from chattts_forge.runtime.phrase_cache_build import build_phrase_cache  # noqa: E402
from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams  # noqa: E402
from chattts_forge.runtime.serve.config import ServeConfig  # noqa: E402
from chattts_forge.runtime.serve.formats import AAC_FRAME, FORMATS, to_int16  # noqa: E402
from chattts_forge.runtime.serve.server import make_server  # noqa: E402
from chattts_forge.runtime.serve.state import ServerState  # noqa: E402
from chattts_forge.runtime.tempo import stretch  # noqa: E402

STEPS = 24  # the phrase cache's max_new_token (requests that want a hit send it: the cache sets no knob)
PHRASES = ["请稍等", "Please hold on a moment."]
TEXT = "Hello there, how are you today?"  # medium bucket: fp32
SHORT = "你好。"  # short bucket: fp16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def version(tiny_artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published version: fp16 serves short texts, fp32 the rest; a phrase cache of two phrases."""
    from chattts_forge.publish.version_files import publish_version_files

    tmp = tmp_path_factory.mktemp("serve-version")
    version_dir = publish_stand_in_version(tiny_artifacts, tmp, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (False, 1.0), "long": (False, 1.0)}})
    phrases = tmp / "phrases.txt"
    phrases.write_text("\n".join(PHRASES) + "\n", encoding="utf-8")
    cache = tmp / "phrase_cache.bin"
    build_phrase_cache(version_dir, phrases, cache, SynthParams(code=InferCodeParams(seed=0, max_new_token=STEPS)),
                       threads=1)
    publish_version_files(version_dir, cache_file=cache)
    return version_dir


class Running:
    """A real uvicorn server in a thread."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.server = make_server(cfg, install_signals=False)
        self.state: ServerState = self.server.forge_state
        self.url = f"http://127.0.0.1:{cfg.port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 120
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return
            assert self.state.load_error is None, self.state.load_error
            time.sleep(0.1)
        raise AssertionError("server not ready after 120 s")

    def admin(self) -> dict[str, str]:
        """The headers of an admin call: the token the server generated at start (its cfg holds it)."""
        return {"Authorization": f"Bearer {self.cfg.admin_token}"}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        total = 0.0
        for line in text.splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if m and m.group(1) == name and (not want or all(p in (m.group(2) or "") for p in want.split(","))):
                total += float(m.group(3))
        return total

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@contextlib.contextmanager
def running(artifact: Path, **kw) -> Iterator[Running]:
    cfg = ServeConfig(artifact=str(artifact), port=free_port(), threads=1, verify="sha256", drain_s=5, **kw)
    srv = Running(cfg)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(version: Path) -> Iterator[Running]:
    with running(version, max_batch=4, max_queue=16) as srv:
        yield srv


# ---- decoding and references -------------------------------------------------------------------


def decode(data: bytes, fmt: str) -> np.ndarray:
    """float32 mono 24 kHz samples of a response (16-bit formats / 32768, as the server quantizes)."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
    if fmt == "wav":
        return sf.read(io.BytesIO(data), dtype="float32")[0]
    # streamed FLAC has an unknown length, which libsndfile's reader refuses, and libsndfile has no AAC
    # decoder: ffmpeg reads both (aac with its 1,024 samples of priming first, which snr_db aligns away)
    import av

    container = av.open(io.BytesIO(data))
    resampler = av.AudioResampler(format="flt", layout="mono", rate=24000)
    out = [f.to_ndarray().reshape(-1) for frame in container.decode(audio=0) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.float32)


def snr_db(ref: np.ndarray, got: np.ndarray, max_lag: int = 3000) -> float:
    """SNR of `got` against `ref` at the best alignment (lossy codecs add a delay)."""
    best = None
    for lag in range(-max_lag, max_lag + 1):
        a, b = ref[max(0, -lag):], got[max(0, lag):]
        m = min(len(a), len(b))
        if m < 0.8 * len(ref):
            continue
        err = float(np.sum((a[:m] - b[:m]) ** 2))
        if best is None or err < best[0]:
            best = (err, m)
    assert best is not None, "decoded audio much shorter than the reference"
    err, m = best
    return float(10 * np.log10(np.sum(ref[:m].astype(np.float64) ** 2) / max(err, 1e-20)))


LOSSY_MIN_SNR = {"mp3": 10.0, "opus": 6.0, "aac": 10.0}  # measured on tiny audio: mp3 ~17, opus ~12, aac ~17 dB


def assert_same_audio(data: bytes, fmt: str, ref: np.ndarray) -> None:
    got = decode(data, fmt)
    if fmt in ("wav", "pcm", "flac"):  # 16-bit, as OpenAI's
        np.testing.assert_array_equal(to_int16(got), to_int16(ref))
    else:
        if fmt == "aac":  # ADTS: the decoder's 1,024 samples of priming first, less than a frame of padding last
            assert AAC_FRAME + len(ref) <= len(got) < 2 * AAC_FRAME + len(ref), (len(got), len(ref))
        assert snr_db(ref, got) >= LOSSY_MIN_SNR[fmt]
        assert snr_db(ref[::-1].copy(), got) < 3.0  # the comparison tells audio apart (same length, other content)


def synth_wav(tmp_path: Path, version: Path, variant: str, text: str, *extra: str, stream: bool = False,
              speaker: str | None = None, name: str = "ref") -> np.ndarray:
    out = tmp_path / f"{name}-{variant}-{int(stream)}.wav"
    args = ["synth", "--artifact", str(version), "--variant", variant, "--text", text, "--out", str(out),
            "--threads", "1", *extra]
    if speaker is not None:
        spk = tmp_path / "speaker.txt"
        spk.write_text(speaker, encoding="utf-8")
        args += ["--speaker", str(spk)]
    if stream:
        args.append("--stream")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return sf.read(out, dtype="float32")[0]


DEFAULT_KNOBS = ("--seed", "0", "--no-refine", "--max-new-token", str(STEPS))
CACHE_KNOBS = {"refine": False, "max_new_token": STEPS}  # the request DEFAULT_KNOBS make (the cache's)


# ---- the OpenAI endpoint -------------------------------------------------------------------------


def test_openai_client_every_format_streamed_and_whole_equals_synth(server: Running, version: Path,
                                                                    tmp_path: Path) -> None:
    client = server.client()
    alloy = httpx.get(server.url + "/v1/voices").json()["voices"]["alloy"]
    refs = {}
    for stream in (True, False):
        refs[stream] = synth_wav(tmp_path, version, "fp32", TEXT, *DEFAULT_KNOBS, stream=stream, speaker=alloy)
    np.testing.assert_allclose(refs[True], refs[False], atol=1e-5)  # a stream is the whole waveform
    for fmt in FORMATS:
        # create(): the server streams from the first final chunk; the client reads it all
        r = client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy", response_format=fmt,
                                       extra_body=CACHE_KNOBS)
        assert r.response.headers["x-forge-variant"] == "fp32"
        assert r.response.headers["content-type"].startswith({"wav": "audio/wav", "pcm": "audio/pcm",
                                                              "flac": "audio/flac", "mp3": "audio/mpeg",
                                                              "opus": "audio/ogg", "aac": "audio/aac"}[fmt])
        assert_same_audio(r.content, fmt, refs[True])
        # its streaming response, read chunk by chunk
        with client.audio.speech.with_streaming_response.create(model="tts-1", input=TEXT, voice="alloy",
                                                                response_format=fmt, extra_body=CACHE_KNOBS) as s:
            parts = list(s.iter_bytes())
        assert_same_audio(b"".join(parts), fmt, refs[True])
        # stream: false: the whole waveform decoded at once, synth's bytes
        r = client.audio.speech.create(model="tts-1", input=TEXT, voice="alloy", response_format=fmt,
                                       extra_body={**CACHE_KNOBS, "stream": False})
        assert_same_audio(r.content, fmt, refs[False])


def test_sse_stream_and_speed_and_knobs(server: Running, version: Path, tmp_path: Path) -> None:
    import base64

    knobs = {"seed": 7, "temperature": 0.5, "top_p": 0.8, "top_k": 10, "max_new_token": 30, "refine": False}
    body = {"model": "fp32", "input": TEXT, "voice": "echo", "response_format": "pcm", "speed": 1.6,
            "stream_format": "sse", **knobs}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 1
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    echo = httpx.get(server.url + "/v1/voices").json()["voices"]["echo"]
    # speed is a tempo change of the default-prompt synthesis, not ChatTTS's [speed_N] prompt
    ref = synth_wav(tmp_path, version, "fp32", TEXT, "--seed", "7", "--no-refine", "--temperature", "0.5",
                    "--top-p", "0.8", "--top-k", "10", "--max-new-token", "30", stream=True, speaker=echo)
    np.testing.assert_array_equal(np.frombuffer(pcm, "<i2"), to_int16(stretch(ref, 1.6, 24000)))
    hop = 256
    # output tokens are the code steps of the speed-1 synthesis (2 mel frames each), whatever the tempo
    assert events[-1]["usage"]["output_tokens"] == (len(ref) + hop) // (2 * hop)


def test_speed_scales_the_duration_streamed_and_whole(server: Running) -> None:
    body = {"model": "fp32", "input": TEXT, "voice": "alloy", "response_format": "wav", "seed": 5, **CACHE_KNOBS}
    got = {}
    for speed in (1.0, 2.0):
        for stream in (True, False):
            r = httpx.post(server.url + "/v1/audio/speech", json={**body, "speed": speed, "stream": stream},
                           timeout=120)
            assert r.status_code == 200, r.text
            got[speed, stream] = decode(r.content, "wav")
    for stream in (True, False):
        assert len(got[2.0, stream]) == round(len(got[1.0, stream]) / 2)
    # a stream is the whole waveform (to the synthesis' float tolerance), and so is its tempo change
    assert len(got[2.0, True]) == len(got[2.0, False])
    np.testing.assert_allclose(got[2.0, True], got[2.0, False], atol=2e-4)


def test_models_health_and_routing(server: Running, version: Path) -> None:
    client = server.client()
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == f"{version.parent.name}/{version.name}" and {"fp32", "fp16"} <= set(ids)
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server.url + "/readyz").json()["status"] == "ready"
    r = client.audio.speech.create(model="tts-1", input=SHORT, voice="nova", response_format="wav", extra_body=CACHE_KNOBS)
    assert r.response.headers["x-forge-variant"] == "fp16"  # routing.json: short texts to fp16
    r = client.audio.speech.create(model="fp32", input=SHORT, voice="nova", response_format="wav", extra_body=CACHE_KNOBS)
    assert r.response.headers["x-forge-variant"] == "fp32"  # a variant named as the model overrides


# ---- the ChatTTS-native endpoint -------------------------------------------------------------------


def test_native_endpoint_full_knobs_with_refinement_equals_synth(server: Running, version: Path,
                                                                 tmp_path: Path) -> None:
    body = {"text": TEXT, "model": "fp32", "response_format": "wav", "stream": False,
            "params_infer_code": {"manual_seed": 3, "temperature": 0.5, "top_P": 0.8, "top_K": 10,
                                  "max_new_token": 28, "spk_emb": None}}
    r = httpx.post(server.url + "/v1/chattts/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    ref = synth_wav(tmp_path, version, "fp32", TEXT, "--seed", "3", "--temperature", "0.5", "--top-p", "0.8",
                    "--top-k", "10", "--max-new-token", "28", name="refined")
    np.testing.assert_array_equal(to_int16(decode(r.content, "wav")), to_int16(ref))  # refinement on, as synth's
    body["skip_refine_text"] = True
    body["stream"] = True
    r = httpx.post(server.url + "/v1/chattts/speech", json=body, timeout=120)
    assert r.status_code == 200
    ref = synth_wav(tmp_path, version, "fp32", TEXT, "--seed", "3", "--temperature", "0.5", "--top-p", "0.8",
                    "--top-k", "10", "--max-new-token", "28", "--no-refine", stream=True, name="plain")
    np.testing.assert_array_equal(to_int16(decode(r.content, "wav")), to_int16(ref))


# ---- bad input, faults ----------------------------------------------------------------------------

# (body, what its error says, the field its error names as `param`: None where no one field is)
BAD_BODIES = [
    (b"{not json", "not valid JSON", None),
    (b"[1, 2]", "JSON object", None),
    ({"model": "tts-1", "voice": "alloy"}, "input must be a string (missing)", "input"),
    ({"model": "tts-1", "input": "   ", "voice": "alloy"}, "input is empty", "input"),
    ({"model": "tts-1", "input": "a" * 5000, "voice": "alloy"}, "at most 4096", "input"),
    ({"model": "tts-1", "input": 5, "voice": "alloy"}, "input must be a string", "input"),
    ({"model": "tts-1", "input": "Hi.", "voice": "nobody"}, "unknown voice 'nobody'", "voice"),
    ({"model": "tts-1", "input": "Hi.", "response_format": "ogg"}, "response_format must be one of", "response_format"),
    ({"model": "tts-1", "input": "Hi.", "speed": 9}, "speed must lie in", "speed"),
    ({"model": "tts-1", "input": "Hi.", "speed": "fast"}, "speed must be a number", "speed"),
    ({"model": "tts-1", "input": "Hi.", "temperature": -1}, "temperature must lie in", "temperature"),
    ({"model": "tts-1", "input": "Hi.", "top_k": True}, "top_k must be a whole number", "top_k"),
    ({"model": "tts-1", "input": "Hi.", "seed": 1.5}, "seed must be a whole number", "seed"),
    ({"model": "tts-1", "input": "Hi.", "stream_format": "ws"}, "stream_format must be", "stream_format"),
    ({"model": "tts-1", "input": "Hi.", "colour": "red"}, "unknown field 'colour'", "colour"),
    ({"model": "tts-1", "input": "Hi.", "voice": "x" * 300}, "neither a known name nor a valid speaker", "voice"),
    ({"model": "int4", "input": "Hi."}, "model 'int4' is not served", "model"),
    ({"model": "tts-1", "input": "!!!"}, "normalises to nothing speakable", "input"),
    ({"model": "tts-1", "input": "Hi.", "max_new_token": 4096}, "input too long", "input"),
]


def test_bad_bodies_answer_400_one_line_and_never_disturb_others(server: Running, version: Path,
                                                                 tmp_path: Path) -> None:
    before = server.metric("forge_errors_total", kind="bad_request")
    good: dict[str, bytes] = {}

    def healthy() -> None:
        with httpx.stream("POST", server.url + "/v1/audio/speech", timeout=60,
                          json={"model": "tts-1", "input": TEXT, "response_format": "wav",
                                "max_new_token": 60, "min_new_token": 60, "refine": False}) as r:
            good["status"] = str(r.status_code).encode()
            good["audio"] = b"".join(r.iter_bytes())

    t = threading.Thread(target=healthy)
    t.start()
    for body, message, param in BAD_BODIES:
        kw = {"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        r = httpx.post(server.url + "/v1/audio/speech", timeout=30, **kw)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert message in err["message"] and "\n" not in err["message"], (message, err)
        assert err["param"] == param, (body, err)  # the field at fault (OpenAI's `param`)
    bad_native = httpx.post(server.url + "/v1/chattts/speech", timeout=30,
                            json={"text": "Hi.", "params_infer_code": {"top_P": 2}})
    assert bad_native.status_code == 400 and "top_P must lie in" in bad_native.json()["error"]["message"]
    t.join()
    assert good["status"] == b"200"
    ref = synth_wav(tmp_path, version, "fp32", TEXT, "--seed", "0", "--no-refine", "--max-new-token", "60",
                    "--min-new-token", "60", stream=True)
    np.testing.assert_array_equal(to_int16(decode(good["audio"], "wav")), to_int16(ref))
    assert server.metric("forge_errors_total", kind="bad_request") - before == len(BAD_BODIES) + 1


def test_full_queue_429_deadline_504_disconnect_frees_row(version: Path) -> None:
    with running(version, max_batch=1, max_queue=1) as srv:
        long = {"model": "fp32", "input": TEXT, "response_format": "pcm", "max_new_token": 400,
                "min_new_token": 400, "refine": False}
        statuses: list[int] = []

        def call() -> None:
            r = httpx.post(srv.url + "/v1/audio/speech", json=long, timeout=120)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1" and "queue is full" in r.json()["error"]["message"]
            else:
                assert len(r.content) == 2 * 256 * (2 * 400 - 1)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join()
        assert statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses
        assert srv.metric("forge_errors_total", kind="queue_full") == statuses.count(429)

        # a deadline that passes before any audio: 504, and the row is freed
        r = httpx.post(srv.url + "/v1/audio/speech", json={**long, "deadline_s": 0.01, "stream": False}, timeout=60)
        assert r.status_code == 504 and "deadline" in r.json()["error"]["message"]

        # a client that disconnects mid-stream: its row is freed at the next step
        with httpx.stream("POST", srv.url + "/v1/audio/speech", json=long, timeout=60) as r:
            first = next(r.iter_bytes())
            assert first
        deadline = time.time() + 20
        while time.time() < deadline and (srv.state.current.running or srv.state.current.waiting):
            time.sleep(0.05)
        assert srv.state.current.running == 0
        assert srv.metric("forge_errors_total", kind="disconnect") >= 1
        assert srv.metric("forge_errors_total", kind="deadline") >= 1
        ok = httpx.post(srv.url + "/v1/audio/speech", timeout=60,
                        json={"model": "fp32", "input": "Hi.", "response_format": "wav", **CACHE_KNOBS})
        assert ok.status_code == 200


# ---- phrase cache --------------------------------------------------------------------------------


def test_phrase_cache_hit_skips_the_gpt_and_other_knobs_are_misses(server: Running, version: Path,
                                                                   tmp_path: Path) -> None:
    sched = server.state.current.schedulers
    steps = {v: s.steps for v, s in sched.items()}
    hits = server.metric("forge_phrase_cache_hits_total", tier="file")
    r = httpx.post(server.url + "/v1/audio/speech", timeout=60,
                   json={"model": "tts-1", "input": PHRASES[1], "response_format": "wav", **CACHE_KNOBS})
    assert r.status_code == 200 and r.headers["x-forge-cached"] == "true"
    assert {v: s.steps for v, s in sched.items()} == steps  # served without one GPT step
    assert server.metric("forge_phrase_cache_hits_total", tier="file") == hits + 1
    variant = r.headers["x-forge-variant"]
    ref = synth_wav(tmp_path, version, variant, PHRASES[1], *DEFAULT_KNOBS)
    assert float(np.max(np.abs(decode(r.content, "wav") - ref))) <= 1e-4  # the miss's waveform
    # speed is applied to the cached speed-1 waveform: still a hit
    r = httpx.post(server.url + "/v1/audio/speech", timeout=60, json={"model": "tts-1", "input": PHRASES[1],
                                                                      "response_format": "wav", "speed": 2.0,
                                                                      **CACHE_KNOBS})
    assert r.status_code == 200 and r.headers["x-forge-cached"] == "true"
    assert len(decode(r.content, "wav")) == round(len(ref) / 2)
    # other knobs (seed): a miss, synthesized as usual
    r = httpx.post(server.url + "/v1/audio/speech", timeout=60,
                   json={"model": "tts-1", "input": PHRASES[1], "response_format": "wav", **CACHE_KNOBS, "seed": 5})
    assert r.status_code == 200 and r.headers["x-forge-cached"] == "false"
    assert sum(s.steps for s in sched.values()) > sum(steps.values())


class OverlapWatch:
    """A GPT step wrapper that counts calls made while another call (another thread) is inside it."""

    def __init__(self, step) -> None:
        self.step, self.inside, self.overlaps, self.calls = step, 0, 0, 0
        self._lock = threading.Lock()

    def reset(self, batch: int) -> None:
        self.step.reset(batch)

    @property
    def past_length(self) -> int:
        return self.step.past_length

    def __call__(self, *args):
        with self._lock:
            self.calls += 1
            self.overlaps += self.inside > 0
            self.inside += 1
        try:
            time.sleep(0.002)  # widen the window a second thread would need to come in
            return self.step(*args)
        finally:
            with self._lock:
                self.inside -= 1


def test_request_work_runs_on_the_servers_bounded_pool(server: Running) -> None:
    """prepare and whole decodes run on the state's pool of `work_threads()` threads, not asyncio's
    default one (cores + 4 threads, each with its own decode buffers: issue 37's soak)."""
    from chattts_forge.runtime.serve.state import work_threads

    version = server.state.current
    seen: list[str] = []
    original = version.prepare, version.whole_wav

    def record(fn):
        def wrapped(*args):
            seen.append(threading.current_thread().name)
            return fn(*args)
        return wrapped

    version.prepare, version.whole_wav = record(original[0]), record(original[1])
    try:
        r = httpx.post(server.url + "/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "input": TEXT, "response_format": "pcm", "stream": False, "seed": 3, **CACHE_KNOBS})
    finally:
        version.prepare, version.whole_wav = original
    assert r.status_code == 200 and len(seen) == 2
    assert all(name.startswith("forge-work") for name in seen), seen
    assert server.state.work._max_workers == work_threads() >= 2


def test_refinement_and_a_sequential_variant_take_turns_on_its_gpt_step(server: Running) -> None:
    # fp16 has no fused graph: its requests run on the SequentialRunner with `pipe.gpt`, the step a
    # request's refinement (prepare, on another thread) runs on too; found by the soak (issue 37).
    pipe = server.state.current.pipes["fp16"]
    original = pipe.gpt
    watch = OverlapWatch(original)
    pipe.gpt = watch
    try:
        def one(i: int) -> int:
            return httpx.post(server.url + "/v1/audio/speech", timeout=120,
                              json={"model": "tts-1", "input": SHORT, "response_format": "pcm", "seed": i,
                                    "max_new_token": 16, "refine": True}).status_code

        with ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(one, range(6)))
    finally:
        pipe.gpt = original
    assert codes == [200] * 6
    assert watch.calls > 0 and watch.overlaps == 0


# ---- version swaps ---------------------------------------------------------------------------------


def test_reload_under_load_drops_no_request_and_a_failed_one_keeps_serving(version: Path, tiny_artifacts) -> None:
    with running(version, max_batch=4, max_queue=64) as srv:
        results: list[tuple[int, int]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                with httpx.stream("POST", srv.url + "/v1/audio/speech", timeout=60,
                                  json={"model": "tts-1", "input": TEXT, "response_format": "pcm",
                                        "max_new_token": 40, "min_new_token": 40, "refine": False}) as r:
                    results.append((r.status_code, len(b"".join(r.iter_bytes()))))

        workers = [threading.Thread(target=load) for _ in range(3)]
        for w in workers:
            w.start()
        time.sleep(0.5)
        bad = httpx.post(srv.url + "/admin/reload", json={"artifact": "/nonexistent/v9"}, timeout=120,
                         headers=srv.admin())
        assert bad.status_code == 422 and "still serving" in bad.json()["error"]["message"]
        assert httpx.get(srv.url + "/readyz").json()["model"] == srv.state.current.model_id
        old = srv.state.current
        r = httpx.post(srv.url + "/admin/reload", json={"artifact": str(tiny_artifacts["fp32"])}, timeout=120,
                       headers=srv.admin())
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "fp32" and srv.state.current is not old
        time.sleep(0.5)
        stop.set()
        for w in workers:
            w.join()
        assert results and all(status == 200 and n == 2 * 256 * (2 * 40 - 1) for status, n in results), results
        assert srv.metric("forge_reloads_total", result="ok") == 1
        assert srv.metric("forge_reloads_total", result="failed") == 1
        deadline = time.time() + 10
        while time.time() < deadline and old.schedulers:
            time.sleep(0.05)
        assert not old.schedulers  # the old version closed once its requests had finished


def test_admin_needs_the_token(version: Path) -> None:
    with running(version, admin_token="s3cret") as srv:
        r = httpx.post(srv.url + "/admin/reload", json={"artifact": str(version)}, timeout=60)
        assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/admin/reload", json={"artifact": str(version)}, timeout=120,
                       headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200


def test_canary_share_then_promote(version: Path, tiny_artifacts) -> None:
    with running(version, canary_share=0.5) as srv:
        r = httpx.post(srv.url + "/admin/reload", json={"artifact": str(tiny_artifacts["fp32"])}, timeout=120,
                       headers=srv.admin())
        assert r.status_code == 200 and "canary" in r.json()["serves"]
        models = set()
        for _ in range(16):
            r = httpx.post(srv.url + "/v1/audio/speech", timeout=60,
                           json={"model": "tts-1", "input": "Hi there.", "response_format": "wav", **CACHE_KNOBS})
            assert r.status_code == 200
            models.add(r.headers["x-forge-model"])
        assert models == {"fp32", f"{version.parent.name}/{version.name}"}
        assert httpx.post(srv.url + "/admin/promote", json={}, headers=srv.admin(), timeout=30).status_code == 200
        r = httpx.post(srv.url + "/v1/audio/speech", timeout=60,
                       json={"model": "tts-1", "input": "Hi there.", "response_format": "wav", **CACHE_KNOBS})
        assert r.headers["x-forge-model"] == "fp32"


# ---- Redis shared cache ------------------------------------------------------------------------------


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; make test installs it)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port)
        deadline = time.time() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_redis_cache_shared_by_two_replicas_and_checked(version: Path, redis_url: str) -> None:
    import redis

    body = {"model": "tts-1", "input": TEXT, "response_format": "wav", "seed": 11, "stream": False}
    with running(version, cache_redis=redis_url) as a, running(version, cache_redis=redis_url) as b:
        first = httpx.post(a.url + "/v1/audio/speech", json=body, timeout=60)
        assert first.status_code == 200 and first.headers["x-forge-cached"] == "false"
        keys = redis.Redis.from_url(redis_url).keys("chattts-forge:phrase:*")
        assert len(keys) == 1
        second = httpx.post(b.url + "/v1/audio/speech", json=body, timeout=60)
        assert second.headers["x-forge-cached"] == "true"  # the other replica's synthesis
        assert b.metric("forge_phrase_cache_hits_total", tier="redis") == 1
        np.testing.assert_allclose(decode(second.content, "wav"), decode(first.content, "wav"), atol=1e-4)
        # a damaged value is refused (deleted), never served: a miss synthesized as usual
        client = redis.Redis.from_url(redis_url)
        value = bytearray(client.get(keys[0]))
        value[len(value) // 2] ^= 0xFF
        client.set(keys[0], bytes(value))
        third = httpx.post(b.url + "/v1/audio/speech", json=body, timeout=60)
        assert third.status_code == 200 and third.headers["x-forge-cached"] == "false"
        np.testing.assert_array_equal(decode(third.content, "wav"), decode(first.content, "wav"))
        assert b.state.current.redis.rejected == 1
        # other knobs (refinement off: the default refines): a miss, stored under a key of its own
        n = len(client.keys("*"))
        r = httpx.post(a.url + "/v1/audio/speech", json={**body, "refine": False}, timeout=120)
        assert r.status_code == 200 and r.headers["x-forge-cached"] == "false" and len(client.keys("*")) == n + 1


# ---- the command: bad input, SIGTERM drain, SIGHUP reload ---------------------------------------------


def test_serve_cli_bad_artifact_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["serve", "--artifact", str(tmp_path / "missing")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "neither an artifact folder" in res.output


def test_sigterm_drains_open_streams_and_sighup_reloads(version: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chattts_forge.cli", "serve", "--artifact", str(version),
                                 "--port", str(port), "--threads", "1", "--verify", "sha256", "--drain", "30"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 60
        while "reload:" not in log.read_text() and time.time() < deadline:
            time.sleep(0.1)
        assert "reload:" in log.read_text()
        steps = 300
        with httpx.stream("POST", url + "/v1/audio/speech", timeout=120,
                          json={"model": "fp32", "input": TEXT, "response_format": "pcm", "max_new_token": steps,
                                "min_new_token": steps, "refine": False}) as r:
            it = r.iter_bytes()
            got = [next(it)]
            proc.send_signal(signal.SIGTERM)
            got += list(it)  # the open stream finishes
        assert len(b"".join(got)) == 2 * 256 * (2 * steps - 1)
        assert proc.wait(timeout=60) == 0
        assert "draining" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- bench --load --url ----------------------------------------------------------------------------


def test_bench_load_over_http_reports_http_and_in_process_figures(tiny_artifacts, tmp_path: Path) -> None:
    with running(tiny_artifacts["fp32"], max_batch=2) as srv:
        out = tmp_path / "load.json"
        res = CliRunner().invoke(main, ["bench", "--artifact", str(tiny_artifacts["fp32"]), "--load", "--url", srv.url,
                                        "--concurrency", "2", "--requests", "4", "--threads", "1", "--json", str(out)])
        assert res.exit_code == 0, res.output
        report = json.loads(out.read_text())
        row = report["results"]["2"]
        http = row["http"]
        assert http["completed"] == row["completed"] == 4 and not http["failed"]
        assert http["audio_s"] == pytest.approx(row["audio_s"])  # the same requests, the same audio lengths
        assert http["first_audio_s"]["p95"] is not None and http["latency_s"]["p99"] is not None
        assert row["http_vs_in_process_sentences_per_s"] == pytest.approx(http["sentences_per_s"] / row["sentences_per_s"])
        assert "over HTTP" in res.output
        assert srv.metric("forge_sentences_total") == 4
    bad = CliRunner().invoke(main, ["bench", "--artifact", str(tiny_artifacts["fp32"]), "--load", "--url", "ftp://x"])
    assert bad.exit_code == 2 and "--url must be http" in bad.output


# ---- everything at once ----------------------------------------------------------------------------


def test_mixed_faults_leave_the_healthy_requests_correct(version: Path, tiny_artifacts) -> None:
    """Concurrent streaming clients while a client disconnects mid-stream, the queue overflows, bad
    bodies arrive and a reload fails: every healthy request gets its exact audio, every bad one its
    status and one-line error, and /metrics counts them."""
    from chattts_forge.runtime.pipeline import Pipeline

    steps = 90
    pipe = Pipeline(version / "fp32", threads=1)
    params = SynthParams(code=InferCodeParams(seed=0, max_new_token=steps, min_new_token=steps))
    # the server streams at the artifact's recorded look-ahead (a library stream defaults to exact)
    ref = to_int16(np.concatenate([c[0] for c in pipe.stream([TEXT], params, lookahead_frames=pipe.default_lookahead)]))
    body = {"model": "fp32", "input": TEXT, "response_format": "pcm", "max_new_token": steps, "min_new_token": steps,
            "refine": False}
    with running(version, max_batch=3, max_queue=1) as srv:
        healthy: list[tuple[int, bytes]] = []
        bad: list[tuple[int, str]] = []

        def stream_one() -> None:
            with httpx.stream("POST", srv.url + "/v1/audio/speech", json=body, timeout=120) as r:
                healthy.append((r.status_code, b"".join(r.iter_bytes()) if r.status_code == 200 else r.read()))

        def disconnect() -> None:
            with httpx.stream("POST", srv.url + "/v1/audio/speech", json=body, timeout=120) as r:
                if r.status_code == 200:
                    next(r.iter_bytes())  # then the connection closes mid-stream

        def bad_ones() -> None:
            for b, _, _ in BAD_BODIES[:8]:
                kw = {"content": b, "headers": {"Content-Type": "application/json"}} if isinstance(b, bytes) \
                    else {"json": b}
                r = httpx.post(srv.url + "/v1/audio/speech", timeout=30, **kw)
                bad.append((r.status_code, r.json()["error"]["message"]))
            r = httpx.post(srv.url + "/admin/reload", json={"artifact": str(version / "missing")}, timeout=60,
                           headers=srv.admin())
            bad.append((r.status_code, r.json()["error"]["message"]))

        # the disconnecting client and two healthy ones take the 3 rows, one more waits, the rest overflow
        threads = [threading.Thread(target=f) for f in (disconnect, stream_one, stream_one, bad_ones,
                                                          stream_one, stream_one, stream_one, stream_one)]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join()
        ok = [data for status, data in healthy if status == 200]
        overflow = [status for status, _ in healthy if status != 200]
        assert len(ok) >= 2 and set(overflow) <= {429}
        for data in ok:
            np.testing.assert_array_equal(np.frombuffer(data, "<i2"), ref)
        assert [s for s, _ in bad] == [400] * 8 + [422]
        assert all("\n" not in m for _, m in bad)
        assert srv.metric("forge_errors_total", kind="bad_request") == 8
        assert srv.metric("forge_errors_total", kind="reload_failed") == 1
        assert srv.metric("forge_errors_total", kind="queue_full") == len(overflow)
        assert srv.metric("forge_requests_total", endpoint="/v1/audio/speech", status="200") == len(ok)
        deadline = time.time() + 20
        while time.time() < deadline and srv.metric("forge_errors_total", kind="disconnect") < 1:
            time.sleep(0.05)
        assert srv.metric("forge_errors_total", kind="disconnect") >= 1
        assert httpx.get(srv.url + "/readyz").status_code == 200


def test_stream_lookahead_field(server: Running, version: Path) -> None:
    """Streams default to the artifact's recorded look-ahead (as `synth --stream`); `"stream_lookahead":
    "exact"` gives the receptive-field stream and a number that many frames, on both endpoints; a bad
    value is a 400 naming the field."""
    from chattts_forge.runtime.pipeline import Pipeline

    steps = 60
    pipe = Pipeline(version / "fp32", threads=1)
    params = SynthParams(code=InferCodeParams(seed=0, max_new_token=steps, min_new_token=steps))

    def library(lookahead: int | None) -> np.ndarray:
        return to_int16(np.concatenate([c[0] for c in pipe.stream([TEXT], params, lookahead_frames=lookahead)]))

    def served(endpoint: str, body: dict) -> np.ndarray:
        with httpx.stream("POST", server.url + endpoint, json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            return np.frombuffer(b"".join(r.iter_bytes()), "<i2")

    openai = {"model": "fp32", "input": TEXT, "response_format": "pcm", "max_new_token": steps,
              "min_new_token": steps, "refine": False, "seed": 0}
    native = {"model": "fp32", "text": TEXT, "response_format": "pcm", "skip_refine_text": True,
              "params_infer_code": {"max_new_token": steps, "min_new_token": steps, "manual_seed": 0}}
    assert pipe.default_lookahead is not None  # the tiny build records one
    for asked, frames in ((None, pipe.default_lookahead), ("exact", None), (3, 3)):
        extra = {} if asked is None else {"stream_lookahead": asked}
        want = library(frames)
        np.testing.assert_array_equal(served("/v1/audio/speech", {**openai, **extra}), want)
        np.testing.assert_array_equal(served("/v1/chattts/speech", {**native, **extra}), want)
    for endpoint, body in (("/v1/audio/speech", openai), ("/v1/chattts/speech", native)):
        r = httpx.post(server.url + endpoint, json={**body, "stream_lookahead": "soon"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_lookahead", r.text
