"""What users write reaches the model spoken: the `normalize` command, segments of long text, the
server's report of removed characters and its long-input answers (issue 48)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from test_serve import STEPS, running, version  # noqa: F401 - version: the fixture

from chattts_forge.cli import main
from chattts_forge.runtime.segments import SEGMENT_SECONDS, split_segments, spoken_seconds

LONG_ZH = "您的订单号是 20261206，金额 ¥199.50，请在 3 点前确认。" * 108
LONG_EN = "Call 555-0123 at 3:30 pm on Dec 8, 2026, and pay $19.99 before noon. " * 55


def normalize_cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["normalize", *args])
    return res.exit_code, res.stdout, res.stderr


def test_normalize_prints_only_the_spoken_segments_and_lists_removed_characters_on_stderr() -> None:
    code, out, err = normalize_cli("--text", "转人工请按 0 😀")
    assert code == 0
    assert out.strip().splitlines() == [out.strip()] and "零" in out and "0" not in out
    assert "😀" in err and "😀" not in out


def test_normalize_off_is_chattts_own_front_end() -> None:
    code, out, _ = normalize_cli("--no-text-normalization", "--text", "What is 2+2?")
    assert code == 0 and out.strip() == "What is"


@pytest.mark.parametrize("text", [LONG_ZH, LONG_EN])
def test_normalize_of_a_long_text_prints_bounded_segments_that_are_its_whole_spoken_text(tmp_path: Path,
                                                                                         text: str) -> None:
    assert 3500 < len(text) <= 4096
    f = tmp_path / "long.txt"
    f.write_text(text, encoding="utf-8")
    code, out, _ = normalize_cli("--file", str(f))
    segments = out.splitlines()
    assert code == 0 and len(segments) > 5
    assert all(spoken_seconds(s) <= SEGMENT_SECONDS for s in segments)
    assert not any(c.isdigit() or c in "$¥" for c in out)
    _, whole, _ = normalize_cli("--file", str(f))
    assert "".join(segments).replace(" ", "") == whole.replace("\n", "").replace(" ", "")


@pytest.mark.parametrize("args,message", [([], "exactly one of --text or --file"),
                                          (["--text", ""], "empty text"),
                                          (["--file", "/nonexistent/x.txt"], "does not exist"),
                                          (["--text", "x" * 5000], "more than the 4096")])
def test_normalize_bad_input_is_one_line_and_exit_nonzero(args: list[str], message: str) -> None:
    code, out, err = normalize_cli(*args)
    assert code != 0 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_segments_cut_at_sentence_ends_first_and_keep_tags_whole() -> None:
    text = "第一句话很长很长。" * 20 + "[uv_break]" + "第二段，" * 40
    parts = split_segments(text, 6.0)
    assert all(spoken_seconds(p) <= 6.0 for p in parts)
    assert sum(p.count("[uv_break]") for p in parts) == 1
    assert "".join(parts) == text.replace(" ", "")


def test_server_reports_removed_characters_and_speaks_a_long_input_in_segments(version: Path) -> None:  # noqa: F811
    with running(version, max_batch=4, max_queue=16) as srv:
        body = {"input": "转人工请按 0 😀", "voice": "alloy", "response_format": "wav", "stream": False, "refine": False,
                "max_new_token": STEPS}
        r = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200
        assert urllib.parse.unquote(r.headers["X-Forge-Removed"]) == "😀"
        assert srv.metric("forge_text_removed_chars_total") >= 1
        long = "请在 3 点前确认订单。" * 30
        whole = httpx.post(srv.url + "/v1/audio/speech", timeout=300,
                           json={**body, "input": long, "response_format": "pcm"})
        assert whole.status_code == 200 and int(whole.headers["X-Forge-Segments"]) > 1
        streamed = httpx.post(srv.url + "/v1/audio/speech", timeout=300,
                              json={**body, "input": long, "response_format": "pcm", "stream": True})
        assert streamed.status_code == 200
        a = np.frombuffer(whole.content, "<i2")
        b = np.frombuffer(streamed.content, "<i2")
        assert len(a) == len(b) > 0
        off = httpx.post(srv.url + "/v1/audio/speech", timeout=120,
                         json={**body, "input": "2+2?", "normalize": False})
        assert off.status_code == 400 and off.json()["error"]["param"] == "input"


@pytest.mark.parametrize("text", [LONG_ZH, LONG_EN, ("我们明天 meeting 在 3 点，please confirm! 温度 -5°C。What is 2+2?\n" * 60)])
def test_segments_normalised_chunk_by_chunk_are_the_whole_texts_spoken_form(text: str) -> None:
    """A long text is normalised a written chunk at a time (its stream starts sooner); joined, its
    segments are the spoken form of the text normalised whole, whitespace aside: nothing lost at a cut."""
    import re

    from chattts_forge.runtime.pipeline import SynthParams
    from chattts_forge.runtime.textfront import TextFront

    front = TextFront.without_artifact()
    segments, _ = front.segments(text, SynthParams())
    whole = front.spoken(text, SynthParams()).text
    assert len(segments) > 1
    assert re.sub(r"\s+", "", "".join(segments)) == re.sub(r"\s+", "", whole)


def test_a_segment_at_the_default_cap_is_a_cut_only_on_a_real_checkpoint(version: Path) -> None:  # noqa: F811
    """What the server re-generates in halves (then refuses with 400 `param: input`): a row that reached
    the default 2,048 steps on a real checkpoint. A cap the request set, a forced length and a synthetic
    checkpoint's rows (random weights never end) are not cuts."""
    from dataclasses import replace
    from types import SimpleNamespace

    from chattts_forge.runtime.pipeline import InferCodeParams, SynthParams
    from chattts_forge.runtime.serve.engine import Prepared

    with running(version, max_batch=4, max_queue=16) as srv:
        current = srv.state.current
        assert current is not None
        variant = next(iter(current.pipes))
        prep = Prepared(variant, "第一句话，第二句话。", SynthParams(code=InferCodeParams(max_new_token=2048)))
        full = SimpleNamespace(codes=np.zeros((2048, 4), np.int64))
        ended = SimpleNamespace(codes=np.zeros((300, 4), np.int64))
        assert not current.hit_cap(prep, full)  # synthetic: random weights never end a row
        object.__setattr__(current.pipes[variant].artifact.meta, "source", {"kind": "real"})
        assert current.hit_cap(prep, full) and not current.hit_cap(prep, ended)
        asked = replace(prep, params=SynthParams(code=InferCodeParams(max_new_token=300)))
        assert not current.hit_cap(asked, ended)
        forced = replace(prep, params=SynthParams(code=InferCodeParams(max_new_token=2048, min_new_token=2048)))
        assert not current.hit_cap(forced, full)
        off = replace(prep, params=SynthParams(code=InferCodeParams(max_new_token=2048), text_normalization=False))
        assert not current.hit_cap(off, full)  # ChatTTS's own behaviour: as ChatTTS, cut
