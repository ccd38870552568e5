"""`meshctl` output lines: a seat in `node status` names each fact once; a JetStream refusal is one line."""

from __future__ import annotations

import pytest
from nats.js.errors import ServiceUnavailableError

from runtime.bus.catalog import CatalogUnavailable
from runtime.meshctl import cli
from runtime.meshctl.verbs import call as call_verbs
from runtime.meshctl.verbs import seat as seat_verbs
from runtime.meshctl.verbs.node import seat_line
from runtime.wire.control import SeatStatus


def seat(reason: str) -> SeatStatus:
    return SeatStatus(seat="memory", state="elsewhere", holder="node-a", module="memory", reason=reason)


def test_a_seat_held_elsewhere_names_the_holder_once() -> None:
    line = seat_line(seat("node node-a holds seat memory (module memory)"))
    assert line == "seat memory: held by node node-a, not here (module memory)"


def test_a_holder_running_another_module_is_named() -> None:
    line = seat_line(seat("node node-a holds seat memory (module memory-next)"))
    assert line.endswith("not here (module memory): node node-a holds seat memory (module memory-next)")


def test_a_jetstream_refusal_is_one_line_naming_who_may(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a caller account (no JetStream): `seat list` and `bundle deliver` ended in a traceback."""

    def refused(_args: object, _verb: object) -> int:
        raise ServiceUnavailableError(code=503, err_code=10039, description="JetStream not enabled for account")

    monkeypatch.setattr(seat_verbs, "_on_bus", refused)
    assert cli.main(["seat", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "JetStream not enabled for account" in err and "mesh account" in err and "bus-mesh.password" in err


def test_no_node_answering_tools_says_why_it_may_be(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a caller account, `meshctl tools` printed "0 tools on 0 nodes" and nothing else."""

    async def none(*_args: object) -> list[dict[str, object]]:
        return []

    monkeypatch.setattr(call_verbs, "_infos", none)
    assert cli.main(["tools", "--info", "--nats", "nats://127.0.0.1:1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "0 tools on 0 nodes"
    assert "no node answered $SRV.INFO" in err and "not in the mesh account" in err


def test_no_catalogue_says_why_and_what_else_to_try(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def unreadable(*_args: object) -> object:
        raise CatalogUnavailable("the catalogue bucket mesh-catalog did not answer within 5 s")

    monkeypatch.setattr(call_verbs, "_from_catalog", unreadable)
    assert cli.main(["tools", "--nats", "nats://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert "did not answer within 5 s" in err and "meshctl tools --info" in err and "Traceback" not in err


def test_an_empty_catalogue_is_said_beside_the_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def empty(*_args: object) -> tuple[list[tuple[str, ...]], int, str]:
        return [], 0, "no catalogue on this bus: bucket mesh-catalog does not answer"

    monkeypatch.setattr(call_verbs, "_from_catalog", empty)
    assert cli.main(["tools", "--nats", "nats://127.0.0.1:1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "0 tools on 0 nodes" and "no catalogue on this bus" in err and "--info" in err
