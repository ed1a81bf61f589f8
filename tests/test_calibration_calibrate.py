"""`calibrate`: streamed statistics of every quantizable graph, a bounded seeded raw sample, merges, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from chattts_forge.calibration_data.calibrate import calibrate
from chattts_forge.calibration_data.calibrate_config import parse_max_samples
from chattts_forge.calibration_data.sentence_plan import select_sentences
from chattts_forge.calibration_data.statistics import HIST_BINS, Statistics, TensorStats
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.cli import main
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import recorded_path

SMALL = {"max_samples": 3, "max_new_token": 12, "decode_positions": 3, "head_steps": 4, "threads": 1}
ZH = ["请问我的订单什么时候发货", "今天天气很好，我们出去走走吧"]
EN = ["Your refund has been processed today.", "Please hold the line for a moment."]


@pytest.fixture(scope="module")
def calib_dir(tiny_artifacts, tmp_path_factory) -> Path:
    return calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path_factory.mktemp("c") / "calib", **SMALL)


def _corpus(folder: Path, **files: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        (folder / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_streams_statistics_of_every_quantized_graph(calib_dir: Path, tiny_artifacts):
    store = CalibrationStore(calib_dir)
    m = store.manifest
    assert m["sentences"]["used"] == 3 and len(m["sentence_sha256"]) == 3
    assert sum(f["used"] for f in m["sentences"]["per_file"].values()) == 3
    assert m["gpt_samples"]["prefill"] == 3 and m["gpt_samples"]["decode"] >= 3
    stats = store.statistics
    assert set(stats.graphs) == {"gpt", "gpt_fast", "head_code"}
    steps = m["gpt_samples"]["prefill"] + m["gpt_samples"]["decode"]
    for graph in ("gpt", "gpt_fast"):
        assert stats.samples(graph) == steps
        for st in stats.graphs[graph].values():
            assert st.min <= st.max and st.hist.sum() > 0 and (st.absmax > 0).any()
            assert int(st.hist.sum()) == st.rows * st.channels  # every value counted once
    # The KV statistics saw every decode step, and per channel
    assert stats.kv_samples == m["gpt_samples"]["decode"] and stats.kv["0.key"].absmax.ndim == 2
    meta = json.loads((tiny_artifacts["fp32"] / "artifact.json").read_text())
    assert stats.graph_sha256["gpt"] == meta["components"]["gpt"]["sha256"] == m["artifact"]["gpt_sha256"]
    gpt = list(store.iter_samples("gpt"))
    assert len(gpt) == store.count("gpt") and gpt[0]["past_key_values.0.key"].dtype == np.float32
    assert next(store.iter_samples("dvae"))["codes"].dtype == np.int64
    assert m["bounds"]["raw_sample"]["gpt"]["count"] >= store.count("gpt")


def test_statistics_match_the_raw_inputs(calib_dir: Path):
    """min/max of the fused graph's MatMul inputs over the raw sample (here every recorded step) equal the streamed ones."""
    from chattts_forge.quantize.static_fused import const_weight_matmuls, fused_feed, record_ranges

    store = CalibrationStore(calib_dir)
    m = store.manifest
    assert m["components"]["gpt"]["samples"] == m["components"]["gpt"]["offered"]  # nothing dropped at this size
    import onnx

    fast = recorded_path(m["artifact"]["path"], calib_dir) / "gpt_fast.onnx"  # relative to the set's folder
    tensors = sorted({n.input[0] for n in const_weight_matmuls(onnx.load(str(fast)))})
    ranges, _ = record_ranges(fast, tensors, (fused_feed(s) for s in store.iter_samples("gpt")))
    streamed = store.statistics.ranges("gpt_fast", tensors)
    for t in tensors:
        np.testing.assert_allclose(ranges[t], streamed[t], rtol=1e-5, atol=1e-6)


def test_deterministic_for_a_seed(calib_dir: Path, tiny_artifacts, tmp_path: Path):
    again = calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "again", **SMALL)
    assert (again / "statistics.npz").read_bytes() == (calib_dir / "statistics.npz").read_bytes()
    a, b = CalibrationStore(calib_dir), CalibrationStore(again)
    assert a.count("gpt") == b.count("gpt")
    for sa, sb in zip(a.iter_samples("gpt"), b.iter_samples("gpt"), strict=True):
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k])


def test_raw_sample_keeps_the_smallest_keys_within_its_bounds(calib_dir: Path, tiny_artifacts, tmp_path: Path):
    out = calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "small",
                    raw_sample_counts={"gpt": 2, "head_code": 1}, **SMALL)
    m, full = CalibrationStore(out).manifest, CalibrationStore(calib_dir).manifest
    assert m["components"]["gpt"]["samples"] == 2 and m["components"]["head_code"]["samples"] == 1
    assert m["components"]["gpt"]["keys"] == sorted(full["components"]["gpt"]["keys"])[:2]
    assert m["truncated_by_budget"] is True
    # The statistics still saw every step: only the raw sample is bounded.
    assert (out / "statistics.npz").read_bytes() == (calib_dir / "statistics.npz").read_bytes()
    assert sorted(p.name for p in (out / "gpt").iterdir()) == sorted(Path(s).name for s in m["components"]["gpt"]["shards"])
    tight = calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "tight", disk_budget_mb=0.2, **SMALL)
    t = CalibrationStore(tight).manifest
    for comp, rec in t["components"].items():
        assert rec["bytes"] <= t["bounds"]["raw_sample"][comp]["bytes"], comp


def test_nothing_but_the_sample_grows_with_the_corpus(calib_dir: Path, tiny_artifacts, tmp_path: Path):
    one = calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "one", **{**SMALL, "max_samples": 1})

    def shapes(folder: Path) -> dict[str, tuple[int, ...]]:
        with np.load(folder / "statistics.npz") as z:
            return {k: z[k].shape for k in z.files if k != "index"}

    assert shapes(one) == shapes(calib_dir)  # the same arrays, the same sizes: fixed by the graphs
    st = TensorStats(4)
    for _ in range(3):
        st.update(np.ones((5, 4), np.float32))
    assert st.hist.shape == (HIST_BINS,) and st.absmax.shape == (4,) and st.rows == 15


def test_merge_of_two_runs_equals_one_run_over_both(tiny_artifacts, tmp_path: Path):
    fp32 = tiny_artifacts["fp32"]
    # Exact at batch size 1, one batch a call (a batch's sampling seed and observed steps come from its
    # first sentence; batches generated together agree only up to float rounding).
    args = {**SMALL, "max_samples": "all", "batch_size": 1, "batches_per_call": 1}
    a = calibrate(fp32, _corpus(tmp_path / "a", zh=ZH[:1], en=EN[:1]), tmp_path / "A", **args)
    b = calibrate(fp32, _corpus(tmp_path / "b", zh=ZH[1:], en=EN[1:]), tmp_path / "B", merge=[a], **args)
    both = calibrate(fp32, _corpus(tmp_path / "ab", zh=ZH, en=EN), tmp_path / "AB", **args)
    sb, sboth = CalibrationStore(b), CalibrationStore(both)
    assert sb.manifest["sentence_sha256"] == sboth.manifest["sentence_sha256"]
    used = {f: r["used"] for f, r in sboth.manifest["sentences"]["per_file"].items()}
    assert {f: r["used"] for f, r in sb.manifest["sentences"]["per_file"].items()} == used == {"en": 2, "zh": 2}
    x, y = sb.statistics, sboth.statistics
    assert x.kv_samples == y.kv_samples and set(x.graphs) == set(y.graphs)
    for g in y.graphs:
        for name, st in y.graphs[g].items():
            other = x.graphs[g][name]
            assert (other.min, other.max, other.rows, other.samples) == (st.min, st.max, st.rows, st.samples)
            np.testing.assert_array_equal(other.hist, st.hist)
            np.testing.assert_array_equal(other.absmax, st.absmax)
            np.testing.assert_allclose(other.sum_sq, st.sum_sq, rtol=1e-12)
    for k in y.kv:
        np.testing.assert_array_equal(x.kv[k].absmax, y.kv[k].absmax)
    for comp in ("gpt", "head_code", "decoder", "dvae"):
        assert sb.manifest["components"][comp]["keys"] == sboth.manifest["components"][comp]["keys"], comp
    # A folder merged into itself adds nothing new: its sentences are not synthesized again.
    again = calibrate(fp32, _corpus(tmp_path / "ab2", zh=ZH, en=EN), tmp_path / "again", merge=[both], **args)
    assert CalibrationStore(again).manifest["sentences"]["already_in_merged_runs"] == 4


def test_batched_rows_observe_each_sentence_as_alone(tiny_artifacts, tmp_path: Path):
    """In a batch every sentence's prefill is observed on its own unpadded row: with no decode or head
    steps observed, batch 3 and batch 1 give the same prefill statistics and the same raw inputs."""
    fp32 = tiny_artifacts["fp32"]
    args = {**SMALL, "decode_positions": 0, "head_steps": 0}
    one = CalibrationStore(calibrate(fp32, "builtin:calibration", tmp_path / "b1", batch_size=1, **args))
    three = CalibrationStore(calibrate(fp32, "builtin:calibration", tmp_path / "b3", batch_size=3, **args))
    assert three.manifest["gpt_samples"]["batches"] == 1 and one.manifest["gpt_samples"]["batches"] == 3
    assert three.manifest["gpt_samples"]["prefill"] == 3 and three.manifest["gpt_samples"]["decode"] == 0
    for g in ("gpt", "gpt_fast"):
        for name, st in one.statistics.graphs[g].items():
            other = three.statistics.graphs[g][name]
            assert (other.rows, other.samples) == (st.rows, st.samples)
            np.testing.assert_allclose((other.min, other.max), (st.min, st.max), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(other.sum_sq, st.sum_sq, rtol=1e-4)
    assert one.manifest["components"]["gpt"]["keys"] == three.manifest["components"]["gpt"]["keys"]
    for a, b in zip(one.iter_samples("gpt"), three.iter_samples("gpt"), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_batches_generated_in_one_call_are_each_sampled_and_observed_as_alone(tiny_artifacts, tmp_path: Path):
    """Batches generated together in one GPT call keep their own seeds, observed steps and rows: the same
    sentences, steps, counts and raw-sample keys as one call a batch, statistics equal up to float
    rounding (the GPT runs on a wider padded batch)."""
    fp32 = tiny_artifacts["fp32"]
    args = {**SMALL, "max_samples": 6, "batch_size": 2}
    alone = CalibrationStore(calibrate(fp32, "builtin:calibration", tmp_path / "c1", batches_per_call=1, **args))
    together = CalibrationStore(calibrate(fp32, "builtin:calibration", tmp_path / "c3", batches_per_call=3, **args))
    a, b = alone.manifest, together.manifest
    assert b["settings"]["batches_per_call"] == 3 and a["settings"]["batches_per_call"] == 1
    assert a["sentence_sha256"] == b["sentence_sha256"] and a["gpt_samples"] == b["gpt_samples"]
    assert a["gpt_samples"]["batches"] == 3 and a["gpt_samples"]["decode"] > 0
    for comp in ("gpt", "head_code", "decoder", "dvae"):
        assert a["components"][comp]["keys"] == b["components"][comp]["keys"], comp
    for g, tensors in alone.statistics.graphs.items():
        for name, st in tensors.items():
            other = together.statistics.graphs[g][name]
            assert (other.rows, other.samples) == (st.rows, st.samples)
            np.testing.assert_allclose((other.min, other.max), (st.min, st.max), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(other.sum_sq, st.sum_sq, rtol=1e-4, atol=1e-6)
            assert other.hist.sum() == st.hist.sum() and np.abs(other.hist - st.hist).sum() <= 0.01 * st.hist.sum()
    for x, y in zip(alone.iter_samples("head_code"), together.iter_samples("head_code"), strict=True):
        for k in x:
            np.testing.assert_allclose(x[k], y[k], rtol=1e-4, atol=1e-5)


def test_hessians_are_streamed_for_gptq(calib_dir: Path):
    """X^T X of gpt's MatMul inputs: symmetric, positive on its diagonal, summed over every decode row
    and a bounded draw of each prefill's tokens; the fused graph's inputs are matched to gpt's (same
    activations) rather than stored twice."""
    from chattts_forge.calibration_data.statistics import match_tensors

    stats = CalibrationStore(calib_dir).statistics
    for st in stats.graphs["gpt"].values():
        h = st.hessian()
        np.testing.assert_allclose(h, h.transpose(0, 2, 1))
        assert 0 < st.xtx_rows <= st.rows and (np.concatenate([np.diag(b) for b in h]) > 0).all()
        if st.xtx_rows == st.rows:  # every row summed: the diagonal is the streamed mean square
            np.testing.assert_allclose(np.concatenate([np.diag(b) for b in h]), st.mean_square, rtol=1e-3)
    assert all(st.xtx is None for st in stats.graphs["gpt_fast"].values())
    matched = match_tensors(stats.graphs["gpt"], stats.graphs["gpt_fast"])
    assert set(matched) == set(stats.graphs["gpt_fast"])
    for fast, plain in matched.items():
        np.testing.assert_allclose(stats.graphs["gpt_fast"][fast].max, stats.graphs["gpt"][plain].max, rtol=1e-4)


def test_hessian_blocks_and_row_draws():
    """X^T X in diagonal blocks of HESSIAN_BLOCK channels, over the rows asked for; merges add."""
    from chattts_forge.calibration_data.statistics import HESSIAN_BLOCK

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 2 * HESSIAN_BLOCK)).astype(np.float32)
    st = TensorStats(2 * HESSIAN_BLOCK).with_hessian()
    rows = np.array([0, 3, 7])
    st.update(x, hessian_rows=rows)
    flat = x.reshape(-1, 2 * HESSIAN_BLOCK)[rows].astype(np.float64)
    full = flat.T @ flat / 3
    assert st.xtx.shape == (2, HESSIAN_BLOCK, HESSIAN_BLOCK) and st.xtx_rows == 3 and st.rows == 10
    np.testing.assert_allclose(st.hessian()[1], full[HESSIAN_BLOCK:, HESSIAN_BLOCK:], rtol=1e-4, atol=1e-5)
    other = TensorStats(2 * HESSIAN_BLOCK).with_hessian()
    other.update(x)
    st.merge(other)
    assert st.xtx_rows == 13
    with pytest.raises(ForgeError, match="with and without X"):
        st.merge(TensorStats(2 * HESSIAN_BLOCK))


def test_statistics_merge_is_exact_for_min_max_and_histograms():
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(7, 6)).astype(np.float32) * s for s in (1, 10)]
    one, merged = Statistics(), Statistics()
    for p in parts:
        one.update_graph("g", {"x": p})
    halves = [Statistics(), Statistics()]
    for h, p in zip(halves, parts, strict=True):
        h.update_graph("g", {"x": p})
        merged.merge(h)
    a, b = one.graphs["g"]["x"], merged.graphs["g"]["x"]
    assert (a.min, a.max) == (b.min, b.max)
    np.testing.assert_array_equal(a.hist, b.hist)
    np.testing.assert_allclose(a.mean_square, (np.concatenate(parts) ** 2).mean(axis=0), rtol=1e-6)
    assert a.percentile_absmax(100.0) == pytest.approx(np.abs(np.concatenate(parts)).max())
    lo, hi = one.ranges("g", ["x"], percentile=50.0)["x"]
    assert a.min < lo < 0 < hi < a.max  # clipped to the median |x| (within one bin)


def test_stratified_selection_represents_every_file():
    stems = ["a"] * 90 + ["b"] * 9 + ["c"] * 1
    picked = select_sentences(stems, 10, seed=0)
    assert len(picked) == 10 and {stems[i] for i in picked} == {"a", "b", "c"}
    assert picked == sorted(picked) and picked == select_sentences(stems, 10, seed=0)
    assert select_sentences(stems, None, seed=0) == list(range(100))
    assert parse_max_samples("all") is None and parse_max_samples("512") == 512
    with pytest.raises(ForgeError, match="max-samples"):
        parse_max_samples("some")


def test_default_is_512_stratified(tiny_artifacts):
    from chattts_forge.calibration_data.calibrate_config import DEFAULT_MAX_SAMPLES
    from chattts_forge.calibration_data.corpus import load_corpus

    corp = load_corpus("builtin:calibration")
    stems = [corp.files[i].stem for i in corp.origins]
    picked = select_sentences(stems, DEFAULT_MAX_SAMPLES, seed=0)
    assert DEFAULT_MAX_SAMPLES == 512 and len(picked) == 512
    assert {stems[i] for i in picked} == {p.stem for p in corp.files}


def test_refused_lines_are_skipped_and_counted(tiny_artifacts, tmp_path: Path):
    corpus = _corpus(tmp_path / "c", zh=ZH[:1] + ["。。。"], en=EN[:1] + ["...  ,"])
    out = calibrate(tiny_artifacts["fp32"], corpus, tmp_path / "o", **{**SMALL, "max_samples": "all"})
    m = CalibrationStore(out).manifest
    assert m["sentences"]["used"] == 2 and len(m["sentences"]["skipped"]) == 2
    nothing = _corpus(tmp_path / "n", zh=["。。。"], en=["... ,"])
    with pytest.raises(ForgeError, match="no sentence .* is speakable"):
        calibrate(tiny_artifacts["fp32"], nothing, tmp_path / "n-out", allow_one_language=True, **SMALL)
    assert not (tmp_path / "n-out").exists()


def test_bad_input_is_refused_before_any_work(calib_dir: Path, tiny_artifacts, tmp_path: Path):
    fp32 = tiny_artifacts["fp32"]
    with pytest.raises(ForgeError, match="only zh sentences"):
        calibrate(fp32, _corpus(tmp_path / "zh", zh=ZH), tmp_path / "x", **SMALL)
    calibrate(fp32, _corpus(tmp_path / "zh1", zh=ZH), tmp_path / "zh-ok", allow_one_language=True, **SMALL)
    other = tmp_path / "other"
    shutil.copytree(calib_dir, other)
    m = json.loads((other / "manifest.json").read_text())
    m["artifact"]["gpt_sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ForgeError, match="another artifact"):
        calibrate(fp32, "builtin:calibration", tmp_path / "x", merge=[other], **SMALL)
    version = tmp_path / "version"
    shutil.copytree(calib_dir, version)
    m = json.loads((version / "manifest.json").read_text())
    name = next(iter(m["corpus"]["file_sha256"]))
    m["corpus"]["file_sha256"][name] = "0" * 64
    (version / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ForgeError, match="another version of corpus file"):
        calibrate(fp32, "builtin:calibration", tmp_path / "x", merge=[version], **SMALL)
    m["corpus"]["name"] = "v0:calibration"
    (version / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ForgeError, match="corpus version v0"):
        calibrate(fp32, "builtin:calibration", tmp_path / "x", merge=[version], **SMALL)
    with pytest.raises(ForgeError, match="head_steps_per_batch"):
        calibrate(fp32, "builtin:calibration", tmp_path / "x", merge=[calib_dir], **{**SMALL, "head_steps": 5})
    old = tmp_path / "old"
    shutil.copytree(calib_dir, old)
    m = json.loads((old / "manifest.json").read_text())
    m["schema"] = "chattts-forge/calibration/1"
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ForgeError, match="re-run `chattts-forge calibrate`"):
        CalibrationStore(old)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("content", "message"), [(b"", "is empty"), (b"\xc3\x28 broken\n", "not UTF-8")])
def test_cli_bad_corpus_is_a_clear_error(tiny_artifacts, tmp_path: Path, content: bytes, message: str):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(content)
    res = CliRunner().invoke(main, ["calibrate", "--artifact", str(tiny_artifacts["fp32"]), "--corpus",
                                    str(corpus), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert message in res.output and "error:" in res.output
    assert not (tmp_path / "o").exists()


def test_cli_missing_corpus(tiny_artifacts, tmp_path: Path):
    res = CliRunner().invoke(main, ["calibrate", "--artifact", str(tiny_artifacts["fp32"]), "--corpus",
                                    str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_bad_settings(tiny_artifacts, tmp_path: Path):
    with pytest.raises(ForgeError, match="max-samples"):
        calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "x", max_samples=0)
    with pytest.raises(ForgeError, match="does not exist"):
        calibrate(tmp_path / "no-artifact", "builtin:calibration", tmp_path / "x")
    with pytest.raises(ForgeError, match="batch-size"):
        calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "x", batch_size=0)
    with pytest.raises(ForgeError, match="unexpected keyword"):
        calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "x", batchsize=2)
    assert not (tmp_path / "x").exists()


def test_nonfinite_rows_are_left_out_and_counted(tmp_path: Path):
    """An overflowing activation row (inf/NaN) is kept out of min/max, histograms and sums, and counted."""
    x = np.ones((4, 3), np.float32)
    x[1, 2], x[3, 0] = np.inf, np.nan
    stats = Statistics()
    stats.hessian_graphs = {"g"}
    stats.update_graph("g", {"t": x}, hessian_rows=np.array([0, 1, 2]))
    st = stats.graphs["g"]["t"]
    assert (st.min, st.max, st.rows, st.nonfinite_rows, st.xtx_rows) == (1.0, 1.0, 2, 2, 2)
    assert int(st.hist.sum()) == 6 and np.isfinite(st.hessian()).all()
    stats.save(tmp_path / "s.npz")
    assert Statistics.load(tmp_path / "s.npz").nonfinite_rows() == {"g": 2}
