"""Issue 23 (parts 4-7): paths confined to their folder, bounded parsers, one request failing alone in
the scheduler, and crash-safe writes (folder fsync, folder replacement a kill cannot lose, unique
temporary names)."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pybase16384 as b14
import pytest

import chattts_forge.fsutil as fsutil
from chattts_forge.artifact import ArtifactMeta
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import (
    atomic_output_dir,
    clean_stale_partials,
    recover_replaced_dirs,
    resolve_inside,
)
from chattts_forge.runtime import chattts_speaker

# ---- 4. paths stay inside their folder --------------------------------------------------------


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.onnx", "sub/../../outside.onnx", "", "a\0b"])
def test_resolve_inside_refuses_paths_out_of_the_folder(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ForgeError) as e:
        resolve_inside(tmp_path, bad, file="x/artifact.json", field="components.gpt.file")
    msg = str(e.value)
    assert "\n" not in msg and "x/artifact.json" in msg and "components.gpt.file" in msg


def test_resolve_inside_refuses_a_symlink_that_points_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"x")
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "gpt.onnx").symlink_to(outside)
    (folder / "sub").symlink_to(tmp_path)
    for rel in ("gpt.onnx", "sub/outside.onnx"):
        with pytest.raises(ForgeError, match="outside"):
            resolve_inside(folder, rel, file="artifact.json", field="files.tokenizer")
    (folder / "real.onnx").write_bytes(b"y")
    (folder / "alias.onnx").symlink_to(folder / "real.onnx")  # a link that stays inside is fine
    assert resolve_inside(folder, "alias.onnx", file="f", field="g") == folder / "alias.onnx"
    assert resolve_inside(folder, "deep/er/x.onnx", file="f", field="g") == folder / "deep/er/x.onnx"


def _meta_doc(**component: object) -> dict:
    return {"schema": "chattts-forge/artifact/1", "variant": "fp32",
            "components": {"gpt": {"file": "gpt.onnx", **component}}, "files": {"tokenizer": "tokenizer.json"}}


@pytest.mark.parametrize("field,value", [("file", "/abs/gpt.onnx"), ("file", "../gpt.onnx"),
                                         ("external_data", {"file": "../gpt.onnx.data"})])
def test_artifact_component_paths_are_confined(tmp_path: Path, field: str, value: object) -> None:
    meta = ArtifactMeta.from_dict(_meta_doc(**{field: value}), where=str(tmp_path / "artifact.json"))
    with pytest.raises(ForgeError, match=r"artifact\.json: components\.gpt\.(file|external_data\.file)"):
        meta.component_path(tmp_path, "gpt")
        meta.external_data_path(tmp_path, "gpt")


def test_artifact_support_files_are_confined(tmp_path: Path) -> None:
    doc = _meta_doc()
    doc["files"]["tokenizer"] = "../../etc/tokenizer.json"
    meta = ArtifactMeta.from_dict(doc, where="artifact.json")
    with pytest.raises(ForgeError, match=r"files\.tokenizer climbs out"):
        meta.support_path(tmp_path, "tokenizer")


def test_the_runtime_refuses_an_artifact_whose_files_point_out(tiny_artifacts, tmp_path: Path) -> None:
    from chattts_forge.runtime.loaded_artifact import LoadedArtifact

    art = tmp_path / "fp32"
    shutil.copytree(tiny_artifacts["fp32"], art)
    doc = json.loads((art / "artifact.json").read_text())
    shutil.copy(art / "tokenizer.json", tmp_path / "stolen.json")
    doc["files"]["tokenizer"] = "../stolen.json"
    (art / "artifact.json").write_text(json.dumps(doc))
    with pytest.raises(ForgeError, match=r"files\.tokenizer climbs out") as e:
        LoadedArtifact(art)
    assert "\n" not in str(e.value)
    doc["files"]["tokenizer"] = "tokenizer.json"
    doc["components"]["embed"]["external_data"]["file"] = str(tmp_path / "embed.onnx.data")
    (art / "artifact.json").write_text(json.dumps(doc))
    with pytest.raises(ForgeError, match=r"components\.embed\.external_data\.file is an absolute path"):
        LoadedArtifact(art)


def test_routing_variants_and_manifest_paths_are_confined(tmp_path: Path) -> None:
    from chattts_forge.publish.verify import verify_variant
    from chattts_forge.runtime.router import ROUTING_SCHEMA, routing_problems

    table = {"schema": ROUTING_SCHEMA, "fallback": "..", "variants": {},
             "buckets": [{"name": "all", "min_chars": 1, "max_chars": None, "variant": "/tmp"}]}
    problems = routing_problems(table, tmp_path)
    assert any("buckets['all'].variant must be a variant name, not a path" in p for p in problems)
    assert any("fallback climbs out" in p for p in problems)
    (tmp_path / "link").symlink_to(tmp_path.parent)
    table["fallback"] = "link"
    assert any("fallback ('link') resolves to" in p for p in routing_problems(table, tmp_path))
    vdir = tmp_path / "m" / "v1" / "fp32"
    vdir.mkdir(parents=True)
    (tmp_path / "secret").write_bytes(b"s")
    manifest = {"schema": "chattts-forge/manifest/1", "model": "m", "version": "v1", "variant": "fp32",
                "created_at": "now", "gate": {"passed": True}, "precision": {},
                "source_checkpoint": {"kind": "synthetic", "hashes": {}},
                "files": [{"path": "../../../secret", "bytes": 1, "sha256": "0" * 64}]}
    (vdir / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_variant(vdir)
    assert any("files['../../../secret'].path climbs out" in p for p in problems)


def test_calibration_shards_are_confined(tmp_path: Path) -> None:
    from chattts_forge.calibration_data.store import SCHEMA, CalibrationStore

    (tmp_path / "calib").mkdir()
    np.savez(tmp_path / "shard.npz", **{"000000.x": np.zeros(2)})
    (tmp_path / "calib" / "manifest.json").write_text(json.dumps(
        {"schema": SCHEMA, "components": {"gpt": {"samples": 1, "shards": ["../shard.npz"]}}}))
    with pytest.raises(ForgeError, match=r"components\.gpt\.shards\[0\] climbs out"):
        CalibrationStore(tmp_path / "calib")


# ---- 5. bounded parsers --------------------------------------------------------------------------


def _bomb(raw_bytes: int, head: bytes = b"") -> str:
    return b14.encode_to_string(head + lzma.compress(bytes(raw_bytes), format=lzma.FORMAT_RAW, filters=chattts_speaker._LZMA_FILTERS))


def test_speaker_strings_decompress_within_their_bound() -> None:
    vec = np.random.default_rng(0).standard_normal(768).astype(np.float16)
    assert chattts_speaker.speaker_vector(chattts_speaker.encode_speaker(vec), 768).shape == (768,)  # a real speaker still decodes
    codes = np.random.default_rng(1).integers(0, 625, (4, 300))
    assert (chattts_speaker.decode_prompt(chattts_speaker.encode_prompt(codes), max_codes=4 * 4096) == codes).all()
    small_bomb = _bomb(8 << 20)  # 8 MiB of zeros: a ~2 KB string
    assert len(small_bomb) < chattts_speaker.max_encoded_chars(2 * chattts_speaker.DEFAULT_MAX_SPEAKER_VALUES)  # passes the length check
    with pytest.raises(ForgeError, match="decompresses to more than 32768 bytes"):
        chattts_speaker.decode_speaker(small_bomb)
    with pytest.raises(ForgeError, match="decompresses to more than 32768 bytes"):
        chattts_speaker.speaker_vector(small_bomb, 768)
    with pytest.raises(ForgeError, match="speaker embedding has 768 values, the model's hidden size is 64"):
        chattts_speaker.speaker_vector(chattts_speaker.encode_speaker(vec), 64)  # another model's speaker: named by its width
    with pytest.raises(ForgeError, match="header announces 4 x 65535 codes"):
        chattts_speaker.decode_prompt(_bomb(8 << 20, np.array([4, 65535], "<u2").tobytes()), max_codes=4 * 4096)
    with pytest.raises(ForgeError, match="decompresses to more than 800 bytes"):  # the header lies
        chattts_speaker.decode_prompt(_bomb(8 << 20, np.array([4, 100], "<u2").tobytes()), max_codes=4 * 4096)
    with pytest.raises(ForgeError, match="1048576 characters long"):
        chattts_speaker.decode_speaker("一" * (1 << 20))
    with pytest.raises(ForgeError, match="must be a string"):
        chattts_speaker.decode_speaker(b"bytes")  # type: ignore[arg-type]


def test_a_megabyte_speaker_string_costs_no_memory() -> None:
    """The bound is a mechanism (refused before decoding / when the limit is reached), so the margin is
    independent of the CPU: an unbounded decode of the second string grows RSS by 256 MiB."""
    code = """
import resource, sys, lzma
import numpy as np, pybase16384 as b14
from chattts_forge.errors import ForgeError
from chattts_forge.runtime import chattts_speaker
# A 1 MB string (refused by its length) and 256 MiB of zeros in a ~22,000-character string, short
# enough to pass the length check: only the decompression limit stands between it and 256 MiB.
raw = lzma.compress(bytes(256 << 20), format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "preset": 1}])
bombs = ["一" * (1 << 20)] + [b14.encode_to_string(head + raw) for head in (b"", np.array([4, 100], "<u2").tobytes())]
assert all(len(b) < chattts_speaker.max_encoded_chars(2 * chattts_speaker.DEFAULT_MAX_SPEAKER_VALUES) for b in bombs[1:])
del raw
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
refused = 0
for s in bombs:
    for decode in (lambda s: chattts_speaker.speaker_vector(s, 768), lambda s: chattts_speaker.decode_prompt(s, 4 * 4096), chattts_speaker.decode_speaker):
        try:
            decode(s)
        except ForgeError as e:
            refused += "\\n" not in str(e)
print(refused, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    refused, grown_mb = out.stdout.split()
    assert int(refused) == 9
    assert float(grown_mb) < 50, out.stdout


def test_text_and_recording_lengths_are_bounded_before_work(tiny_artifacts) -> None:
    from chattts_forge.runtime.pipeline import Pipeline, SynthParams

    pipe = Pipeline(tiny_artifacts["fp32"], threads=1)
    limit = pipe.max_text_chars()
    with pytest.raises(ForgeError, match=f"more than the {limit} this model takes"):
        pipe.normalize("a" * (limit + 1), SynthParams(text_normalization=False))
    with pytest.raises(ForgeError, match="more than the 4096 this model takes"):
        pipe.normalize("a" * 4097)
    with pytest.raises(ForgeError, match="more than the"):
        pipe.synthesize(["你好。" * (pipe.max_text_chars(True) // 3 + 1)], SynthParams(split_sentences=True))
    longest = pipe.max_recording_samples()
    with pytest.raises(ForgeError, match=f"at most {longest}"):
        pipe.check_recording(np.zeros(longest + 1, np.float32))
    assert pipe.check_recording(np.zeros(pipe.dims.n_fft, np.float32)).dtype == np.float32


def _cache_bytes() -> bytes:
    from chattts_forge.runtime.phrase_cache import CachedPhrase, encode_cache

    phrase = CachedPhrase(mel=np.ones((4, 3), np.float32), codes=np.arange(8).reshape(2, 4))
    return encode_cache({"seed": 1}, {"fp32": "a" * 64}, [("你好", "fp32", "a" * 64, phrase)])


def _with_header(header: object, raw_len: int | None = None) -> bytes:
    """A phrase cache file with this header and a valid trailer (what a crafted file looks like)."""
    import hashlib

    from chattts_forge.runtime.phrase_cache import _LEN, MAGIC

    head = json.dumps(header).encode()
    body = MAGIC + _LEN.pack(len(head) if raw_len is None else raw_len) + head + b"\0" * 56
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize("header,raw_len", [
    ([1, 2], None), ({"schema": "chattts-forge/phrase-cache/2"}, None),
    ({"schema": "chattts-forge/phrase-cache/2", "knobs": {}, "artifacts": [], "entries": [{"key": "k"}]}, None),
    ({"schema": "chattts-forge/phrase-cache/2", "knobs": {}, "artifacts": [],
      "entries": [{"key": "k", "text": "t", "variant": "v", "payload_sha256": "a" * 64, "sha256": "b" * 64,
                   "offset": 0, "n_mels": 10**9, "frames": 10**9, "steps": 0, "num_vq": 0}]}, None),
    ({"schema": "chattts-forge/phrase-cache/2", "knobs": {}, "artifacts": [],
      "entries": [{"key": "k", "text": "t", "spoken": 5, "variant": "v", "payload_sha256": "a" * 64,
                   "sha256": "b" * 64, "offset": 0, "n_mels": 0, "frames": 0, "steps": 0, "num_vq": 0}]}, None),
    ({"schema": "chattts-forge/phrase-cache/2"}, 1 << 40),
    ({"schema": "chattts-forge/phrase-cache/1", "knobs": {}, "artifacts": [], "entries": []}, None),  # schema 1
])
def test_a_crafted_phrase_cache_with_a_valid_trailer_is_one_line(tmp_path: Path, header: object, raw_len) -> None:
    from chattts_forge.runtime.phrase_cache import PhraseCache

    good = tmp_path / "good.bin"
    good.write_bytes(_cache_bytes())
    assert len(PhraseCache(good)) == 1
    bad = tmp_path / "bad.bin"
    bad.write_bytes(_with_header(header, raw_len))
    with pytest.raises(ForgeError) as e:
        PhraseCache(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_gate_files_that_are_not_text_or_not_files(tmp_path: Path) -> None:
    from chattts_forge.evaluate.gate import load_gate

    (tmp_path / "latin1.toml").write_bytes('[fidelity]\nmin_code_agreement = 0.5 # caf\xe9\n'.encode("latin-1"))
    (tmp_path / "folder.toml").mkdir()
    (tmp_path / "buckets.toml").write_text('buckets = [1, 2]\n[fidelity]\nmin_code_agreement = 0.5\n')
    (tmp_path / "edges.toml").write_text('[fidelity]\nmin_code_agreement = 0.5\n[buckets]\nedges = 5\n')
    for name, what in (("latin1", "not UTF-8"), ("folder", "is a folder"), ("buckets", "must be a .buckets. section"),
                       ("edges", "must be lists")):
        with pytest.raises(ForgeError, match=what) as e:
            load_gate(tmp_path / f"{name}.toml")
        assert "\n" not in str(e.value)


def test_cli_gate_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from chattts_forge.cli import main

    (tmp_path / "g.toml").mkdir()
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe[fidelity]\n")
    for gate, what in (("g.toml", "is a folder"), ("bin.toml", "not UTF-8")):
        res = CliRunner().invoke(main, ["evaluate", "--artifact", str(tmp_path), "--reference", str(tmp_path),
                                        "--corpus", "builtin:evaluation", "--out", str(tmp_path / "report"),
                                        "--gate", str(tmp_path / gate)])
        assert res.exit_code == 2, res.output
        assert what in res.output and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "report").exists()  # nothing written


# ---- 6. the scheduler: one request fails alone ---------------------------------------------------


@pytest.fixture(scope="module")
def fast_pipe(tiny_artifacts):
    from chattts_forge.runtime.pipeline import Pipeline

    return Pipeline(tiny_artifacts["fp32"], threads=1, engine="fast")


def _p(seed: object, **code: object):
    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams

    return SynthParams(code=InferCodeParams(**{"temperature": 1e-9, "seed": seed, "max_new_token": 24, **code}))


@pytest.mark.parametrize("bad", [{"top_k": "20"}, {"top_p": "0.7"}, {"temperature": "hot"}, {"temperature": []},
                                 {"max_new_token": 2.5}, {"max_new_token": 10**9}, {"seed": -1}, {"seed": True},
                                 {"ensure_non_empty": "yes"}, {"spk_emb": 5}, {"stream_batch": 0},
                                 {"repetition_penalty": float("nan")}])
def test_badly_typed_parameters_are_refused_at_submit(fast_pipe, bad: dict) -> None:
    from chattts_forge.runtime.scheduler import Scheduler

    sched = Scheduler(fast_pipe, max_batch=2, max_queue=4)
    with pytest.raises(ForgeError) as e:
        sched.submit("Hello there.", _p(**{"seed": 0, **bad}))
    assert "\n" not in str(e.value) and f"params.code.{next(iter(bad))}" in str(e.value)
    with pytest.raises(ForgeError, match="text must be a string"):
        sched.submit(b"bytes", _p(0))  # type: ignore[arg-type]
    assert sched.waiting == 0  # nothing was queued


@pytest.mark.parametrize("threaded", [False, True], ids=["step", "worker-thread"])
def test_any_exception_in_one_request_fails_it_alone(fast_pipe, monkeypatch, threaded: bool) -> None:
    """A bug (a non-ForgeError) while admitting one request and another while sampling a second one:
    each fails alone with a one-line error, their handles finish, the others finish as if alone."""
    from chattts_forge.runtime import scheduler as sched_mod
    from chattts_forge.runtime.scheduler import Scheduler

    texts = ["Hello there, how are you today?", "Short one.", "你好，欢迎使用。", "Another sentence here."]
    alone = {i: fast_pipe.synthesize([texts[i]], _p(i))[0] for i in (0, 3)}
    real_sampling, real_sample = fast_pipe.code_sampling, Scheduler._sample

    def sampling(params):
        if params.seed == 1:
            raise TypeError("'<' not supported between instances of 'str' and 'int'")
        return real_sampling(params)

    def sample(self, act, hidden, logits=None):
        if act.params.code.seed == 2 and act.steps == 3:
            raise KeyError("boom")
        return real_sample(self, act, hidden, logits)

    monkeypatch.setattr(fast_pipe, "code_sampling", sampling)
    monkeypatch.setattr(sched_mod.Scheduler, "_sample", sample)
    sched = Scheduler(fast_pipe, max_batch=4, max_queue=8)
    handles = [sched.submit(t, _p(i)) for i, t in enumerate(texts)]
    if threaded:
        sched.start()
        assert all(h.wait(120) for h in handles)
        sched.close()
    else:
        sched.run_until_idle()
    assert all(h.done() for h in handles)
    for i, what in ((1, "TypeError"), (2, "KeyError")):
        with pytest.raises(ForgeError, match=f"request {handles[i].id} failed .{what}") as e:
            handles[i].result()
        assert "\n" not in str(e.value)
    for i in (0, 3):
        np.testing.assert_array_equal(handles[i].result().codes, alone[i].codes)
    assert not [t for t in threading.enumerate() if t.name.startswith("forge-")]


# ---- 7. crash safety -----------------------------------------------------------------------------


def test_atomic_write_bytes_fsyncs_the_folder_after_the_rename(tmp_path: Path, monkeypatch) -> None:
    events: list[str] = []
    real_replace, real_fsync_dir = os.replace, fsutil.fsync_dir
    monkeypatch.setattr(fsutil.os, "replace", lambda a, b: (events.append("rename"), real_replace(a, b))[1])
    monkeypatch.setattr(fsutil, "fsync_dir", lambda p: (events.append(f"fsync {Path(p).name}"), real_fsync_dir(p))[1])
    fsutil.atomic_write_bytes(tmp_path / "out" / "f.json", b"{}")
    assert events == ["rename", "fsync out"]
    assert (tmp_path / "out" / "f.json").read_bytes() == b"{}"


def _fill(folder: Path, text: str) -> None:
    (folder / "data.txt").write_text(text)


def test_folder_replacement_by_exchange_leaves_no_window(tmp_path: Path) -> None:
    final = tmp_path / "fp32"
    with atomic_output_dir(final) as tmp:
        _fill(tmp, "one")
    with atomic_output_dir(final) as tmp:
        _fill(tmp, "two")
    assert (final / "data.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp32"]  # no .partial / .old left


@pytest.mark.parametrize("cleaner", ["atomic_output_dir", "clean_stale_partials", "driver_sweep"])
def test_a_kill_between_the_two_renames_is_recovered_not_deleted(tmp_path: Path, monkeypatch, cleaner: str) -> None:
    """Without an atomic exchange the replacement is two renames; a kill between them leaves only
    `.fp32.*.old`. The next start renames it back (the last complete fp32), it never deletes it."""
    final = tmp_path / "fp32"
    with atomic_output_dir(final) as tmp:
        _fill(tmp, "one")
    monkeypatch.setattr(fsutil, "exchange_paths", lambda a, b: False)
    real_replace, calls = os.replace, []

    def killed_replace(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:  # the kill: after final -> .old, before .partial -> final
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", killed_replace)
    with pytest.raises(KeyboardInterrupt), atomic_output_dir(final) as tmp:
        _fill(tmp, "two")
    monkeypatch.setattr(fsutil.os, "replace", real_replace)
    assert calls[0][0] == "fp32" and calls[0][1].endswith(".old")
    assert not final.exists() and [p.name for p in tmp_path.iterdir()] == [calls[0][1]]
    if cleaner == "atomic_output_dir":
        with atomic_output_dir(tmp_path / "other") as tmp:
            _fill(tmp, "x")
    elif cleaner == "clean_stale_partials":
        clean_stale_partials(tmp_path)
    else:
        from chattts_forge.driver.lock import sweep_leftovers

        sweep_leftovers(tmp_path)
    assert (final / "data.txt").read_text() == "one"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert recover_replaced_dirs(tmp_path) == []


def test_a_leftover_old_beside_its_folder_is_swept(tmp_path: Path) -> None:
    (tmp_path / "fp32").mkdir()
    (tmp_path / ".fp32.abc123_x.old").mkdir()
    assert recover_replaced_dirs(tmp_path) == []
    assert [p.name for p in clean_stale_partials(tmp_path)] == [".fp32.abc123_x.old"]
    assert (tmp_path / "fp32").is_dir()


def test_graph_storage_writes_unique_temp_names_and_fsyncs(tmp_path: Path, monkeypatch) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import chattts_forge.graph_storage as gs

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model = helper.make_model(graph)
    renamed, synced = [], []
    real_replace, real_fsync, real_fsync_dir = os.replace, os.fsync, gs.fsync_dir
    monkeypatch.setattr(gs.os, "replace", lambda a, b: (renamed.append(Path(a).name), real_replace(a, b))[1])
    monkeypatch.setattr(gs.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(gs, "fsync_dir", lambda p: (synced.append(str(p)), real_fsync_dir(p))[1])
    for _ in range(2):
        gs.save_with_external_data(model, tmp_path / "m.onnx")
    assert len(renamed) == 4 and len(set(renamed)) == 4  # no fixed temporary name is ever reused
    assert all(n.startswith((".m.onnx.", ".m.onnx.data.")) and n.endswith(".tmp") for n in renamed)
    # Both files (and, inside fsync_dir, the folder's fd) each time, and the folder after the renames.
    assert synced.count(str(tmp_path)) == 2 and sum(isinstance(x, int) for x in synced) >= 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.initializer[0].data_location == 1


def test_compat_refuses_badly_typed_chattts_params(tiny_artifacts) -> None:
    from chattts_forge import compat

    chat = compat.Chat()
    assert chat.load(source="custom", custom_path=tiny_artifacts["fp32"], device="cpu", threads=1)
    for bad, name in (({"top_K": "20"}, "params_infer_code.top_K"), ({"manual_seed": -3}, "params_infer_code.manual_seed"),
                      ({"stream_speed": "fast"}, "params_infer_code.stream_speed")):
        with pytest.raises(ForgeError, match=name) as e:
            chat.infer("Hello there.", skip_refine_text=True, params_infer_code=compat.Chat.InferCodeParams(**bad))
        assert "\n" not in str(e.value)
    with pytest.raises(ForgeError, match="params_refine_text.top_P"):
        chat.infer("Hello there.", params_refine_text=compat.Chat.RefineTextParams(top_P=[0.7]))


def test_recording_files_and_speaker_files_are_bounded(tmp_path: Path) -> None:
    import soundfile as sf

    from chattts_forge.runtime.audio import read_wav

    sf.write(tmp_path / "long.wav", np.zeros(5000, np.float32), 24000)
    assert read_wav(tmp_path / "long.wav", 24000, max_samples=5000).shape == (5000,)
    with pytest.raises(ForgeError, match="has 5000 samples, more than the 4999"):
        read_wav(tmp_path / "long.wav", 24000, "--speaker-audio", max_samples=4999)
    (tmp_path / "junk.wav").write_bytes(b"RIFF" + bytes(40))
    with pytest.raises(ForgeError, match="not a readable audio file"):
        read_wav(tmp_path / "junk.wav", 24000, max_samples=10)


def test_synth_speaker_file_that_is_not_text_is_one_line(tiny_artifacts, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from chattts_forge.cli import main

    (tmp_path / "spk.txt").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "huge.txt").write_bytes(b"a" * (1 << 20))
    for name, what in (("spk.txt", "not a readable UTF-8 text file"), ("huge.txt", "a speaker string is far shorter")):
        res = CliRunner().invoke(main, ["synth", "--artifact", str(tiny_artifacts["fp32"]), "--text", "Hello.",
                                        "--speaker", str(tmp_path / name), "--out", str(tmp_path / "a.wav")])
        assert res.exit_code == 2 and what in res.output and "Traceback" not in res.output, res.output
        assert not (tmp_path / "a.wav").exists()
