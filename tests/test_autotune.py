"""Issue 27: speed decided on the machine that serves (runtime.interleave, runtime.autotune).

Mechanism only: a fake clock and injected step costs decide every ranking here; no test asserts
how fast anything is.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from stand_in_report import publish_stand_in_version

from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.runtime.autotune import AutotuneSettings, bucket_context, metrics
from chattts_forge.runtime.interleave import (
    RatioSettings,
    compare_interleaved,
    median_interval,
    prefer_simpler,
)
from chattts_forge.runtime.router import ROUTING_NAME, Bucket, Router, bucket_build_ranking, bucket_passing


class FakeClock:
    """A clock that only the injected steps move."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def costed_step(clock: FakeClock, costs: list[float]):
    """A step whose n-th call takes costs[n % len(costs)] seconds of the fake clock."""
    calls = [0]

    def call() -> None:
        clock.now += costs[calls[0] % len(costs)]
        calls[0] += 1

    return call


# ---- the interleaved ratio ---------------------------------------------------------------------


def test_median_interval_widens_with_scatter() -> None:
    mid, lo, hi = median_interval([1.0] * 20)
    assert (mid, lo, hi) == (1.0, 1.0, 1.0)
    mid, lo, hi = median_interval([0.9, 1.1] * 10)
    assert lo == 0.9 and hi == 1.1 and mid == 1.0
    with pytest.raises(ForgeError):
        median_interval([])


def test_clear_difference_converges_and_wins() -> None:
    clock = FakeClock()
    ref = costed_step(clock, [0.010])
    fast = costed_step(clock, [0.006])
    comp = compare_interleaved(("int8", ref), {"mix": fast}, RatioSettings(min_sample_s=0.0), clock=clock)
    est = comp.estimates["mix"]
    assert comp.converged and comp.rounds == RatioSettings().min_rounds
    assert est.ratio == pytest.approx(0.6) and est.spread == pytest.approx(0.0) and est.clearly_faster
    choice, reason = prefer_simpler(comp, "int8")
    assert choice == "mix" and "beyond the noise" in reason
    assert comp.to_dict()["candidates"]["mix"]["rounds"] == comp.rounds


def test_ratio_inside_the_noise_keeps_the_simpler_and_stops_at_the_cap() -> None:
    clock = FakeClock()
    ref = costed_step(clock, [0.010, 0.012, 0.008])  # scatter of +-20% round to round
    cand = costed_step(clock, [0.0095])
    settings = RatioSettings(bound=0.01, time_cap_s=0.5, min_sample_s=0.0)
    comp = compare_interleaved(("int8", ref), {"mix": cand}, settings, clock=clock)
    est = comp.estimates["mix"]
    assert comp.stopped == "time cap" and not comp.converged and est.spread > settings.bound
    assert est.low < 1.0 < est.high and not est.clearly_faster
    choice, reason = prefer_simpler(comp, "int8")
    assert choice == "int8" and "the simpler int8 is kept" in reason


def test_short_calls_are_grouped_into_samples() -> None:
    clock = FakeClock()
    comp = compare_interleaved(("a", costed_step(clock, [0.00025])), {"b": costed_step(clock, [0.0005])},
                               RatioSettings(min_sample_s=0.002), clock=clock)
    assert comp.calls_per_sample == 8 and comp.estimates["b"].ratio == pytest.approx(2.0)
    with pytest.raises(ForgeError, match="also the reference"):
        compare_interleaved(("a", lambda: None), {"a": lambda: None})


# ---- routing.json's passing sets --------------------------------------------------------------


@pytest.fixture
def version(tiny_artifacts: dict[str, Path], tmp_path: Path) -> Path:
    """fp32 passes everywhere (build RTF 2.0); fp16 passes short and medium texts, faster on the build."""
    return publish_stand_in_version(tiny_artifacts, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (True, 1.0), "long": (False, 1.0)}})


def test_routing_json_records_passing_sets_and_build_ranking(version: Path) -> None:
    table = json.loads((version / ROUTING_NAME).read_text(encoding="utf-8"))
    by_name = {b["name"]: b for b in table["buckets"]}
    assert by_name["short"]["passing"] == ["fp16", "fp32"] and by_name["short"]["build_ranking"] == ["fp16", "fp32"]
    assert by_name["long"]["passing"] == ["fp32"] and by_name["long"]["variant"] == "fp32"


def test_old_routing_json_without_passing_sets_still_loads(version: Path, tmp_path: Path) -> None:
    path = version / ROUTING_NAME
    table = json.loads(path.read_text(encoding="utf-8"))
    for b in table["buckets"]:
        del b["passing"], b["build_ranking"]
    path.write_text(json.dumps(table), encoding="utf-8")
    short = table["buckets"][0]
    assert bucket_passing(short) == ["fp16", "fp32"] and bucket_build_ranking(short) == ["fp16", "fp32"]
    assert bucket_passing({"variant": "fp32", "figures": {}}) == []  # nothing passed: the fallback
    router = Router(version, threads=1, autotune=False)
    assert router.routes == {"short": "fp16", "medium": "fp16", "long": "fp32"}
    clock = FakeClock()
    tuned = Router(version, threads=1, autotune=_settings(tmp_path, clock, {"fp32": 0.001, "fp16": 0.004}))
    assert tuned.routes == {"short": "fp32", "medium": "fp32", "long": "fp32"}


def test_a_passing_variant_that_is_not_published_is_named(version: Path) -> None:
    path = version / ROUTING_NAME
    table = json.loads(path.read_text(encoding="utf-8"))
    table["buckets"][0]["passing"] = ["fp32", "fp16", "int4"]
    path.write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ForgeError, match=r"bucket 'short' \(passing\) routes to variant 'int4', which is not published"):
        Router(version, autotune=False)


# ---- the host's choice --------------------------------------------------------------------------


def _settings(tmp_path: Path, clock: FakeClock, costs: dict[str, float], opened: list | None = None) -> AutotuneSettings:
    def factory(folder: Path, context: int):
        if opened is not None:
            opened.append((folder.name, context))
        return costed_step(clock, [costs[folder.name]])

    return AutotuneSettings(clock=clock, step_factory=factory, cache_dir=tmp_path / "autotune-cache",
                            cold_cache="measure")


def test_injected_step_costs_decide_the_host_choice_and_the_cache_is_hit(version: Path, tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    opened: list = []
    # On this "host" fp32 steps faster than fp16, the opposite of the build's ranking.
    settings = _settings(tmp_path, clock, {"fp32": 0.002, "fp16": 0.005}, opened)
    with caplog.at_level(logging.INFO, logger="chattts_forge.runtime.router"):
        router = Router(version, threads=1, autotune=settings)
    assert router.routes == {"short": "fp32", "medium": "fp32", "long": "fp32"}
    rec = router.autotune
    assert rec["source"] == "measured" and Path(rec["cache_file"]).is_file()
    short = rec["buckets"]["short"]
    assert short["build_variant"] == "fp16" and short["passing"] == ["fp16", "fp32"]
    assert short["comparison"]["reference"] == "fp16"
    assert short["comparison"]["candidates"]["fp32"]["ratio"] == pytest.approx(0.4)
    assert "faster beyond the noise" in short["reason"]
    assert rec["buckets"]["long"]["comparison"] is None  # one passing variant: nothing to rank
    # each bucket timed at its own context
    contexts = {ctx for _, ctx in opened}
    assert len(contexts) == 2 and short["context"] == bucket_context(Bucket("short", 1, 10))
    assert "bucket short -> fp32 (build: fp16)" in caplog.text and "0.400x" in caplog.text
    flat = metrics(rec)
    assert flat["route_short"] == "fp32" and flat["ratio_short_fp32"] == pytest.approx(0.4)

    opened.clear()
    again = Router(version, threads=1, autotune=settings)
    assert again.autotune["source"] == "cache" and opened == [] and again.routes == router.routes
    # another thread count is another machine setting: measured again
    Router(version, threads=2, autotune=settings)
    assert opened


def test_batching_ranks_only_the_variants_the_scheduler_batches(tiny_artifacts, tiny_kv8, tmp_path: Path) -> None:
    """`serve`'s autotune (batching): fp16 has no fused GPT graph (one request at a time), so even a
    faster fp16 step does not take a bucket; found by the soak on a host where it did."""
    version = publish_stand_in_version({**tiny_artifacts, "int8-dynamic-kv8": tiny_kv8}, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (True, 1.0), "long": (False, 1.0)},
        "int8-dynamic-kv8": {"short": (True, 1.5), "medium": (False, 1.5), "long": (False, 1.5)}})
    clock = FakeClock()
    opened: list = []
    costs = {"fp32": 0.005, "int8-dynamic-kv8": 0.004, "fp16": 0.002}
    plain = Router(version, threads=1, autotune=_settings(tmp_path, clock, costs, opened))
    assert plain.routes["short"] == "fp16" and plain.routes["medium"] == "fp16"  # synth: the faster step wins
    opened.clear()
    served = Router(version, threads=1, autotune=replace(_settings(tmp_path, clock, costs, opened), batching=True))
    assert served.autotune["source"] == "measured"  # its own cache record, not synth's
    assert served.routes == {"short": "int8-dynamic-kv8", "medium": "fp32", "long": "fp32"}
    assert {name for name, _ in opened} == {"fp32", "int8-dynamic-kv8"}  # fp16 never timed
    short, medium = served.autotune["buckets"]["short"], served.autotune["buckets"]["medium"]
    assert short["passing"] == ["fp16", "fp32", "int8-dynamic-kv8"] and "the build's fp16 is not batched" in short["reason"]
    assert "the only passing variant the scheduler batches" in medium["reason"]
    deferred = Router(version, threads=1, autotune=AutotuneSettings(batching=True, cache_dir=tmp_path / "cold"))
    assert deferred.autotune["pending"] and deferred.routes == served.routes  # the build's fastest batched one
    assert "scheduler batches" in deferred.autotune["buckets"]["short"]["reason"]


def test_corrupt_cache_is_ignored_and_rewritten(version: Path, tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    settings = _settings(tmp_path, clock, {"fp32": 0.002, "fp16": 0.005})
    first = Router(version, threads=1, autotune=settings).autotune
    cache = Path(first["cache_file"])
    cache.write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        again = Router(version, threads=1, autotune=settings).autotune
    assert again["source"] == "measured" and "ignored" in caplog.text
    assert json.loads(cache.read_text(encoding="utf-8"))["buckets"]["short"]["variant"] == "fp32"


def test_inside_the_noise_the_build_choice_stays(version: Path, tmp_path: Path) -> None:
    clock = FakeClock()
    calls: dict[str, list[float]] = {"fp32": [0.004, 0.006, 0.005], "fp16": [0.005]}

    def factory(folder: Path, context: int):
        return costed_step(clock, calls[folder.name])

    settings = AutotuneSettings(clock=clock, step_factory=factory, cache_dir=tmp_path / "c", time_cap_s=1.0, bound=0.001,
                                cold_cache="measure")
    router = Router(version, threads=1, autotune=settings)
    assert router.routes["short"] == "fp16"
    assert "the simpler fp16 is kept" in router.autotune["buckets"]["short"]["reason"]


def test_autotune_off_and_variant_take_the_build_ranking(version: Path, tmp_path: Path, monkeypatch) -> None:
    def never(folder: Path, context: int):
        raise AssertionError("no step may be timed")

    off = Router(version, threads=1, autotune=False)
    assert off.autotune["source"] == "build" and off.routes["short"] == "fp16"
    pinned = Router(version, variant="fp32", threads=1,
                    autotune=AutotuneSettings(step_factory=never, cache_dir=tmp_path / "c"))
    assert pinned.autotune["source"] == "build" and pinned.route("请稍等")[0] == "fp32"
    monkeypatch.setenv("CHATTTS_FORGE_AUTOTUNE", "0")
    assert Router(version, threads=1).autotune["source"] == "build"


def test_real_steps_on_tiny_artifacts_choose_a_passing_variant(version: Path, tmp_path: Path) -> None:
    router = Router(version, threads=1, autotune=AutotuneSettings(time_cap_s=0.6, cache_dir=tmp_path / "c",
                                                                     cold_cache="measure"))
    for name in ("short", "medium"):
        b = router.autotune["buckets"][name]
        assert b["variant"] in b["passing"] and b["comparison"]["rounds"] >= RatioSettings().min_rounds
    assert router._pipes == {}  # the benchmark's sessions are not the serving pipelines


def test_synth_cli_autotune_flags(version: Path, tiny_artifacts, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    runner = CliRunner()
    common = ["--text", "请稍等", "--no-refine", "--seed", "0", "--max-new-token", "8", "--threads", "1"]
    res = runner.invoke(main, ["synth", "--artifact", str(version), "--no-autotune", "--out", str(tmp_path / "a.wav"),
                               *common])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["synth", "--artifact", str(tiny_artifacts["fp32"]), "--autotune",
                               "--out", str(tmp_path / "b.wav"), *common])
    assert res.exit_code == 2 and "has no routing.json" in res.output and res.output.count("\n") == 1


def test_compat_load_of_a_version_serves_the_host_choice_of_its_longest_bucket(version: Path, tmp_path: Path) -> None:
    import chattts_forge.compat as ChatTTS  # noqa: N812 - the drop-in API

    path = version / ROUTING_NAME
    table = json.loads(path.read_text(encoding="utf-8"))
    long = table["buckets"][-1]
    long.update(variant="fp16", passing=["fp16", "fp32"], build_ranking=["fp16", "fp32"])
    path.write_text(json.dumps(table), encoding="utf-8")
    chat = ChatTTS.Chat()
    chat.load(source="custom", custom_path=version, device="cpu", threads=1, autotune=False)
    assert chat.pipe.artifact.variant == "fp16" and chat.autotune["source"] == "build"
    clock = FakeClock()
    chat.load(source="custom", custom_path=version, device="cpu", threads=1,
              autotune=_settings(tmp_path, clock, {"fp32": 0.001, "fp16": 0.003}))
    assert chat.pipe.artifact.variant == "fp32" and chat.autotune["buckets"]["long"]["variant"] == "fp32"


def test_a_version_loaded_on_another_cpu_is_ranked_there_and_says_why(version: Path, tmp_path: Path,
                                                                       monkeypatch, caplog) -> None:
    """Built on one machine (its ranking: fp16 first), loaded on two others: each routes to the
    variant fastest there among those that passed, measured there (one CPU's cache is not another's)."""
    from chattts_forge.runtime import machine

    hosts = {"CPU A": {"fp32": 0.002, "fp16": 0.005}, "CPU B": {"fp32": 0.006, "fp16": 0.003}}
    got = {}
    for cpu, costs in hosts.items():
        monkeypatch.setattr(machine, "cpu_model", lambda cpu=cpu: cpu)
        opened: list = []
        with caplog.at_level(logging.INFO, logger="chattts_forge.runtime.router"):
            caplog.clear()
            router = Router(version, threads=1, autotune=_settings(tmp_path, FakeClock(), costs, opened))
        rec = router.autotune
        assert rec["source"] == "measured" and opened and rec["key"]["cpu_model"] == cpu
        got[cpu] = (router.routes["short"], rec["buckets"]["short"]["reason"], caplog.text)
    fastest = {cpu: min(costs, key=costs.get) for cpu, costs in hosts.items()}
    assert {cpu: g[0] for cpu, g in got.items()} == fastest == {"CPU A": "fp32", "CPU B": "fp16"}
    assert "faster beyond the noise" in got["CPU A"][1] and "bucket short -> fp32 (build: fp16)" in got["CPU A"][2]
    assert "the simpler fp16 is kept" in got["CPU B"][1] and "bucket short -> fp16 (build: fp16)" in got["CPU B"][2]
    # back on the first machine: its own cached choice, no timing
    monkeypatch.setattr(machine, "cpu_model", lambda: "CPU A")
    opened = []
    again = Router(version, threads=1, autotune=_settings(tmp_path, FakeClock(), hosts["CPU A"], opened))
    assert again.autotune["source"] == "cache" and opened == [] and again.routes["short"] == "fp32"


def test_synth_verbose_logs_the_host_choice_and_why(version: Path, tmp_path: Path, monkeypatch) -> None:
    from chattts_forge.runtime import autotune as tuning

    real = tuning.choose_routes
    injected = _settings(tmp_path, FakeClock(), {"fp32": 0.002, "fp16": 0.005})  # this host: fp32 faster
    monkeypatch.setattr(tuning, "choose_routes", lambda folder, table, _settings, **kw: real(folder, table, injected, **kw))
    res = CliRunner().invoke(main, ["-v", "synth", "--artifact", str(version), "--autotune", "--text", "请稍等",
                                    "--no-refine", "--seed", "0", "--max-new-token", "8", "--threads", "1",
                                    "--out", str(tmp_path / "a.wav")])
    assert res.exit_code == 0, res.output
    assert "bucket short -> fp32 (build: fp16): fp32 steps 0.400x of fp16" in res.output
    assert "faster beyond the noise" in res.output


def test_server_metrics_show_the_host_choice_and_its_ratios(version: Path, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="serve's metrics need the serve extra")
    from chattts_forge.runtime.serve.metrics import Metrics

    router = Router(version, threads=1, autotune=_settings(tmp_path, FakeClock(), {"fp32": 0.002, "fp16": 0.005}))
    text = Metrics(lambda: 0.0, lambda: 0.0, lambda: 1.0, routing=lambda: router.autotune).render()[0].decode()
    [short] = [line for line in text.splitlines() if line.startswith('forge_route{bucket="short"')]
    assert 'variant="fp32"' in short and 'build_variant="fp16"' in short and 'source="measured"' in short
    assert "faster beyond the noise" in short and short.endswith(" 1.0")
    assert 'forge_route_step_ratio{bucket="short",reference="fp16",variant="fp32"} 0.4' in text
    assert 'forge_route_step_ratio_spread{bucket="short",reference="fp16",variant="fp32"} 0.0' in text
    assert 'forge_route{bucket="long",build_variant="fp32"' in text  # one passing variant: still named
    # nothing served yet (or a plain artifact folder): no route lines, the rest of /metrics intact
    empty = Metrics(lambda: 0.0, lambda: 0.0, lambda: 1.0, routing=lambda: None).render()[0].decode()
    assert "forge_route{" not in empty and "forge_ready 1.0" in empty


def test_server_state_exports_the_serving_versions_routing(version: Path, tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="serve needs the serve extra")
    from types import SimpleNamespace

    from chattts_forge.runtime.serve.config import ServeConfig
    from chattts_forge.runtime.serve.state import ServerState

    router = Router(version, threads=1, autotune=_settings(tmp_path, FakeClock(), {"fp32": 0.002, "fp16": 0.005}))
    state = ServerState(ServeConfig(artifact=str(version)))
    state.current = SimpleNamespace(router=router, waiting=0, running=0, schedulers={}, file_cache=None)
    text = state.metrics.render()[0].decode()
    state.current = None
    state.shutdown()  # its threads (the work pool, the heap trimmer) end here, not at a later collection
    assert 'forge_route{bucket="short"' in text and 'variant="fp32"' in text


# ---- the cost model -----------------------------------------------------------------------------


def test_bytes_per_step_counts_the_graph_files_and_the_kv_cache(tiny_artifacts) -> None:
    from chattts_forge.artifact import ArtifactMeta
    from chattts_forge.runtime.costmodel import bytes_per_step, floor_ms

    folder = tiny_artifacts["fp32"]
    meta = ArtifactMeta.load(folder)
    dims = meta.dims
    files = [meta.component_file(folder, c) for c in ("gpt_fast", "head_code")]
    weights = sum(p.stat().st_size + (p.with_name(p.name + ".data").stat().st_size
                                      if p.with_name(p.name + ".data").is_file() else 0) for p in files)
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
    got = bytes_per_step(folder, 100)
    assert got["graph"] == "gpt_fast" and got["weights_bytes"] == weights and got["kv_value_bytes"] == 4
    assert got["kv_cache_bytes"] == 2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * head_dim * 100 * 4
    assert bytes_per_step(folder, 200)["kv_cache_bytes"] == 2 * got["kv_cache_bytes"]
    assert floor_ms(2_000_000_000, 4.0) == pytest.approx(500.0)


def test_read_bandwidth_is_cached_and_a_corrupt_cache_is_measured_again(tmp_path: Path, caplog) -> None:
    from chattts_forge.runtime.costmodel import read_bandwidth

    measured = []

    def measure() -> dict:
        measured.append(1)
        return {"gb_per_s": 10.0, "gb_per_s_median": 9.0, "method": "injected"}

    first = read_bandwidth(cache_dir=tmp_path, measure=measure)
    second = read_bandwidth(cache_dir=tmp_path, measure=measure)
    assert (first["source"], second["source"], len(measured)) == ("measured", "cache", 1)
    [cache] = list(tmp_path.iterdir())
    cache.write_text("[]", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        third = read_bandwidth(cache_dir=tmp_path, measure=measure)
    assert third["source"] == "measured" and len(measured) == 2 and "ignored" in caplog.text


def test_phrase_cache_is_warmed_for_the_build_routing_and_served_uncached_when_the_host_moves(
        version: Path, tmp_path: Path, caplog, monkeypatch) -> None:
    from chattts_forge.runtime import InferCodeParams, SynthParams
    from chattts_forge.runtime.phrase_cache_build import build_phrase_cache

    monkeypatch.setenv("CHATTTS_FORGE_AUTOTUNE", "1")  # warm must ignore it: its bytes may not depend on a clock
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("请稍等\n", encoding="utf-8")
    params = SynthParams(code=InferCodeParams(seed=0, max_new_token=8))
    summary = build_phrase_cache(version, phrases, tmp_path / "v.cache", params, threads=1)
    assert summary["variants"] == {"fp16": 1}  # the build's routing: short -> fp16
    clock = FakeClock()
    with caplog.at_level(logging.WARNING):
        router = Router(version, cache=tmp_path / "v.cache", threads=1,
                        autotune=_settings(tmp_path, clock, {"fp32": 0.001, "fp16": 0.004}))
    assert router.routes["short"] == "fp32" and "served uncached" in caplog.text
    [res] = router.synthesize("请稍等", params)
    assert not res.cached and res.wav.size > 0


def test_build_routing_keeps_fp32_when_the_quantized_advantage_is_inside_the_noise() -> None:
    from chattts_forge.publish.version_files import _simpler_inside_the_noise

    fp32 = [1.0, 1.0, 1.1, 0.9]
    clear = [0.5, 0.6, 0.55, 0.5]
    assert _simpler_inside_the_noise("int8", "fastest", ["fp32", "int8"], clear, fp32)[0] == "int8"
    noisy = [0.5, 1.2, 0.55, 0.5]  # one sentence slower than fp32
    choice, reason = _simpler_inside_the_noise("int8", "fastest", ["fp32", "int8"], noisy, fp32)
    assert choice == "fp32" and "inside the noise: the simpler fp32" in reason
    # fp32 does not pass here, or no paired timings: the median RTF decides alone
    assert _simpler_inside_the_noise("int8", "r", ["int8", "int4"], noisy, fp32) == ("int8", "r")
    assert _simpler_inside_the_noise("int8", "r", ["fp32", "int8"], [], []) == ("int8", "r")


def test_gate_step_ratio_is_interleaved_and_records_its_interval(tiny_artifacts) -> None:
    from chattts_forge.evaluate.step_ratio import interleaved_step_ratio

    got = interleaved_step_ratio(tiny_artifacts["fp16"], tiny_artifacts["fp32"], threads=1, context=32, time_cap_s=0.5)
    assert got["low"] <= got["ratio"] <= got["high"] and got["rounds"] >= RatioSettings().min_rounds
    assert got["stopped"] in ("spread within bound", "time cap", "round cap") and got["context"] == 32
