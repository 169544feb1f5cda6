"""The declared list of controller operations: everything that lists operations derives from it."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

import pytest

from trajflight.controller import (
    CALLS,
    COMMANDS,
    ROLES,
    ControllerClient,
    Kind,
    Ledger,
    LocalController,
    Route,
)
from trajflight.controller._commands import MUTATING, Counts, Tick, parse
from trajflight.controller._ray_host import ControllerActor
from trajflight.errors import InvalidRequestError

NOT_COMMANDS = {"snapshot", "from_snapshot"}  # byte images of the ledger for its host, not operations


def _public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isroutine) if not name.startswith("_")}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_has_the_arguments_and_defaults_of_its_ledger_method(name):
    cls = COMMANDS[name]
    params = inspect.signature(getattr(Ledger, name)).parameters
    takes_now = "now" in params
    assert takes_now == (cls.kind is not Kind.QUERY), f"{name}: only queries run without now"
    arguments = [p for p in params if p not in ("self", "now")]
    assert list(cls.argument_names) == arguments
    for field in dataclasses.fields(cls):
        default = params[field.name].default
        declared = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert declared == default, f"{name}.{field.name}: default {declared!r}, the ledger's {default!r}"


def test_every_operation_of_the_ledger_is_declared_once():
    assert set(COMMANDS) == _public(Ledger) - NOT_COMMANDS - {"incarnation", "last_token", "parks"}
    assert len({cls.__name__ for cls in COMMANDS.values()}) == len(COMMANDS)


def test_the_client_has_one_method_per_client_operation():
    """ControllerClient serves exactly the commands of routes CALL and OWN (plus call_many)."""
    client_ops = {name for name, cls in COMMANDS.items() if cls.route is not Route.HOST}
    assert _public(ControllerClient) - {"call_many"} == client_ops
    assert {name for name, cls in COMMANDS.items() if cls.route is Route.CALL} == CALLS


def test_every_client_operation_has_a_role_and_no_host_operation_has_one():
    """The table an authenticating host checks (issue 18): a new client operation without a role fails
    here, before any caller can reach it unchecked."""
    client_ops = {name for name, cls in COMMANDS.items() if cls.route is not Route.HOST}
    assert set(ROLES) == client_ops
    assert all(ROLES[name] for name in client_ops)


def test_what_is_journaled_is_what_changes_state():
    assert {name for name, cls in COMMANDS.items() if cls.kind is Kind.MUTATING} == MUTATING
    assert {"tick", "take_deletes", "take_fences"} == {n for n, c in COMMANDS.items() if c.kind is Kind.TIMED}


def test_parse_refuses_unknown_operations_and_arguments_with_bounded_messages():
    assert parse("counts", {"job_id": "j"}) == Counts(job_id="j")
    with pytest.raises(InvalidRequestError, match="is not a controller call") as err:
        parse("x" * 10_000, {})
    assert len(str(err.value)) < 300
    with pytest.raises(InvalidRequestError, match="bad arguments for counts"):
        parse("counts", {"job_id": "j", "y" * 10_000: 1})
    with pytest.raises(InvalidRequestError, match="bad arguments for counts"):
        parse("counts", {})
    with pytest.raises(InvalidRequestError, match="is not a controller call"):
        parse(["counts"], {})


def test_a_local_controller_runs_commands_as_data():
    with LocalController() as host:
        host.call("register_server", {"server_id": "s", "node": "n", "location": "grpc://x",
                                      "capacity_bytes": 10, "capacity_groups": 1})  # fmt: skip
        host.call("open_job", {"job_id": "j", "epoch": 1})
        assert host.run(Counts(job_id="j"))["READY"] == 0
        assert host.run(Tick()) is None


def test_the_ray_actor_serves_the_client_operations_only():
    """Regression: the actor's ``invoke`` ran any ledger method by name, the hosts' own included (a remote
    caller could ``recover`` the ledger or confirm a delete that never happened); it now serves exactly
    the commands of route CALL, as the Flight endpoint does."""

    async def calls() -> list[tuple[str, object]]:
        actor = ControllerActor()
        out = [
            await actor.invoke("recover", {"incarnation": 5}),
            await actor.invoke("delete_done", {"partition": ("j", 1, 0), "ok": True}),
            await actor.invoke("tick", {}),
            await actor.invoke("servers", {}),
        ]
        await actor.close()
        assert actor._core.ledger.incarnation == 0  # nothing ran
        return out

    recover, delete, tick, servers = asyncio.run(calls())
    for status, error in (recover, delete, tick):
        assert status == "err"
        assert isinstance(error, InvalidRequestError)
        assert "unknown controller operation" in str(error)
    assert servers == ("ok", ())
