"""Issue 36: only what is served is opened.

A routed version opens no FP32 artifact unless a bucket routes to it or it is asked for; text
normalisation and length routing open no model session; a variant's files are checked and its
sessions loaded on its first text. Every onnxruntime session and every `LoadedArtifact` the runtime
makes is recorded (`opened`), so the tests check what is opened when, never how long it takes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from stand_in_report import publish_stand_in_version

from chattts_forge.cli import main
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.loaded_artifact import LoadedArtifact
from chattts_forge.runtime.router import Router

STEPS = 12
SHORT = "请稍等"
LONG = "这是一个比较长的句子，它有超过十个字。"


def params() -> SynthParams:
    return SynthParams(code=InferCodeParams(seed=0, max_new_token=STEPS, min_new_token=STEPS))


class Opened:
    """The variant folders (their names) each LoadedArtifact and each session was made for, and every
    onnxruntime session made at all (a session made outside a LoadedArtifact would show as a surplus)."""

    def __init__(self) -> None:
        self.artifacts: list[str] = []
        self.sessions: list[tuple[str, str]] = []  # (variant folder, component)
        self.onnxruntime_sessions = 0

    def variants(self) -> set[str]:
        assert self.onnxruntime_sessions == len(self.sessions)
        return set(self.artifacts) | {v for v, _ in self.sessions}


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Opened:
    seen = Opened()
    real_session, real_init, real_create = ort.InferenceSession, LoadedArtifact.__init__, LoadedArtifact._create_session

    def session(*args, **kwargs):
        seen.onnxruntime_sessions += 1
        return real_session(*args, **kwargs)

    def init(self, path, *args, **kwargs):
        seen.artifacts.append(Path(path).name)
        real_init(self, path, *args, **kwargs)

    def create(self, name, *args, **kwargs):
        seen.sessions.append((self.path.name, name))
        return real_create(self, name, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(LoadedArtifact, "__init__", init)
    monkeypatch.setattr(LoadedArtifact, "_create_session", create)
    return seen


@pytest.fixture
def fp16_version(tiny_artifacts: dict[str, Path], tmp_path: Path) -> Path:
    """A published version whose table routes every bucket to fp16 (fp32 passes, slower: the fallback only)."""
    return publish_stand_in_version(tiny_artifacts, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (True, 1.0), "long": (True, 1.0)}})


@pytest.fixture
def mixed_version(tiny_artifacts: dict[str, Path], tmp_path: Path) -> Path:
    """fp16 serves short texts, fp32 the rest."""
    return publish_stand_in_version(tiny_artifacts, tmp_path, {
        "fp32": {"short": (True, 2.0), "medium": (True, 2.0), "long": (True, 2.0)},
        "fp16": {"short": (True, 1.0), "medium": (False, 1.0), "long": (False, 1.0)}})


def test_routing_needs_no_session_and_fp32_is_never_opened_when_not_routed(fp16_version: Path, opened: Opened) -> None:
    router = Router(fp16_version, threads=1)
    assert set(router.routes.values()) == {"fp16"} and router.table["fallback"] == "fp32"
    for text in (SHORT, LONG, "Hello there, how are you today? " * 3):
        assert router.route(text, params())[0] == "fp16"
    assert router.front.normalize(SHORT) == Pipeline(fp16_version / "fp16", threads=1).normalize(SHORT)
    assert isinstance(router.front.random_speaker(1), str)
    opened.artifacts.clear()  # the Pipeline just made to compare with
    assert opened.sessions == [] and opened.artifacts == [] and router.opened() == {}

    [result] = router.synthesize(SHORT, params())
    assert len(result.wav) > 0
    assert opened.variants() == {"fp16"} and set(router.opened()) == {"fp16"}
    assert "fp32" not in {v for v, _ in opened.sessions}


def test_a_variant_opens_on_its_first_text(mixed_version: Path, opened: Opened) -> None:
    router = Router(mixed_version, threads=1)
    router.synthesize(SHORT, params())
    assert opened.variants() == {"fp16"}
    router.synthesize(LONG, params())  # the first text of the medium bucket: fp32 opens now
    assert opened.variants() == {"fp16", "fp32"}
    assert opened.artifacts.count("fp32") == 1 and opened.artifacts.count("fp16") == 1


def test_asking_for_fp32_opens_it_and_nothing_else(fp16_version: Path, opened: Opened) -> None:
    router = Router(fp16_version, variant="fp32", threads=1)
    assert router.route(SHORT)[0] == "fp32" and opened.variants() == set()
    router.synthesize(SHORT, params())
    assert opened.variants() == {"fp32"}


def test_an_autotune_cache_hit_opens_no_variant_before_its_first_text(fp16_version: Path, opened: Opened,
                                                                     tmp_path: Path, monkeypatch) -> None:
    from chattts_forge.runtime.autotune import AutotuneSettings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = AutotuneSettings(time_cap_s=0.5, cache_dir=tmp_path / "autotune", cold_cache="measure")
    assert Router(fp16_version, threads=1, autotune=settings).autotune["source"] == "measured"  # opens both
    assert {v for v, _ in opened.sessions} == {"fp16", "fp32"}
    # what autotune times is not saved as a session: a variant timed here may never be served
    assert not (tmp_path / "cache" / "chattts-forge" / "sessions").exists()
    opened.artifacts.clear()
    opened.sessions.clear()
    opened.onnxruntime_sessions = 0
    router = Router(fp16_version, threads=1, autotune=settings)
    assert router.autotune["source"] == "cache" and opened.variants() == set()
    router.synthesize(SHORT, params())
    assert opened.variants() == {router.routes["short"]}


def test_synth_cli_on_a_routed_version_opens_only_the_routed_variant(fp16_version: Path, opened: Opened,
                                                                     tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["synth", "--artifact", str(fp16_version), "--text", SHORT, "--no-refine",
                                    "--speaker", "random", "--seed", "0", "--max-new-token", str(STEPS),
                                    "--threads", "1", "--out", str(tmp_path / "a.wav")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a.wav").is_file() and opened.variants() == {"fp16"}


def test_serve_loads_the_routed_variants_and_opens_fp32_when_a_request_names_it(fp16_version: Path,
                                                                               opened: Opened) -> None:
    from chattts_forge.runtime.serve.config import ServeConfig
    from chattts_forge.runtime.serve.engine import ServedVersion

    served = ServedVersion(fp16_version, ServeConfig(artifact=str(fp16_version), threads=1, max_batch=2))
    try:
        assert set(served.pipes) == {"fp16"} and opened.variants() == {"fp16"}
        assert "fp32" in served.model_names()  # published, listed, not loaded
        short = SynthParams(code=InferCodeParams(seed=0, max_new_token=STEPS))
        prep = served.prepare(LONG, short)
        assert prep.variant == "fp16" and "fp32" not in opened.variants()
        prep = served.prepare(LONG, short, model="fp32")
        assert prep.variant == "fp32" and set(served.pipes) == {"fp16", "fp32"}
        result = served.submit(prep).result(timeout=300)
        assert np.asarray(result.codes).shape[0] > 0
    finally:
        served.close()


# ---- saved optimized sessions (runtime.saved_sessions) --------------------------------------------


def _synth(artifact: Path, **kw) -> tuple[Pipeline, np.ndarray, np.ndarray]:
    pipe = Pipeline(artifact, threads=1, **kw)
    [r] = pipe.synthesize(SHORT, params())
    return pipe, r.codes, r.wav


def test_saved_sessions_are_reused_and_give_the_same_audio(fp16_version, tiny_artifacts, tmp_path,
                                                           monkeypatch) -> None:
    from chattts_forge.runtime.saved_sessions import SAVED_ENV

    published = fp16_version / "fp32"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(SAVED_ENV, "0")
    plain, codes, wav = _synth(published)
    assert set(plain.artifact.session_sources.values()) == {"built"}
    assert not (tmp_path / "cache" / "chattts-forge" / "sessions").exists()
    monkeypatch.delenv(SAVED_ENV)
    build_side, _, _ = _synth(tiny_artifacts["fp32"])  # not published: the build's artifacts are never saved
    assert set(build_side.artifact.session_sources.values()) == {"built"}
    first, codes1, wav1 = _synth(published)
    second, codes2, wav2 = _synth(published)
    for name in ("gpt_fast", "decoder", "vocos"):
        assert first.artifact.session_sources[name] == "built and saved"
        assert second.artifact.session_sources[name] == "saved"
    assert first.artifact.session_sources["embed"] == second.artifact.session_sources["embed"] == "built"
    assert np.array_equal(codes, codes1) and np.array_equal(codes, codes2)
    assert np.array_equal(wav, wav1) and np.array_equal(wav, wav2)  # bit for bit
    # verify size checks no hash: no saved graph may stand in for an unchecked file
    unchecked = Pipeline(published, threads=1, verify="size")
    unchecked.artifact.session("vocos")
    assert unchecked.artifact.session_sources["vocos"] == "built"


def test_saved_session_key_and_invalidation(tiny_artifacts, tmp_path, monkeypatch) -> None:
    import onnxruntime

    from chattts_forge.runtime import machine
    from chattts_forge.runtime.saved_sessions import ENTRY_JSON, GRAPH_NAME, SavedSessions, saved_key

    saved = SavedSessions(tmp_path / "sessions")

    def source() -> str:
        artifact = LoadedArtifact(tiny_artifacts["fp32"], threads=1, saved_sessions=saved)
        artifact.session("vocos")
        return artifact.session_sources["vocos"]

    assert (source(), source()) == ("built and saved", "saved")
    key = saved_key("a" * 64, None, {"threads": 1})
    monkeypatch.setattr(onnxruntime, "__version__", "0.0.0-other")
    assert saved_key("a" * 64, None, {"threads": 1}) != key and source() == "built and saved"
    monkeypatch.undo()
    monkeypatch.setattr(machine, "cpu_flags", lambda: ["another-cpu"])
    assert saved_key("a" * 64, None, {"threads": 1}) != key and source() == "built and saved"
    monkeypatch.undo()
    assert saved_key("b" * 64, None, {"threads": 1}) != key and saved_key("a" * 64, None, {"threads": 2}) != key
    assert source() == "saved"
    # an entry's graph changed on disk since it was saved: ignored, built and saved again
    keys = {p: json.loads((p / ENTRY_JSON).read_text(encoding="utf-8"))["key"] for p in saved.root.iterdir()}
    [entry] = [p for p, k in keys.items()
               if k["onnxruntime"] == onnxruntime.__version__ and k["cpu_flags"] == machine.cpu_flags()]
    assert len(keys) == 3  # this host's, the other onnxruntime's, the other CPU's
    with (entry / GRAPH_NAME).open("ab") as f:
        f.write(b"\0")
    assert (source(), source()) == ("built and saved", "saved")


def test_saved_sessions_keep_the_most_recently_used(tmp_path: Path) -> None:
    import os

    from chattts_forge.runtime.saved_sessions import DATA_NAME, ENTRY_JSON, SavedSessions

    saved = SavedSessions(tmp_path)
    for age, name in enumerate(("newest", "middle", "oldest")):
        (tmp_path / name).mkdir()
        (tmp_path / name / DATA_NAME).write_bytes(b"x" * 100)
        (tmp_path / name / ENTRY_JSON).write_text("{}")
        os.utime(tmp_path / name / ENTRY_JSON, (1e9 - age, 1e9 - age))
    saved.prune(keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle", "newest"]
    saved.prune(keep=2, max_bytes=150)  # the newest stays whatever its size; the next would pass the bound
    assert [p.name for p in tmp_path.iterdir()] == ["newest"]


# ---- a cold autotune cache: the build's routes first, the host's measurement after -----------------


class TimedSteps:
    """An injected step factory: which variants are timed, and when (each step costs the fake clock
    `costs[variant]`); on this "host" fp32 steps faster than fp16, the opposite of the build's table."""

    def __init__(self, costs: dict[str, float] | None = None) -> None:
        self.costs = costs or {"fp32": 0.002, "fp16": 0.005}
        self.now = 0.0
        self.timed: list[str] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, folder: Path, context: int):
        self.timed.append(folder.name)

        def step() -> None:
            self.now += self.costs[folder.name]

        return step

    def settings(self, tmp_path: Path, **kw):
        from chattts_forge.runtime.autotune import AutotuneSettings

        return AutotuneSettings(clock=self.clock, step_factory=self, cache_dir=tmp_path / "autotune", **kw)


def test_a_cold_autotune_cache_times_and_opens_nothing_before_the_first_audio(fp16_version: Path, opened: Opened,
                                                                              tmp_path: Path) -> None:
    steps = TimedSteps()
    router = Router(fp16_version, threads=1, autotune=steps.settings(tmp_path))
    rec = router.autotune
    assert rec["source"] == "build" and rec["pending"] and router.tune_pending
    assert "has not measured" in rec["buckets"]["short"]["reason"]
    assert steps.timed == [] and opened.variants() == set() and not (tmp_path / "autotune").exists()
    assert router.routes == {"short": "fp16", "medium": "fp16", "long": "fp16"}  # the build's record
    router.synthesize(SHORT, params())
    assert opened.variants() == {"fp16"} and steps.timed == []

    record = router.tune_deferred()  # what synth does after its files, serve after its first reply
    assert set(steps.timed) == {"fp16", "fp32"} and record is router.autotune
    assert record["source"] == "measured" and record["deferred"] and not router.tune_pending
    assert Path(record["cache_file"]).is_file() and router.routes["short"] == "fp32"
    assert record["buckets"]["short"]["comparison"]["candidates"]["fp32"]["ratio"] == pytest.approx(0.4)
    timed = len(steps.timed)
    assert router.tune_deferred() is record and len(steps.timed) == timed  # nothing pending: nothing timed again
    router.synthesize(SHORT, params())  # the moved route opens fp32 on its first text
    assert opened.variants() == {"fp16", "fp32"}

    steps.timed.clear()
    again = Router(fp16_version, threads=1, autotune=steps.settings(tmp_path))
    assert again.autotune["source"] == "cache" and not again.tune_pending and steps.timed == []
    assert again.routes == router.routes


def test_cold_cache_measure_times_before_the_first_text(fp16_version: Path, tmp_path: Path) -> None:
    from chattts_forge.errors import ForgeError

    steps = TimedSteps()
    router = Router(fp16_version, threads=1, autotune=steps.settings(tmp_path, cold_cache="measure"))
    assert router.autotune["source"] == "measured" and not router.tune_pending and set(steps.timed) == {"fp16", "fp32"}
    with pytest.raises(ForgeError, match="cold_cache must be one of"):
        Router(fp16_version, threads=1, autotune=steps.settings(tmp_path / "other", cold_cache="later"))


def test_synth_writes_its_audio_before_the_deferred_measurement(fp16_version: Path, tmp_path: Path,
                                                                monkeypatch) -> None:
    from chattts_forge.runtime import autotune as tuning

    steps = TimedSteps()
    written_before_timing: list[bool] = []
    out = tmp_path / "a.wav"

    def factory(folder: Path, context: int):
        written_before_timing.append(out.is_file())
        return steps(folder, context)

    injected = tuning.AutotuneSettings(clock=steps.clock, step_factory=factory, cache_dir=tmp_path / "autotune")
    real = tuning.choose_routes
    monkeypatch.setattr(tuning, "choose_routes",
                        lambda folder, table, settings, **kw: real(folder, table, replace(injected,
                                                                                          cold_cache=settings.cold_cache),
                                                                   **kw))
    args = ["synth", "--artifact", str(fp16_version), "--autotune", "--text", SHORT, "--no-refine", "--seed", "0",
            "--max-new-token", str(STEPS), "--threads", "1", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert written_before_timing and all(written_before_timing) and set(steps.timed) == {"fp16", "fp32"}
    assert res.output.index("wrote ") < res.output.index("timing its passing variants now")
    steps.timed.clear()
    res = CliRunner().invoke(main, args)  # the host's record is cached: nothing timed, before or after
    assert res.exit_code == 0, res.output
    assert steps.timed == [] and "(cache: " in res.output


def test_serve_measures_after_its_first_reply_and_opens_a_moved_route_first(fp16_version: Path, opened: Opened,
                                                                            tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("starlette", reason="serve needs the serve extra")
    from chattts_forge.runtime import autotune as tuning
    from chattts_forge.runtime.serve.config import ServeConfig
    from chattts_forge.runtime.serve.engine import ServedVersion

    steps = TimedSteps()
    injected = steps.settings(tmp_path)

    class Injected(tuning.AutotuneSettings):  # what a server with autotune on makes: the injected steps
        def __init__(self, **changed) -> None:
            super().__init__(**{**{f: getattr(injected, f) for f in injected.__dataclass_fields__}, **changed})

    monkeypatch.setattr(tuning, "AutotuneSettings", Injected)
    monkeypatch.setenv("CHATTTS_FORGE_AUTOTUNE", "1")
    version = ServedVersion(fp16_version, ServeConfig(artifact=str(fp16_version), threads=1))
    try:
        assert version.router is not None and version.router.tune_pending and steps.timed == []
        assert set(version.pipes) == {"fp16"} and opened.variants() == {"fp16"}
        version.begin()
        assert version._tune_thread is None  # nothing measured while the first request runs
        version.end()  # the first reply is out
        assert version._tune_thread is not None
        version._tune_thread.join(timeout=120)
        assert set(steps.timed) == {"fp16", "fp32"} and not version.router.tune_pending
        # fp32 now serves short texts: its pipeline and scheduler were opened before the route moved
        assert version.router.routes["short"] == "fp32" and set(version.schedulers) == {"fp16", "fp32"}
        assert version.variant_for(None, SHORT) == "fp32"
        first = version._tune_thread
        version.begin()
        version.end()
        assert version._tune_thread is first  # measured once
    finally:
        version.close()


# Packages the runtime imports only inside the functions that use them (each with its import cost in a
# comment there): starting a command, or its --help, must not load them.
DEFERRED_PACKAGES = frozenset({"onnxruntime", "onnx", "torch", "ChatTTS", "transformers", "wetext", "kaldifst",
                               "model_signing", "cryptography", "psutil", "tqdm", "av", "ray", "tokenizers"})


def _imported_packages(module: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing `module`."""
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {name.split(".")[0] for name in out.split()}


@pytest.mark.parametrize("module", ["chattts_forge.cli", "chattts_forge.runtime.cli", "chattts_forge.runtime.synth",
                                    "chattts_forge.runtime.router", "chattts_forge.runtime.loaded_artifact"])
def test_starting_a_command_loads_no_deferred_package(module: str) -> None:
    loaded = _imported_packages(module) & DEFERRED_PACKAGES
    assert not loaded, f"importing {module} loads {sorted(loaded)}: keep those imports inside their functions"


def test_the_command_line_help_loads_no_stage() -> None:
    """`chattts-forge --help` loads each stage lazily, by name: not even numpy."""
    packages = _imported_packages("chattts_forge.cli")
    assert "numpy" not in packages and "chattts_forge" in packages
