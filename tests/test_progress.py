"""Progress reaches non-interactive logs: done/total, rate and ETA on a heartbeat, and the driver says
a step is still running when it has gone quiet."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from chattts_forge.driver.steplog import run_stage
from chattts_forge.progress import Progress, format_duration, progress_mode, track


def test_mode_follows_the_terminal_and_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATTTS_FORGE_PROGRESS", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert progress_mode() == "log"
    assert progress_mode(False) == "off"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert progress_mode() == "bar"
    monkeypatch.setenv("CHATTTS_FORGE_PROGRESS", "log")
    assert progress_mode() == "log"


def test_heartbeat_logs_done_total_rate_and_eta(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CHATTTS_FORGE_PROGRESS", "log")
    caplog.set_level(logging.INFO, logger="chattts_forge.progress")
    with Progress(10, "work", "item", interval=0.05) as bar:
        bar.update(4)
        bar.set_postfix_str("extra 1")
        time.sleep(0.3)  # several heartbeats while nothing finishes
    lines = [r.getMessage() for r in caplog.records]
    beats = [m for m in lines if m.startswith("work: 4/10 item (40.0%)")]
    assert len(beats) >= 2, lines
    assert "ETA" in beats[0] and "item/s" in beats[0] and "extra 1" in beats[0]
    assert lines[-1].startswith("work: 4/10 item (40.0%), done in")


def test_track_counts_every_item_and_off_logs_nothing(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CHATTTS_FORGE_PROGRESS", "log")
    caplog.set_level(logging.INFO, logger="chattts_forge.progress")
    assert list(track(range(3), "loop", "x")) == [0, 1, 2]
    assert caplog.records[-1].getMessage().startswith("loop: 3/3 x (100.0%), done in")
    caplog.clear()
    assert list(track(range(3), "quiet", enabled=False)) == [0, 1, 2]
    assert not caplog.records


def test_format_duration() -> None:
    assert format_duration(5.2) == "5 s"
    assert format_duration(125) == "2 min 5 s"
    assert format_duration(3725) == "1 h 2 min"


def test_driver_reports_a_quiet_step_and_passes_its_output_on(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CHATTTS_FORGE_PROGRESS", "log")
    caplog.set_level(logging.INFO, logger="chattts_forge.pipeline")
    script = "import sys, time; print('said', file=sys.stderr, flush=True); time.sleep(2.5); print('out')"
    code, out = run_stage([sys.executable, "-c", script], {}, True, "demo", quiet_limit=1.0)
    assert code == 0 and out == b"out\n"
    assert "said" in capfd.readouterr().err
    quiet = [r.getMessage() for r in caplog.records if "demo: still running" in r.getMessage()]
    assert quiet, "no heartbeat while the step was silent"
