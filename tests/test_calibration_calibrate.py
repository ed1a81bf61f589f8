"""`calibrate`: recorded inputs of every quantizable graph, deterministic, within the disk budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from chattts_forge.calibration_data.calibrate import calibrate
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.cli import main
from chattts_forge.errors import ForgeError

SMALL = {"max_samples": 3, "max_new_token": 12, "decode_positions": 3, "head_steps": 4, "threads": 1}


@pytest.fixture(scope="module")
def calib_dir(tiny_artifacts, tmp_path_factory) -> Path:
    return calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path_factory.mktemp("c") / "calib", **SMALL)


def test_records_every_quantizable_graph(calib_dir: Path, tiny_artifacts):
    store = CalibrationStore(calib_dir)
    m = store.manifest
    assert m["sentences"]["used"] == 3
    assert m["gpt_samples"]["prefill"] == 3 and m["gpt_samples"]["decode"] >= 3
    assert m["gpt_samples"]["past_length_max"] > 0
    for comp in ("gpt", "head_code", "decoder", "dvae"):
        assert store.count(comp) > 0, comp
        assert all((calib_dir / s).is_file() for s in m["components"][comp]["shards"])
    assert m["corpus"]["sha256"] and m["corpus"]["name"].endswith(":calibration")
    assert m["artifact"]["gpt_sha256"] == json.loads((tiny_artifacts["fp32"] / "artifact.json").read_text())[
        "components"]["gpt"]["sha256"]
    gpt = list(store.iter_samples("gpt"))
    assert len(gpt) == store.count("gpt")
    names = {"inputs_embeds", "attention_mask", "position_ids", "past_key_values.0.key"}
    assert names <= set(gpt[0]) and gpt[0]["past_key_values.0.key"].dtype == np.float32
    decode = [s for s in gpt if s["past_key_values.0.key"].shape[2] > 0]
    assert decode and all(s["inputs_embeds"].shape[1] == 1 for s in decode)
    assert next(store.iter_samples("dvae"))["codes"].dtype == np.int64


def test_deterministic_for_a_seed(calib_dir: Path, tiny_artifacts, tmp_path: Path):
    again = calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "again", **SMALL)
    a, b = CalibrationStore(calib_dir), CalibrationStore(again)
    assert a.count("gpt") == b.count("gpt")
    for sa, sb in zip(a.iter_samples("gpt"), b.iter_samples("gpt"), strict=True):
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k])


def test_disk_budget_is_respected(tiny_artifacts, tmp_path: Path):
    out = calibrate(tiny_artifacts["fp32"], "builtin:calibration", tmp_path / "small", disk_budget_mb=0.02,
                    **{**SMALL, "max_samples": 4})
    m = CalibrationStore(out).manifest
    assert m["truncated_by_budget"] is True
    assert 0 < m["bytes_total"] <= m["disk_budget_bytes"]


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
