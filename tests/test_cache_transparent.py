"""Issue 34: the phrase cache is transparent in `synth`, `serve` (both endpoints) and the Redis tier.

`warm` records the whole request it cached, refinement included, and refines by default like `synth`
and ChatTTS; `synth`, `serve` and warm share their defaults (seed 0), so a plain `synth --cache` or a
default HTTP request of a warmed phrase is a hit, and a hit is the audio the same request gets
without the cache (within 1e-4). A request whose knobs differ is a miss, synthesized as usual: no
knob is ever taken from the cache.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
from test_serve import Running, redis_url, running  # noqa: E402, F401 - redis_url: the fixture

from chattts_forge.calibration_data.phrases import shipped_phrase_file  # noqa: E402
from chattts_forge.cli import main  # noqa: E402
from chattts_forge.runtime import InferCodeParams, Pipeline, RefineTextParams, SynthParams  # noqa: E402
from chattts_forge.runtime.phrase_cache import PhraseCache, cache_knobs  # noqa: E402

SHIPPED = 6  # the first shipped phrases, warmed with the default knobs (as a build warms them all)
OTHERS = ["这句话不在缓存里。", "This sentence is not in the cache."]
EXPLICIT = ["--seed", "3", "--temperature", "0.5", "--top-k", "10", "--max-new-token", "40", "--no-refine"]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def phrases() -> list[str]:
    lines = [line.strip() for line in shipped_phrase_file().read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[:SHIPPED]


def _warm(artifact: Path, phrases: list[str], out: Path, *knobs: str) -> Path:
    listing = out.with_suffix(".txt")
    listing.write_text("\n".join(phrases) + "\n", encoding="utf-8")
    res = CliRunner().invoke(main, ["warm", "--artifact", str(artifact), "--phrases", str(listing), "--out", str(out),
                                    "--threads", "1", *knobs])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def default_cache(tiny_artifacts, phrases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`warm` with no knob given: the defaults."""
    return _warm(tiny_artifacts["fp32"], phrases, tmp_path_factory.mktemp("warm") / "default.cache")


@pytest.fixture(scope="module")
def explicit_cache(tiny_artifacts, phrases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _warm(tiny_artifacts["fp32"], phrases[:2], tmp_path_factory.mktemp("warm") / "explicit.cache", *EXPLICIT)


def test_warm_records_the_whole_request_refinement_included(tiny_artifacts, default_cache, explicit_cache,
                                                            phrases) -> None:
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1)
    defaults = SynthParams(code=InferCodeParams(seed=0), refine=RefineTextParams(seed=0))
    cache = PhraseCache(default_cache)
    assert cache.knobs == cache_knobs(defaults, pipe.num_vq)
    assert cache.knobs["refine"] == {"prompt": "", "top_p": 0.7, "top_k": 20, "temperature": 0.7,
                                     "repetition_penalty": 1.0, "max_new_token": 384, "min_new_token": 0,
                                     "ensure_non_empty": True, "seed": 0}
    # each entry: keyed by the text before refinement, holding the text the code stage spoke
    for entry in cache.entries.values():
        [refined] = pipe.refine_text([entry["text"]], defaults.refine)
        assert entry.get("spoken", entry["text"]) == refined
    assert sorted(cache.texts()) == sorted(pipe.normalize(p) for p in phrases)
    assert PhraseCache(explicit_cache).knobs["refine"] is False  # --no-refine is recorded too


def _synth(tmp_path: Path, artifact: Path, text: str, name: str, *extra: str) -> np.ndarray:
    out = tmp_path / f"{name}.wav"
    res = CliRunner().invoke(main, ["synth", "--artifact", str(artifact), "--text", text, "--out", str(out),
                                    "--threads", "1", *extra])
    assert res.exit_code == 0, res.output
    return sf.read(out, dtype="float32")[0]


def _served_from_cache(tmp_path: Path, artifact: Path, text: str, cache: Path, knobs: list[str], caplog) -> str:
    """The `synth` library's log line of how many texts `cache` served (the command resets logging)."""
    from chattts_forge.runtime.synth import SynthConfig, synthesize_to_files

    values = dict(zip(knobs[::2], knobs[1::2], strict=False))
    cfg = SynthConfig(artifact=artifact, out=tmp_path / "lib.wav", text=text, cache_path=cache, threads=1,
                      seed=int(values.get("--seed", 0)), temperature=float(values.get("--temperature", 0.3)),
                      top_k=int(values.get("--top-k", 20)), max_new_token=int(values.get("--max-new-token", 2048)),
                      refine="--no-refine" not in knobs)
    caplog.clear()
    root = logging.getLogger()
    root.addHandler(caplog.handler)  # the command's logging set-up (basicConfig(force=True)) removed it
    try:
        synthesize_to_files(cfg)
    finally:
        root.removeHandler(caplog.handler)
    return next(r.getMessage() for r in caplog.records if "served from it" in r.getMessage())


def test_plain_synth_cache_is_a_hit_and_the_audio_of_plain_synth(tiny_artifacts, default_cache, explicit_cache,
                                                                 phrases, tmp_path, caplog) -> None:
    artifact = tiny_artifacts["fp32"]
    caplog.set_level(logging.INFO, logger="chattts_forge.runtime.synth")
    for cache, knobs in ((default_cache, []), (explicit_cache, EXPLICIT)):
        for i, text in enumerate(phrases[:2]):
            plain = _synth(tmp_path, artifact, text, f"plain-{i}", *knobs)
            cached = _synth(tmp_path, artifact, text, f"cached-{i}", "--cache", str(cache), *knobs)
            assert plain.shape == cached.shape and plain.size > 0
            assert float(np.max(np.abs(plain - cached))) <= TOLERANCE
            assert "1 of 1 text(s) served from it" in _served_from_cache(tmp_path, artifact, text, cache, knobs, caplog)
    # knobs that differ from the cache's (the defaults against the explicit cache): a miss, synthesized
    # as usual with the request's own knobs, none taken from the cache
    cached = _synth(tmp_path, artifact, phrases[0], "other", "--cache", str(explicit_cache))
    np.testing.assert_array_equal(cached, _synth(tmp_path, artifact, phrases[0], "plain-0"))
    assert "0 of 1 text(s) served from it" in _served_from_cache(tmp_path, artifact, phrases[0], explicit_cache, [],
                                                                 caplog)


def test_library_hit_equals_miss_text_and_audio(tiny_artifacts, default_cache, phrases) -> None:
    plain = Pipeline(tiny_artifacts["fp32"], threads=1)
    cached = Pipeline(tiny_artifacts["fp32"], threads=1, cache=default_cache)
    defaults = SynthParams(code=InferCodeParams(seed=0), refine=RefineTextParams(seed=0))
    hits = cached.synthesize([*phrases, *OTHERS], defaults)
    misses = plain.synthesize([*phrases, *OTHERS], defaults)
    assert [r.cached for r in hits] == [True] * len(phrases) + [False] * len(OTHERS)
    for hit, miss in zip(hits, misses, strict=True):
        assert hit.text == miss.text  # the refined text, recorded by warm
        np.testing.assert_array_equal(hit.codes, miss.codes)
        assert hit.wav.shape == miss.wav.shape and float(np.max(np.abs(hit.wav - miss.wav))) <= TOLERANCE


def _wav(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return sf.read(io.BytesIO(response.content), dtype="float32")[0]


@pytest.fixture(scope="module")
def servers(tiny_artifacts, default_cache) -> Iterator[tuple[Running, Running]]:
    """(a server with the default cache, the same server without a cache)."""
    with running(tiny_artifacts["fp32"], phrase_cache=str(default_cache)) as cached, \
            running(tiny_artifacts["fp32"]) as plain:
        yield cached, plain


def test_default_http_requests_hit_on_the_shipped_phrases_and_equal_the_uncached(servers, phrases) -> None:
    cached, plain = servers
    served = []
    for text in [*phrases, *OTHERS]:  # as a client sends them: no knob, the raw line
        body = {"model": "tts-1", "input": text, "response_format": "wav", "stream": False}
        hit = httpx.post(cached.url + "/v1/audio/speech", json=body, timeout=300)
        miss = httpx.post(plain.url + "/v1/audio/speech", json=body, timeout=300)
        assert miss.headers["x-forge-cached"] == "false"
        served.append(hit.headers["x-forge-cached"] == "true")
        a, b = _wav(hit), _wav(miss)
        assert a.shape == b.shape and float(np.max(np.abs(a - b))) <= TOLERANCE
    hit_rate = sum(served[: len(phrases)]) / len(phrases)
    assert hit_rate == 1.0, served  # every shipped phrase warmed with the defaults is served from the cache
    assert not any(served[len(phrases):])
    assert cached.metric("forge_phrase_cache_hits_total", tier="file") >= len(phrases)
    # the native endpoint's defaults are the same request (refinement on, the server's seed): a hit too
    native = httpx.post(cached.url + "/v1/chattts/speech", json={"text": phrases[0], "stream": False}, timeout=300)
    assert native.headers["x-forge-cached"] == "true"
    first = httpx.post(plain.url + "/v1/audio/speech", timeout=300,
                       json={"model": "tts-1", "input": phrases[0], "response_format": "wav", "stream": False})
    assert float(np.max(np.abs(_wav(native) - _wav(first)))) <= TOLERANCE


def test_explicit_knobs_hit_when_they_are_the_cache_and_miss_when_they_differ(servers, phrases) -> None:
    cached, plain = servers
    body = {"model": "tts-1", "input": phrases[1], "response_format": "wav", "stream": False}
    same = {"seed": 0, "temperature": 0.3, "top_p": 0.7, "top_k": 20, "max_new_token": 2048, "refine": True}
    for knobs, hit in ((same, True), ({**same, "seed": 5}, False), ({**same, "refine": False}, False),
                       ({**same, "top_k": 10}, False)):
        a = httpx.post(cached.url + "/v1/audio/speech", json={**body, **knobs}, timeout=300)
        b = httpx.post(plain.url + "/v1/audio/speech", json={**body, **knobs}, timeout=300)
        assert a.headers["x-forge-cached"] == str(hit).lower(), knobs
        wa, wb = _wav(a), _wav(b)
        assert wa.shape == wb.shape and float(np.max(np.abs(wa - wb))) <= TOLERANCE, knobs


def test_redis_tier_is_transparent_with_default_knobs(tiny_artifacts, redis_url: str) -> None:  # noqa: F811
    body = {"model": "tts-1", "input": OTHERS[1], "response_format": "wav", "stream": False}
    with running(tiny_artifacts["fp32"], cache_redis=redis_url) as a, \
            running(tiny_artifacts["fp32"], cache_redis=redis_url) as b:
        miss = httpx.post(a.url + "/v1/audio/speech", json=body, timeout=300)
        assert miss.headers["x-forge-cached"] == "false"
        hit = httpx.post(b.url + "/v1/audio/speech", json=body, timeout=300)
        assert hit.headers["x-forge-cached"] == "true"  # the refined default request, stored by the other replica
        wa, wb = _wav(miss), _wav(hit)
        assert wa.shape == wb.shape and float(np.max(np.abs(wa - wb))) <= TOLERANCE
        other = httpx.post(b.url + "/v1/audio/speech", json={**body, "seed": 9}, timeout=300)
        assert other.headers["x-forge-cached"] == "false"  # other knobs: a miss, never the stored audio
