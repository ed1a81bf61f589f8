"""The typed errors (chattts_forge.errors): the CLI exits and the server answers by an error's type."""

from __future__ import annotations

from pathlib import Path

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
from chattts_forge.runtime.compat_params import CompatArgumentError
from chattts_forge.runtime.request_handle import QueueFullError, SchedulerClosedError
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


@pytest.mark.parametrize(("error", "status", "code"), [
    (Conflict("a reload is already running"), 409, "admin"),  # typed: its own status
    (NotFound("no canary to promote"), 404, "admin"),
    (ForgeError("nothing to promote"), 422, "admin"),  # untyped: the admin endpoints' default
    (BadRequest("bad field", param="artifact"), 400, "bad_request"),  # the request's fault, naming its field
])
def test_the_server_answers_a_raised_error_by_its_type(error: ForgeError, status: int, code: str,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One ForgeError raised inside an endpoint comes back through the app's one handler with its
    type's status and the OpenAI-style body, and is counted in /metrics under its code."""
    testclient = pytest.importorskip("starlette.testclient")
    from chattts_forge.runtime.serve.app import create_app
    from chattts_forge.runtime.serve.config import ServeConfig
    from chattts_forge.runtime.serve.state import ServerState

    state = ServerState(ServeConfig(artifact=str(tmp_path), admin_token="s3cret"))

    def promote() -> dict[str, str]:
        raise error

    monkeypatch.setattr(state, "promote", promote)
    with testclient.TestClient(create_app(state, load_in_background=False)) as client:
        r = client.post("/admin/promote", json={}, headers={"Authorization": "Bearer s3cret", "Host": "localhost"})
        assert r.status_code == status
        param = getattr(error, "param", None) if code == "bad_request" else None
        etype = "invalid_request_error"
        assert r.json() == {"error": {"message": str(error), "type": etype, "param": param, "code": code}}
        # a refusal the server decides itself carries its type's status too (503, not ready)
        r = client.post("/v1/audio/speech", json={"input": "hi"})
        assert (r.status_code, r.json()["error"]["code"]) == (503, "not_ready")
        assert r.headers["Retry-After"] == "1"
    assert state.metrics.errors.labels(kind=code)._value.get() == 1


@pytest.mark.parametrize(("change", "param"), [
    ({"top_k": 0}, "params.code.top_k"),
    ({"temperature": float("nan")}, "params.code.temperature"),
    ({"seed": "7"}, "params.code.seed"),
])
def test_request_validation_names_the_field(change: dict[str, object], param: str) -> None:
    """A request's parameters are refused with BadInput naming the field (a server's error `param`)."""
    from dataclasses import replace

    from chattts_forge.runtime.params import InferCodeParams, SynthParams, check_synth_params

    with pytest.raises(BadInput) as caught:
        check_synth_params(SynthParams(code=replace(InferCodeParams(), **change)))
    assert caught.value.param == param
    assert str(caught.value).startswith(param)
