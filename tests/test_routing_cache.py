"""Issue 14: precision routing by text length (routing.json, Router) and the warm phrase cache.

Everything runs on the session's tiny FP32/FP16 artifacts. Versions are published with stand-in
reports whose per-bucket verdicts are chosen by the test (tests/stand_in_report.py); the per-bucket
evaluation itself is checked on a real evaluate run at the end.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from stand_in_report import publish_stand_in_version

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.runtime import InferCodeParams, Pipeline, RefineTextParams, SynthParams
from chattts_forge.runtime.phrase_cache import PhraseCache
from chattts_forge.runtime.phrase_cache_build import build_phrase_cache, read_phrase_list
from chattts_forge.runtime.router import ROUTING_NAME, Router, buckets_from_edges, text_length

STEPS = 24  # random weights never emit EOS: every phrase runs to max_new_token


def params(seed: int = 0, **kw) -> SynthParams:
    return SynthParams(code=InferCodeParams(seed=seed, max_new_token=STEPS, **kw))


@pytest.fixture(scope="module")
def phrase_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("phrases") / "phrases.txt"
    path.write_text("请稍等\nPlease hold on a moment.\n你好，很高兴为您服务\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fp32_cache(tiny_artifacts: dict[str, Path], phrase_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cache") / "fp32.cache"
    summary = build_phrase_cache(tiny_artifacts["fp32"], phrase_file, out, params(), threads=1)
    assert summary["phrases"] == 3 and summary["variants"] == {"fp32": 3}
    return out


# ---- phrase list bad input ---------------------------------------------------------------------


def test_phrase_list_skips_blank_and_duplicate_lines_naming_them(tiny_artifacts, tmp_path, caplog) -> None:
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1)
    path = tmp_path / "list.txt"
    path.write_text("请稍等\n\n  \nPlease hold.\n请稍等\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        got = read_phrase_list(path, pipe.normalize)
    assert [n for n, _ in got] == [1, 4]
    text = caplog.text
    assert "line 2 is empty: skipped" in text and "line 3 is empty: skipped" in text
    assert "line 5 repeats line 1" in text


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("请稍等\n!!! ...\n", r"line 2 \('!!! \.\.\.'\) cannot be spoken"),
        ("\n\n", r"holds no phrase"),
        (None, r"not UTF-8 \(line 2\)"),
    ],
)
def test_phrase_list_refusals_name_the_line(tiny_artifacts, tmp_path, content, pattern) -> None:
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1)
    path = tmp_path / "list.txt"
    if content is None:
        path.write_bytes("请稍等\n".encode() + b"\xff\xfe bad\n")
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ForgeError, match=pattern):
        read_phrase_list(path, pipe.normalize)
    with pytest.raises(ForgeError, match="does not exist"):
        read_phrase_list(tmp_path / "missing.txt", pipe.normalize)


# ---- the cache at run time -----------------------------------------------------------------------


def test_hit_gives_the_miss_waveform(tiny_artifacts, fp32_cache: Path) -> None:
    plain = Pipeline(tiny_artifacts["fp32"], threads=1)
    cached = Pipeline(tiny_artifacts["fp32"], threads=1, cache=fp32_cache)
    for text in ("请稍等", "Please hold on a moment."):
        [miss] = plain.synthesize(text, params())
        [hit] = cached.synthesize(text, params())
        assert hit.cached and not miss.cached
        assert hit.wav.shape == miss.wav.shape and miss.wav.size > 0
        assert float(np.max(np.abs(hit.wav - miss.wav))) <= 1e-4
        np.testing.assert_array_equal(hit.codes, miss.codes)
        assert hit.hiddens.shape == (0, plain.dims.hidden_size)
    # a batch mixing a hit and a miss: each row as alone
    both = cached.synthesize(["请稍等", "这句没有缓存。"], params())
    assert [r.cached for r in both] == [True, False]
    [alone] = plain.synthesize("这句没有缓存。", params())
    assert float(np.max(np.abs(both[1].wav - alone.wav))) <= 1e-4
    assert cached.cache.cache.hits >= 3 and cached.cache.cache.misses >= 1


def test_other_knobs_are_misses_synthesized_as_usual(tiny_artifacts, fp32_cache: Path, caplog) -> None:
    """A request the cache cannot serve (other knobs, refinement on, no seed) is never served from it and
    never an error: it is synthesized exactly as without a cache, and the log says why once."""
    plain = Pipeline(tiny_artifacts["fp32"], threads=1)
    cached = Pipeline(tiny_artifacts["fp32"], threads=1, cache=fp32_cache)
    spk = cached.random_speaker(3)
    cases = [(params(seed=1), "seed: cache 0, request 1"), (params(spk_emb=spk), "speaker_sha256: cache None"),
             (params(temperature=0.5), "temperature: cache"), (params(prompt="[speed_2]"), "prompt: cache"),
             (params(seed=None), "has no seed")]
    caplog.set_level(logging.INFO, logger="chattts_forge.runtime.phrase_cache")
    for p, reason in cases:
        [got] = cached.synthesize("请稍等", p)
        assert not got.cached
        assert reason in caplog.text
        if p.code.seed is not None:  # unseeded sampling differs run to run by design
            [want] = plain.synthesize("请稍等", p)
            np.testing.assert_array_equal(got.codes, want.codes)
            np.testing.assert_array_equal(got.wav, want.wav)
    refined = SynthParams(code=params().code, refine=RefineTextParams(seed=0, max_new_token=8))
    [got] = cached.synthesize("请稍等", refined)
    assert not got.cached and "refine: cache False, request {" in caplog.text
    assert cached.cache.cache.hits == 0


def test_cache_of_another_artifact_is_refused(tiny_artifacts, fp32_cache: Path) -> None:
    with pytest.raises(ForgeError, match=r"was built for other artifacts \(fp32 [0-9a-f]{12}\)"):
        Pipeline(tiny_artifacts["fp16"], threads=1, cache=fp32_cache)


@pytest.mark.parametrize("where", ["header", "data", "trailer"])
def test_tampered_cache_is_refused_naming_the_file(fp32_cache: Path, tmp_path: Path, where: str) -> None:
    data = bytearray(fp32_cache.read_bytes())
    at = {"header": 60, "data": len(data) // 2, "trailer": len(data) - 1}[where]
    data[at] ^= 0x01
    bad = tmp_path / "tampered.cache"
    bad.write_bytes(bytes(data))
    with pytest.raises(ForgeError, match=re.escape(str(bad)) + r" is damaged or was changed"):
        PhraseCache(bad)
    bad.write_bytes(bytes(data[:-40]))
    with pytest.raises(ForgeError, match=re.escape(str(bad))):
        PhraseCache(bad)


def test_cache_bytes_are_deterministic_and_lru_is_bounded(tiny_artifacts, phrase_file, fp32_cache, tmp_path,
                                                          caplog, monkeypatch) -> None:
    again = tmp_path / "again.cache"
    monkeypatch.setenv("CHATTTS_FORGE_PROGRESS", "log")  # as in a build's log: done / total, rate, ETA
    with caplog.at_level(logging.INFO, logger="chattts_forge"):
        summary = build_phrase_cache(tiny_artifacts["fp32"], phrase_file, again, params(), threads=1, progress=True)
    assert again.read_bytes() == fp32_cache.read_bytes()  # the progress lines change nothing written
    phrases = summary["phrases"]
    assert f"warm: started ({phrases} phrase)" in caplog.text and f"warm: {phrases}/{phrases} phrase" in caplog.text
    # phrases that run to max_new_token (random weights: most) are summed up once, not warned of one by one
    assert "hit max_new_token" in caplog.text and "incomplete result" not in caplog.text
    cache = PhraseCache(fp32_cache, max_bytes=0)
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1, cache=cache)
    for text in ("请稍等", "Please hold on a moment."):
        [r] = pipe.synthesize(text, params())
        assert r.cached
    assert cache.lru_bytes == 0  # nothing kept in memory, still served (read through the memory map)
    one = PhraseCache(fp32_cache, max_bytes=10**9)
    pipe = Pipeline(tiny_artifacts["fp32"], threads=1, cache=one)
    pipe.synthesize(["请稍等", "Please hold on a moment."], params())
    first = one.lru_bytes
    one.max_bytes = first - 1  # room for one entry only: the older one is evicted on the next read
    pipe.synthesize("你好，很高兴为您服务", params())
    assert 0 < one.lru_bytes <= first - 1 and len(one._lru) == 1


def test_synth_cli_cache_matches_uncached(tiny_artifacts, phrase_file, tmp_path) -> None:
    import soundfile as sf

    runner = CliRunner()
    cache = tmp_path / "cli.cache"
    common = ["--seed", "0", "--max-new-token", str(STEPS), "--threads", "1"]
    res = runner.invoke(main, ["warm", "--artifact", str(tiny_artifacts["fp32"]), "--phrases", str(phrase_file),
                               "--out", str(cache), *common])
    assert res.exit_code == 0, res.output
    outs = {}
    for name, extra in (("plain", []), ("cached", ["--cache", str(cache)])):  # warm refines, as synth does
        res = runner.invoke(main, ["synth", "--artifact", str(tiny_artifacts["fp32"]), "--text", "请稍等",
                                   "--out", str(tmp_path / f"{name}.wav"), *common, *extra])
        assert res.exit_code == 0, res.output
        outs[name] = sf.read(tmp_path / f"{name}.wav", dtype="float32")[0]
    assert outs["plain"].shape == outs["cached"].shape
    assert float(np.max(np.abs(outs["plain"] - outs["cached"]))) <= 1e-4
    # a knob that differs from the cache's (refinement off; or none given: 2048 steps): a miss
    # synthesized as usual, never an error, and no knob is taken from the cache
    for name, knobs in (("plain-nr", ["--no-refine", *common]), ("bare", ["--threads", "1"])):
        for cached in (False, True):
            res = runner.invoke(main, ["synth", "--artifact", str(tiny_artifacts["fp32"]), "--text", "请稍等",
                                       "--out", str(tmp_path / f"{name}-{cached}.wav"), *knobs,
                                       *(["--cache", str(cache)] if cached else [])])
            assert res.exit_code == 0, res.output
        np.testing.assert_array_equal(sf.read(tmp_path / f"{name}-True.wav", dtype="float32")[0],
                                      sf.read(tmp_path / f"{name}-False.wav", dtype="float32")[0])


# ---- routing ---------------------------------------------------------------------------------------


def test_buckets_and_lengths() -> None:
    short, medium, long = buckets_from_edges([10, 40])
    assert (short.min_chars, short.max_chars, medium.min_chars, medium.max_chars, long.min_chars, long.max_chars) == (
        1, 10, 11, 40, 41, None)
    assert text_length("请 稍等") == 3
    with pytest.raises(ForgeError, match="increasing"):
        buckets_from_edges([40, 10])
    with pytest.raises(ForgeError, match="distinct bucket names"):
        buckets_from_edges([10], ["a"])


def test_gate_buckets_section(tmp_path: Path) -> None:
    from chattts_forge.evaluate.gate import load_gate

    default = load_gate(None)
    assert [b["name"] for b in default["buckets"]] == ["short", "medium", "long"]
    gate = tmp_path / "gate.toml"
    gate.write_text('[fidelity]\nmin_code_agreement = 0.75\nmin_hidden_cosine = 0.9\n'
                    '[buckets]\nedges = [5]\nnames = ["tiny", "rest"]\n[buckets.rest]\nmin_code_agreement = 0.9\n')
    got = {b["name"]: b for b in load_gate(gate)["buckets"]}
    assert (got["tiny"]["max_chars"], got["rest"]["min_chars"]) == (5, 6)
    rest = {(r[1], r[2]): r[3] for r in got["rest"]["rules"]}
    assert rest == {("min", "code_agreement"): 0.9, ("min", "hidden_cosine"): 0.9}
    assert {(r[1], r[2]): r[3] for r in got["tiny"]["rules"]}[("min", "code_agreement")] == 0.75
    gate.write_text('[fidelity]\nmin_code_agreement = 0.75\n[buckets.huge]\nmin_code_agreement = 0.9\n')
    with pytest.raises(ForgeError, match="unknown bucket 'huge'"):
        load_gate(gate)


@pytest.fixture
def version(tiny_artifacts: dict[str, Path], tmp_path: Path) -> Path:
    """A published version: fp32 passes everywhere, fp16 passes short texts only, faster there."""
    return publish_stand_in_version(tiny_artifacts, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (False, 1.0), "long": (False, 1.0)}})


def test_routing_table_and_router(version: Path, tiny_artifacts) -> None:
    table = json.loads((version / ROUTING_NAME).read_text(encoding="utf-8"))
    assert {b["name"]: b["variant"] for b in table["buckets"]} == {"short": "fp16", "medium": "fp32", "long": "fp32"}
    short = table["buckets"][0]
    assert short["figures"]["fp16"]["rtf_p50"] == 1.0 and "fastest" in short["reason"]
    router = Router(version, threads=1)
    assert router.route("请稍等")[0] == "fp16"
    assert router.route("这是一个比较长的句子，它有超过十个字。")[0] == "fp32"
    assert router.opened() == {}  # routing opens no variant: each opens on its first text (tests/test_coldstart.py)
    texts = ["请稍等", "这是一个比较长的句子，它有超过十个字。"]
    got = router.synthesize(texts, params())
    want = [Pipeline(tiny_artifacts["fp16"], threads=1).synthesize(texts[0], params())[0],
            Pipeline(tiny_artifacts["fp32"], threads=1).synthesize(texts[1], params())[0]]
    for g, w in zip(got, want, strict=True):
        assert float(np.max(np.abs(g.wav - w.wav))) <= 1e-4
    assert Router(version, variant="fp32", threads=1).route("请稍等")[0] == "fp32"
    with pytest.raises(ForgeError, match="variant 'int4' is not published"):
        Router(version, variant="int4")


def test_routing_json_is_reproducible(version: Path) -> None:
    from chattts_forge.publish.version_files import publish_version_files, routing_table
    from chattts_forge.runtime.router import routing_bytes

    before = (version / ROUTING_NAME).read_bytes()
    assert routing_bytes(routing_table(version)) == before
    publish_version_files(version)
    assert (version / ROUTING_NAME).read_bytes() == before


def test_routing_naming_an_unpublished_variant(version: Path) -> None:
    from chattts_forge.publish.verify import verify_path

    table = json.loads((version / ROUTING_NAME).read_text(encoding="utf-8"))
    table["buckets"][0]["variant"] = "int4"
    (version / ROUTING_NAME).write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ForgeError, match=r"routing.json: bucket 'short' routes to variant 'int4', which is not published"):
        Router(version)
    problems = verify_path(version.parent.parent).problems
    assert any("routing.json: bucket 'short' routes to variant 'int4'" in p for p in problems)


def test_published_cache_verify_and_router(version: Path, tiny_artifacts, phrase_file, tmp_path) -> None:
    from chattts_forge.publish.verify import verify_path
    from chattts_forge.publish.version_files import PHRASE_CACHE_NAME, publish_version_files

    built = tmp_path / "version.cache"
    summary = build_phrase_cache(version, phrase_file, built, params(), threads=1)
    assert summary["variants"] == {"fp16": 2, "fp32": 1}  # the long phrase goes to fp32
    publish_version_files(version, cache_file=built)
    root = version.parent.parent
    index = json.loads((root / "index.json").read_text(encoding="utf-8"))
    assert index["versions"][0]["phrase_cache"]["phrases"] == 3
    assert index["versions"][0]["routing"]["short"] == "fp16"
    assert verify_path(root).ok and verify_path(version).ok
    router = Router(version, cache=version / PHRASE_CACHE_NAME, threads=1)
    [hit] = router.synthesize("请稍等", params())
    [miss] = Pipeline(version / "fp16", threads=1).synthesize("请稍等", params())
    assert hit.cached and float(np.max(np.abs(hit.wav - miss.wav))) <= 1e-4
    for name in (ROUTING_NAME, PHRASE_CACHE_NAME):
        path = version / name
        original = path.read_bytes()
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x01
        path.write_bytes(bytes(flipped))
        problems = verify_path(root).problems
        assert problems and any(p.startswith(f"{path}:") for p in problems), problems
        path.write_bytes(original)
    assert verify_path(root).ok
    (version / "stray.txt").write_text("x")
    assert any("stray.txt: extra file" in p for p in verify_path(root).problems)


# ---- the shipped phrase list ---------------------------------------------------------------------


def test_shipped_phrase_list() -> None:
    from chattts_forge.calibration_data.corpus import load_corpus
    from chattts_forge.calibration_data.phrases import (
        PHRASES_DIR,
        build_manifest,
        language_of,
        latest_version,
        manifest_bytes,
        shipped_phrases,
    )

    phrases = shipped_phrases()
    assert len(phrases) >= 200 and len(set(phrases)) == len(phrases)
    langs = {language_of(p) for p in phrases}
    assert langs == {"zh", "en"} and min(sum(language_of(p) == lang for p in phrases) for lang in langs) >= 50
    held_out = {s.strip().lower() for s in load_corpus("builtin:evaluation").sentences}
    assert not [p for p in phrases if p.strip().lower() in held_out]
    vdir = PHRASES_DIR / latest_version()
    assert (vdir / "manifest.json").read_bytes() == manifest_bytes(build_manifest(vdir))


def test_shipped_phrase_list_is_speakable(tiny_artifacts) -> None:
    from chattts_forge.calibration_data.phrases import shipped_phrase_file, shipped_phrases

    pipe = Pipeline(tiny_artifacts["fp32"], threads=1)
    assert len(read_phrase_list(shipped_phrase_file(), pipe.normalize)) == len(shipped_phrases())


# ---- per-length evaluation -------------------------------------------------------------------------


def test_evaluate_reports_buckets_and_cache_effect(tiny_artifacts, tmp_path) -> None:
    from chattts_forge.evaluate.evaluate import evaluate_artifact
    from chattts_forge.evaluate.report_schema import read_report

    report = evaluate_artifact(
        tiny_artifacts["fp16"], tiny_artifacts["fp32"], "builtin:evaluation", out=tmp_path / "r",
        max_sentences=1, max_new_token=16, fidelity_sentences=1, fidelity_steps=8, threads=1, batch_sizes=(1,),
        baseline_checkpoint=None, progress=False, bucket_sentences=1, cache_phrases=2,
    )
    read_report(tmp_path / "r")  # the strict schema accepts the new sections
    results = report["buckets"]["results"]
    assert list(results) == ["short", "medium", "long"]
    for r in results.values():
        assert len(r["sentences"]) == 1
        assert r["min_chars"] <= r["chars"][0] and (r["max_chars"] is None or r["chars"][0] <= r["max_chars"])
        assert r["passed"] in (True, False) and 0 <= r["metrics"]["code_agreement"] <= 1
        assert r["latency"]["artifact"]["rtf"]["p50"] > 0
    cache = report["phrase_cache"]
    assert cache["hit_ratio"] == 0.6 and cache["phrases"] == 2 and cache["max_abs_diff"] <= 1e-4
    assert cache["mean_seconds_at_hit_ratio"] == pytest.approx(
        0.6 * cache["hit_seconds"]["mean"] + 0.4 * cache["miss_seconds"]["mean"])
    assert "Per length bucket" in (tmp_path / "r" / "report.md").read_text(encoding="utf-8")


def test_version_folder_synth_cli(version: Path, tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["synth", "--artifact", str(version), "--text", "请稍等", "--no-refine", "--seed", "0",
                               "--max-new-token", str(STEPS), "--threads", "1", "--out", str(tmp_path / "a.wav")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["synth", "--artifact", str(version), "--variant", "int4", "--text", "请稍等",
                               "--out", str(tmp_path / "b.wav")])
    assert res.exit_code == 2 and "variant 'int4' is not published" in res.output
    shutil.rmtree(version / "fp16")
    res = runner.invoke(main, ["synth", "--artifact", str(version), "--text", "请稍等", "--out", str(tmp_path / "c.wav")])
    assert res.exit_code == 2 and "routes to variant 'fp16', which is not published" in res.output


def test_version_folder_synth_checks_signatures(version: Path, tmp_path) -> None:
    """With --public-key the version folder's own model.sig (routing.json) and the routed variant's are checked."""
    pub = version.parent.parent / "signing-key.pub"
    assert (version / "model.sig").is_file() and (version / "fp32" / "model.sig").is_file()
    args = ["synth", "--artifact", str(version), "--text", "请稍等", "--no-refine", "--seed", "0", "--max-new-token",
            str(STEPS), "--threads", "1", "--public-key", str(pub)]
    runner = CliRunner()
    res = runner.invoke(main, [*args, "--out", str(tmp_path / "a.wav")])
    assert res.exit_code == 0, res.output
    routing = version / ROUTING_NAME
    routing.write_text(routing.read_text(encoding="utf-8").replace('"reason"', '"reason" ', 1), encoding="utf-8")
    res = runner.invoke(main, [*args, "--out", str(tmp_path / "b.wav")])
    assert res.exit_code == 2 and f"{routing}: differs from the file that was signed" in res.output
    assert not (tmp_path / "b.wav").exists()
