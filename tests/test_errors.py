"""The typed errors (chattts_forge.errors): the CLI exits and the server answers by an error's type."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from chattts_forge import cli
from chattts_forge.errors import (
    ArtifactChanged,
    BadInput,
    Busy,
    Conflict,
    ForgeError,
    IntegrityError,
    NotFound,
    Unavailable,
    http_status_of,
)
from chattts_forge.runtime.compat import CompatArgumentError
from chattts_forge.runtime.scheduler import QueueFullError, SchedulerClosedError
from chattts_forge.runtime.serve.requests import BadRequest


class _Exit7(ForgeError):
    exit_code = 7


@click.command("boom")
@click.option("--kind", default="plain")
def boom(kind: str) -> None:
    raise (_Exit7 if kind == "seven" else NotFound)(f"{kind} failure")


def test_the_server_statuses_come_from_the_types() -> None:
    statuses = {BadInput: 400, IntegrityError: 500, ArtifactChanged: 500, NotFound: 404, Conflict: 409,
                Busy: 429, Unavailable: 503}
    assert {cls: http_status_of(cls("x"), 418) for cls in statuses} == statuses
    assert http_status_of(ForgeError("x"), 418) == 418  # untyped: the endpoint's default
    # the runtime's own errors sit in the hierarchy
    assert http_status_of(QueueFullError("full"), 400) == 429
    assert http_status_of(SchedulerClosedError("closed"), 400) == 503
    assert http_status_of(BadRequest("bad field", param="x"), 500) == 400
    assert issubclass(CompatArgumentError, BadInput) and issubclass(CompatArgumentError, TypeError)


@pytest.mark.parametrize(("kind", "code"), [("plain", 2), ("seven", 7)])
def test_the_cli_exits_with_the_errors_code(kind: str, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "boom", (__name__, "boom", "raises"))
    res = CliRunner().invoke(cli.main, ["boom", "--kind", kind])
    assert res.exit_code == code
    assert res.output.strip().splitlines() == [f"error: {kind} failure"]
