"""Headless Chromium for the tests: the binary (skipped where none is installed, a failure under CI,
where .ci/run installs it) and a page's DOM after its scripts ran."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed (.ci/run installs it)")
    pytest.skip("no chromium binary on this machine (apt-get install -y chromium)")


def dump_dom(page: Path, profile: Path, budget_ms: int = 15000) -> str:
    """The page's DOM after its scripts ran (virtual time lets media load and promises settle first)."""
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
           "--autoplay-policy=no-user-gesture-required", f"--virtual-time-budget={budget_ms}", "--dump-dom",
           page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
