"""The `make artifacts` driver (chattts_forge.driver) with stand-in stage commands.

The stand-in (`FAKE_FORGE`) answers the same command lines as `chattts-forge`, writes outputs
atomically like the real stages, logs each call, and can fail a gate or SIGKILL the driver mid-step.
This keeps the driver's tests to seconds; `make artifacts PRESET=tiny` runs the real stages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_forge.gate import DEFAULT_GATE
from chattts_forge.publish import verify_path

FAKE_FORGE = r'''
import time
_started = time.time()  # a span starts with the process, before its imports (--jobs: what overlaps)
import hashlib, json, os, shutil, signal, sys, tempfile
from pathlib import Path
from chattts_forge.evaluate.report_schema import report_json_bytes
sys.path.insert(0, os.environ["FAKE_TESTS_DIR"])
from stand_in_report import stand_in_report

argv = sys.argv[1:]
def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
def sha(b):
    return hashlib.sha256(b).hexdigest()
def content(spec):
    p = Path(spec)
    return p.read_bytes() if p.is_file() else spec.encode()

call = argv[0] + (":" + argv[1] if argv[0] == "checkpoint" else "")
if argv[0] == "quantize":
    call += ":" + opt("--method") + ("-kv8" if opt("--kv-cache") == "int8" else "")
if argv[0] == "evaluate":
    call += ":" + Path(opt("--artifact")).name
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(call + "\n")
if os.environ.get("FAKE_ARGV_LOG"):
    with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
        f.write(json.dumps(argv) + "\n")
if os.environ.get("FAKE_SPANS"):  # when each call ran (the steps side by side: --jobs)
    import atexit
    atexit.register(lambda: open(os.environ["FAKE_SPANS"], "a").write(f"{call} {_started} {time.time()}\n"))
    print(f"stand-in {call}", file=sys.stderr, flush=True)
    if call in os.environ.get("FAKE_SLOW", "").split(","):
        time.sleep(3)  # longer than the driver takes to start the next step beside it on a loaded CI machine
if os.environ.get("FAKE_CRASH") == call:
    sys.exit("error: simulated stage crash")

def atomic_dir(final, fill):
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="." + final.name + ".", suffix=".partial", dir=final.parent))
    fill(tmp)
    if os.environ.get("FAKE_KILL_AT") == call:  # die mid-step, leaving a temp folder, with the driver
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)

def artifact(folder, variant, gpt, src_hashes, quant=None):
    (folder / "gpt.onnx").write_bytes(gpt)
    (folder / "vocos.onnx").write_bytes(b"vocos" * 100)
    precision = {"fp32": "fp32", "fp16": "fp16", "int4": "int4"}.get(variant, "int8")
    meta = {"schema": "chattts-forge/artifact/1", "name": "chattts", "variant": variant,
            "components": {"gpt": {"file": "gpt.onnx", "precision": precision, "opset": 17},
                           "vocos": {"file": "vocos.onnx", "precision": "fp32", "opset": 17}},
            "source": {"kind": "synthetic", "preset": "tiny", "seed": 0, "hashes": src_hashes},
            "quantization": quant, "versions": {"onnx": "1.23.2"},
            "toolchain": {"name": "chattts-forge", "version": "0.1.0", "git_commit": "x"}}
    (folder / "artifact.json").write_text(json.dumps(meta, indent=2))

if call == "checkpoint:synthesize":
    def fill(d):
        (d / "gpt").mkdir()
        (d / "gpt" / "model.safetensors").write_bytes(sha(f"{opt('--preset')}{opt('--seed')}".encode()).encode() * 10)
    atomic_dir(opt("--out"), fill)
elif call == "checkpoint:verify":
    print(json.dumps({"kind": "synthetic"}))
elif argv[0] == "convert":
    ckpt = Path(opt("--checkpoint"))
    hashes = {p.relative_to(ckpt).as_posix(): sha(p.read_bytes()) for p in sorted(ckpt.rglob("*")) if p.is_file()}
    out = Path(opt("--out"))
    for prec in ("fp32", "fp16"):
        atomic_dir(out / prec, lambda d, p=prec: artifact(d, p, (p + json.dumps(hashes)).encode() * 20, hashes))
elif argv[0] == "calibrate":
    gpt = (Path(opt("--artifact")) / "gpt.onnx").read_bytes()
    corpus = content(opt("--corpus"))
    atomic_dir(opt("--out"), lambda d: (d / "shard0.bin").write_bytes(sha(gpt + corpus).encode()))
elif argv[0] == "quantize":
    src = Path(opt("--artifact"))
    method = opt("--method")
    variant = {"dynamic": "int8-dynamic", "static": "int8-static", "int4": "int4", "auto": "auto"}[method]
    variant += "-kv8" if opt("--kv-cache") == "int8" else ""
    calib = opt("--calibration")
    extra = (Path(calib) / "shard0.bin").read_bytes() if calib else b""
    hashes = json.loads((src / "artifact.json").read_text())["source"]["hashes"]
    quant = {"method": method, "calibration": {"corpus": "calib.txt", "sha256": sha(extra), "samples": 3} if calib else None}
    atomic_dir(opt("--out"), lambda d: artifact(d, variant, sha((src / "gpt.onnx").read_bytes() + variant.encode() + extra).encode(), hashes, quant))
elif argv[0] == "warm":  # a real (empty) phrase cache made for the variants routing.json routes to
    from chattts_forge.fsutil import atomic_write_bytes
    from chattts_forge.runtime.phrase_cache import encode_cache, payload_sha256
    version = Path(opt("--artifact"))
    routed = sorted({b["variant"] for b in json.loads((version / "routing.json").read_text())["buckets"]})
    atomic_write_bytes(opt("--out"), encode_cache({"seed": 0}, {v: payload_sha256(version / v) for v in routed}, []))
elif argv[0] == "evaluate-reference":  # the FP32 reference's side of every evaluation, once per build
    ref = (Path(opt("--reference")) / "gpt.onnx").read_bytes()
    atomic_dir(opt("--out"), lambda d: (d / "reference_run.json").write_text(sha(ref + content(opt("--corpus")))))
elif argv[0] == "evaluate-latency":  # every variant but fp32 timed against it in the same rounds, once
    # (new timings whenever an artifact changed: stood in for by the artifacts' gpt hashes)
    timed = {json.loads((Path(b) / "artifact.json").read_text())["variant"]: sha((Path(b) / "gpt.onnx").read_bytes())
             for a, b in zip(argv, argv[1:]) if a == "--artifact"}
    atomic_dir(opt("--out"), lambda d: (d / "latency_run.json").write_text(json.dumps({"artifacts": timed})))
else:
    assert argv[0] == "evaluate", argv
    assert Path(opt("--reference-run"), "reference_run.json").is_file(), "evaluated before its reference run"
    if "--latency-run" in argv:
        assert Path(opt("--latency-run"), "latency_run.json").is_file(), "evaluated before its latency run"
    art = Path(opt("--artifact"))
    variant = json.loads((art / "artifact.json").read_text())["variant"]
    passed = variant not in os.environ.get("FAKE_FAIL", "").split(",")
    report = stand_in_report(art, passed=passed, corpus={"sha256": sha(content(opt("--corpus")))},
                             created_at="2026-11-30T03:00:00Z")
    def fill(d):
        (d / "report.json").write_bytes(report_json_bytes(report))
        (d / "report.md").write_text("# report\n")
    atomic_dir(opt("--out"), fill)
    sys.exit(0 if passed else 1)
'''

VARIANTS = ["fp32", "fp16", "int8-dynamic", "int8-static", "int4", "auto", "int8-dynamic-kv8"]


class Runner:
    def __init__(self, tmp: Path, name: str = "run") -> None:
        self.base = tmp / name
        self.base.mkdir()
        self.fake = tmp / "fake_forge.py"
        self.fake.write_text(FAKE_FORGE)
        self.log = self.base / "calls.log"
        self.calib = tmp / "calib.txt"
        if not self.calib.exists():
            self.calib.write_text("一句话。\nA sentence.\n", encoding="utf-8")
        self.build = self.base / "build"
        self.to = self.base / "artifacts"

    def calls(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def run(self, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable, "-m", "chattts_forge.driver", "--preset", "tiny",
            "--build", str(self.build), "--to", str(self.to),
            "--calib-corpus", str(self.calib), "--eval-corpus", "builtin:evaluation",
            "--forge-cmd", f"{sys.executable} {self.fake}", *extra,
        ]  # fmt: skip
        full_env = {**os.environ, "FAKE_LOG": str(self.log), "FAKE_TESTS_DIR": str(Path(__file__).parent), **env}
        return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every published byte but the signatures' (an ECDSA signature is randomized: two signings of the
    same files differ, and both verify: `signed`)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "model.sig"}


def signed(root: Path) -> bool:
    """Every published variant and version folder carries a model.sig that verifies with the tree's key."""
    result = verify_path(root, public_key=root / "signing-key.pub")
    return result.ok and len(result.signatures) == len(result.variants) + len(result.versions)


def leftovers(*roots: Path) -> list[Path]:
    return [
        p
        for root in roots
        for p in root.rglob(".*")
        if p.name.endswith((".partial", ".old", ".tmp")) or p.name == ".staging"
    ]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, subprocess.CompletedProcess[str]]:
    """One uninterrupted run (int8-static failing its gate); tests read it, never change it."""
    r = Runner(tmp_path_factory.mktemp("pipeline"), "clean")
    return r, r.run(FAKE_FAIL="int8-static")


def test_pipeline_publishes_what_passes_and_second_run_redoes_nothing(clean_run) -> None:
    r, proc = clean_run
    assert proc.returncode == 0, proc.stderr
    calls = r.calls()
    assert calls[:3] == ["checkpoint:synthesize", "checkpoint:verify", "convert"]
    assert sorted(c for c in calls if c.startswith("evaluate:")) == sorted(f"evaluate:{v}" for v in VARIANTS)
    # the reference's side of the seven evaluations (its audio, the PyTorch baseline, its ASR): once,
    # before the first evaluation
    assert calls.count("evaluate-reference") == 1
    assert calls.index("evaluate-reference") < min(i for i, c in enumerate(calls) if c.startswith("evaluate:"))
    index = json.loads((r.to / "index.json").read_text())
    assert sorted(e["variant"] for e in index["variants"]) == sorted(set(VARIANTS) - {"int8-static"})
    assert verify_path(r.to).ok
    assert "int8-static    FAIL" in proc.stdout and "reports:" in proc.stdout
    # the build's time per stage, from the steps' own records (every stage that ran is named)
    [per_stage] = [line for line in proc.stdout.splitlines() if line.startswith("time per stage")]
    assert all(f"{stage} " in per_stage for stage in ("checkpoint", "convert", "calibrate", "quantize", "evaluate"))
    # the version page: every variant with its verdict (the refused one too), listed and linked
    [version] = index["versions"]
    page = r.to / version["path"] / "report.html"
    assert f"version page (every variant, by eye and by ear): {page}" in proc.stdout
    text = page.read_text(encoding="utf-8")
    assert all(f"<tr id='variant-{v}'>" in text for v in VARIANTS) and "REFUSED" in text
    copy = r.build / "synthetic-tiny-seed0" / "reports" / f"{version['model']}-{version['version']}.html"
    assert copy.read_bytes() == page.read_bytes()
    published = tree_bytes(r.to)
    signatures = {p: p.read_bytes() for p in r.to.rglob("model.sig")}
    assert len(signatures) == len(index["variants"]) + len(index["versions"])

    again = r.run(FAKE_FAIL="int8-static")
    assert again.returncode == 0, again.stderr
    assert r.calls() == calls  # not one stage ran again
    assert "ran: nothing" in again.stdout
    assert tree_bytes(r.to) == published
    # Nothing changed, so nothing was signed again either: the signatures are the same bytes.
    assert {p: p.read_bytes() for p in r.to.rglob("model.sig")} == signatures
    assert signed(r.to)


def test_changed_corpus_reruns_only_what_depends_on_it(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    assert r.run().returncode == 0
    before = len(r.calls())
    r.calib.write_text("另一句话。\n", encoding="utf-8")
    proc = r.run()
    assert proc.returncode == 0, proc.stderr
    # Every calibrated variant (static, GPTQ int4, auto, the INT8 KV cache's scales) is rebuilt from
    # the new calibration set; int8-dynamic (no calibration) is not. The shared latency run times
    # every variant in the same rounds, so it runs again, and with it every evaluation that reads it
    # (all but fp32's): the price of timing the reference once per build instead of once per variant.
    assert r.calls()[before:] == ["calibrate", "quantize:static", "quantize:int4", "quantize:auto",
                                  "quantize:dynamic-kv8", "evaluate-latency", "evaluate:fp16", "evaluate:int8-dynamic",
                                  "evaluate:int8-static", "evaluate:int4", "evaluate:auto", "evaluate:int8-dynamic-kv8"]
    # The new static artifact is a new version; the old one stays published.
    index = json.loads((r.to / "index.json").read_text())
    assert [(e["version"], e["variant"]) for e in index["variants"] if e["variant"] == "int8-static"] == [
        ("v1", "int8-static"),
        ("v2", "int8-static"),
    ]
    assert verify_path(r.to).ok
    # A touched output is rebuilt (same bytes again, so nothing downstream reruns).
    q = r.build / "synthetic-tiny-seed0" / "quantized" / "int4" / "gpt.onnx"
    q.write_bytes(b"tampered")
    before = len(r.calls())
    assert r.run().returncode == 0
    assert r.calls()[before:] == ["quantize:int4"]
    assert q.read_bytes() != b"tampered"


@pytest.mark.parametrize("kill_at", ["convert", "quantize:static", "evaluate:int4"])
def test_killed_run_resumes_to_the_same_published_bytes(clean_run, tmp_path: Path, kill_at: str) -> None:
    clean, _ = clean_run
    killed = Runner(tmp_path, "killed")
    proc = killed.run(FAKE_KILL_AT=kill_at, FAKE_FAIL="int8-static")
    assert proc.returncode == -9, proc.stderr
    assert leftovers(killed.build)  # the kill left a temporary folder behind
    resumed = killed.run(FAKE_FAIL="int8-static")
    assert resumed.returncode == 0, resumed.stderr
    assert tree_bytes(killed.to) == tree_bytes(clean.to)
    assert leftovers(killed.build, killed.to) == []
    assert verify_path(killed.to).ok and signed(killed.to)


def spans(path: Path) -> dict[str, tuple[float, float]]:
    return {c: (float(a), float(b)) for c, a, b in (line.split() for line in path.read_text().splitlines())}


def test_jobs_run_untimed_steps_side_by_side_to_the_same_published_bytes(clean_run, tmp_path: Path) -> None:
    """--jobs 2: calibrate and the quantize steps that time nothing overlap; every step that times
    something (evaluate-reference, auto's quantize, the latency run, the evaluations) runs alone; the
    publication is the one-at-a-time run's, and the records are the same (a --jobs 1 run redoes nothing)."""
    clean, _ = clean_run
    r = Runner(tmp_path)
    times = tmp_path / "spans.log"
    proc = r.run("--jobs", "2", FAKE_FAIL="int8-static", FAKE_SPANS=str(times), FAKE_SLOW="calibrate,quantize:int4")
    assert proc.returncode == 0, proc.stderr
    assert tree_bytes(r.to) == tree_bytes(clean.to)
    ran = spans(times)
    untimed = {"calibrate", "quantize:dynamic", "quantize:static", "quantize:int4", "quantize:dynamic-kv8"}

    def overlap(a: str, b: str) -> bool:
        return ran[a][0] < ran[b][1] and ran[b][0] < ran[a][1]

    assert overlap("calibrate", "quantize:dynamic")  # it reads no calibration
    for calibrated in ("quantize:static", "quantize:int4", "quantize:dynamic-kv8"):
        assert ran[calibrated][0] >= ran["calibrate"][1]
    assert any(overlap("quantize:int4", q) for q in ("quantize:static", "quantize:dynamic-kv8"))
    for alone in set(ran) - untimed:
        assert not any(overlap(alone, other) for other in set(ran) - {alone}), alone
    assert all(ran[q][0] >= ran["evaluate-reference"][1] for q in untimed - {"calibrate"})  # they read its runs
    assert "[calibrate] stand-in calibrate" in proc.stderr and "side by side, 2 at a time" in proc.stderr
    [per_stage] = [line for line in proc.stdout.splitlines() if line.startswith("time per stage")]
    assert "side by side, --jobs" in per_stage
    before = len(r.calls())
    again = r.run(FAKE_FAIL="int8-static")
    assert again.returncode == 0, again.stderr
    assert len(r.calls()) == before and "ran: nothing" in again.stdout


def test_side_by_side_lines_keep_their_time_stamp_first() -> None:
    """A step's stamped line names the step after its stamp (a log reader that times the build by the
    stamp at each line's start sees no gap while steps run side by side); other lines begin with it."""
    from chattts_forge.driver.steplog import labelled

    stamped = b"17:46:36 INFO    chattts_forge.progress: calibrate: 480/512 sent\n"
    assert labelled(stamped, b"[calibrate] ") == b"17:46:36 [calibrate] INFO    chattts_forge.progress: calibrate: 480/512 sent\n"
    assert labelled(b"Traceback (most recent call last):\n", b"[calibrate] ") == b"[calibrate] Traceback (most recent call last):\n"
    assert labelled(stamped, b"") == stamped


def test_jobs_a_failed_calibration_sets_aside_what_reads_it(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    proc = r.run("--jobs", "2", FAKE_CRASH="calibrate")
    assert proc.returncode == 2
    index = json.loads((r.to / "index.json").read_text())
    assert sorted(e["variant"] for e in index["variants"]) == ["fp16", "fp32", "int8-dynamic"]
    assert not any(c.startswith(("quantize:static", "quantize:int4", "quantize:auto", "quantize:dynamic-kv8"))
                   for c in r.calls())


def test_jobs_must_be_a_whole_number_of_at_least_one(tmp_path: Path) -> None:
    proc = Runner(tmp_path).run("--jobs", "0")
    assert proc.returncode == 2 and "Invalid value for '--jobs': 0 is not in the range x>=1" in proc.stderr


def test_a_crashing_variant_is_set_aside_and_the_others_are_published(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    proc = r.run(FAKE_CRASH="evaluate:fp16")
    assert proc.returncode == 2
    assert "1 variant(s) could not be built or evaluated (fp16)" in proc.stderr
    assert "fp16           ERROR" in proc.stdout
    # the version page says which step failed, without the command's folders of this machine
    [page] = r.to.glob("*/v1/report.html")
    html = page.read_text(encoding="utf-8")
    assert "step evaluate-fp16 failed (exit 1)" in html and str(r.base) not in html and "&lt;build&gt;/" in html
    index = json.loads((r.to / "index.json").read_text())
    assert sorted(e["variant"] for e in index["variants"]) == sorted(set(VARIANTS) - {"fp16"})
    before = len(r.calls())
    proc = r.run()
    assert proc.returncode == 0, proc.stderr
    assert r.calls()[before:] == ["evaluate:fp16", "warm"]  # fp16 joins v1: its routing table changed
    assert len(json.loads((r.to / "index.json").read_text())["variants"]) == len(VARIANTS)


@pytest.mark.parametrize(("flag", "expected"), [((), "--no-baseline"), (("--pytorch-baseline",), "--baseline-checkpoint")])
def test_tiny_runs_skip_the_pytorch_baseline_unless_asked(tmp_path: Path, flag: tuple[str, ...], expected: str) -> None:
    """A tiny run is a smoke run: its evaluations do not time ChatTTS's PyTorch code unless asked."""
    r = Runner(tmp_path)
    argv_log = tmp_path / "argv.log"
    proc = r.run(*flag, FAKE_ARGV_LOG=str(argv_log))
    assert proc.returncode == 0, proc.stderr
    argvs = list(map(json.loads, argv_log.read_text().splitlines()))
    evaluations = [a for a in argvs if a[0] == "evaluate"]
    [reference_run] = [a for a in argvs if a[0] == "evaluate-reference"]
    assert len(evaluations) == len(VARIANTS)
    for argv in [*evaluations, reference_run]:  # the shared run is measured with the evaluations' baseline
        assert expected in argv and not ({"--no-baseline", "--baseline-checkpoint"} - {expected}) & set(argv)
    # every evaluation reads the one reference run, measured with its own evaluate options (the preset's)
    out = reference_run[reference_run.index("--out") + 1]
    assert all(a[a.index("--reference-run") + 1] == out for a in evaluations)
    assert reference_run[reference_run.index("--max-new-token") + 1] == "48"


def test_the_variants_are_timed_once_in_one_latency_run_read_by_their_evaluations(tmp_path: Path) -> None:
    """evaluate-latency: every variant but fp32 (its own reference) in one step after the quantize steps
    and before the evaluations; each of those evaluations reads it, fp32's does not. Should it fail,
    the evaluations time themselves (nothing is set aside)."""
    r = Runner(tmp_path)
    argv_log = tmp_path / "argv.log"
    proc = r.run(FAKE_ARGV_LOG=str(argv_log))
    assert proc.returncode == 0, proc.stderr
    calls = r.calls()
    assert calls.count("evaluate-latency") == 1
    assert max(i for i, c in enumerate(calls) if c.startswith("quantize:")) < calls.index("evaluate-latency") \
        < min(i for i, c in enumerate(calls) if c.startswith("evaluate:"))
    argvs = list(map(json.loads, argv_log.read_text().splitlines()))
    [latency] = [a for a in argvs if a[0] == "evaluate-latency"]
    timed = sorted(Path(b).name for a, b in zip(latency, latency[1:], strict=False) if a == "--artifact")
    assert timed == sorted(set(VARIANTS) - {"fp32"})
    out = latency[latency.index("--out") + 1]
    for a in (a for a in argvs if a[0] == "evaluate"):
        reads = a[a.index("--latency-run") + 1] if "--latency-run" in a else None
        assert reads == (None if Path(a[a.index("--artifact") + 1]).name == "fp32" else out), a

    failing = Runner(tmp_path, "latency-fails")
    argv_log2 = tmp_path / "argv2.log"
    proc = failing.run(FAKE_CRASH="evaluate-latency", FAKE_ARGV_LOG=str(argv_log2))
    assert proc.returncode == 0, proc.stderr
    evaluations = [a for a in map(json.loads, argv_log2.read_text().splitlines()) if a[0] == "evaluate"]
    assert len(evaluations) == len(VARIANTS) and not any("--latency-run" in a for a in evaluations)
    assert "evaluate-latency failed" in proc.stderr and "going on without it" in proc.stderr


def test_the_int8_kv_cache_variant_is_quantized_from_the_calibration_set(tmp_path: Path) -> None:
    """int8-dynamic-kv8: dynamic weights plus `--kv-cache int8` with the calibration folder (its cache
    scales); int8-dynamic keeps its command (so its step key, and its published bytes, stay)."""
    r = Runner(tmp_path)
    argv_log = tmp_path / "argv.log"
    proc = r.run(FAKE_ARGV_LOG=str(argv_log))
    assert proc.returncode == 0, proc.stderr
    quantize = {Path(a[a.index("--out") + 1]).name: a for a in map(json.loads, argv_log.read_text().splitlines())
                if a[0] == "quantize"}
    kv8, plain = quantize["int8-dynamic-kv8"], quantize["int8-dynamic"]
    assert kv8[kv8.index("--method") + 1] == "dynamic" and kv8[kv8.index("--kv-cache") + 1] == "int8"
    assert Path(kv8[kv8.index("--calibration") + 1]) == r.build / "synthetic-tiny-seed0" / "calibration"
    assert "--kv-cache" not in plain and "--calibration" not in plain
    index = json.loads((r.to / "index.json").read_text())
    assert "int8-dynamic-kv8" in {e["variant"] for e in index["variants"]}


def test_only_the_method_that_searches_against_a_gate_is_given_it(tmp_path: Path) -> None:
    """--gate reaches `quantize` for the method the registry says takes one (auto's search), not the others."""
    r = Runner(tmp_path)
    gate = tmp_path / "gate.toml"
    gate.write_text(DEFAULT_GATE.read_text())
    argv_log = tmp_path / "argv.log"
    proc = r.run("--variants", "fp32,int8-dynamic,auto", "--gate", str(gate), FAKE_ARGV_LOG=str(argv_log))
    assert proc.returncode == 0, proc.stderr
    quantize = {Path(a[a.index("--out") + 1]).name: a for a in map(json.loads, argv_log.read_text().splitlines())
                if a[0] == "quantize"}
    assert set(quantize) == {"int8-dynamic", "auto"}
    assert quantize["auto"][quantize["auto"].index("--gate") + 1] == str(gate)
    assert "--gate" not in quantize["int8-dynamic"]


@pytest.mark.parametrize("until, calls", [
    ("checkpoint", ["checkpoint:synthesize", "checkpoint:verify"]),
    ("convert", ["checkpoint:synthesize", "checkpoint:verify", "convert"]),
    ("calibrate", ["checkpoint:synthesize", "checkpoint:verify", "convert", "calibrate"]),
    ("quantize", ["checkpoint:synthesize", "checkpoint:verify", "convert", "calibrate", "evaluate-reference",
                  "quantize:dynamic", "quantize:static", "quantize:int4", "quantize:auto", "quantize:dynamic-kv8"]),
])  # fmt: skip
def test_until_stops_after_its_stage_without_reading_what_later_stages_need(tmp_path: Path, until: str,
                                                                            calls: list[str]) -> None:
    """`--until STAGE` runs the steps up to STAGE (the FP32 reference run with the quantize steps, whose
    fidelity runs it records), publishes nothing and exits 0; a later full run does only the rest."""
    r = Runner(tmp_path)
    proc = r.run("--until", until)
    assert proc.returncode == 0, proc.stderr
    assert r.calls() == calls and f"stopped after {until}" in proc.stdout
    assert not r.to.exists() or not any(r.to.iterdir())
    done = len(r.calls())
    proc = r.run()
    assert proc.returncode == 0, proc.stderr
    assert not set(r.calls()[done:]) & set(calls)  # nothing done twice
