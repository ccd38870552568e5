"""The node as a NATS Service API service (runtime/bus/service_api.py): $SRV.PING, INFO and STATS,
endpoints that follow the bundles' tool lists, and stats that count each answer (an error once)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import pytest

from runtime.bus.service_api import collect_infos
from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder, until

STATELESS_CLOCK = '[[seat]]\nname = "clock"\nstateless = true\n'


async def ask(m: Mesh, verb: str, service_id: str | None = None) -> dict[str, Any]:
    subject = f"$SRV.{verb}.mesh-node" + (f".{service_id}" if service_id else "")
    return json.loads((await m.nc.request(subject, b"", timeout=5)).data)


def endpoint(answer: dict[str, Any], subject: str) -> dict[str, Any]:
    [found] = [e for e in answer["endpoints"] if e["subject"] == subject]
    return found


async def test_ping_names_the_service_its_id_and_node(tmp_path: Path, m: Mesh) -> None:
    node = await m.start("n1", module_folder(tmp_path, "alpha"))
    ping = await ask(m, "PING")
    assert ping["type"] == "io.nats.micro.v1.ping_response" and ping["name"] == "mesh-node"
    assert ping["id"] == node.serving.service.id and ping["metadata"] == {"node": "n1", "seats": ""}  # type: ignore[union-attr]
    for subject in ("$SRV.PING", f"$SRV.PING.mesh-node.{ping['id']}"):  # every service, and this instance
        assert json.loads((await m.nc.request(subject, b"", timeout=5)).data)["id"] == ping["id"]


async def test_info_lists_every_tool_as_an_endpoint_with_its_mcp_definition(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    script.modules["alpha"] = [Behaviour(answer=echo, tools=("greet", "wave"), schemas={"wave": schema})]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.bundle_state("n1", "alpha/tools", "ready")
    info = await ask(m, "INFO")
    assert info["type"] == "io.nats.micro.v1.info_response" and info["description"]
    assert sorted(e["subject"] for e in info["endpoints"]) == ["mesh.tool.alpha.greet", "mesh.tool.alpha.wave"]
    wave = endpoint(info, "mesh.tool.alpha.wave")
    assert wave["name"] == "tool-alpha-wave" and wave["queue_group"] == "mesh"
    meta = wave["metadata"]
    assert (meta["kind"], meta["module"], meta["tool"], meta["bundle"], meta["state"]) == (
        "tool",
        "alpha",
        "wave",
        "alpha/tools",
        "ready",
    )
    assert json.loads(meta["mcp_tool"])["inputSchema"] == schema


async def test_endpoints_follow_the_childs_tool_list(tmp_path: Path, m: Mesh, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.bundle_state("n1", "alpha/tools", "ready")
    script.of("alpha")[0].change_tools(("wave",))

    async def listed() -> list[str]:
        return [e["subject"] for e in (await ask(m, "INFO"))["endpoints"]]

    await until(lambda: _equal(listed(), ["mesh.tool.alpha.wave"]), "INFO listing the new tool list")
    result, code = await m.call("mesh.tool.alpha.wave", {})
    assert code is None and result["content"][0]["text"] == "wave: {}"
    body, code = await m.call("mesh.tool.alpha.greet", {})
    assert code == "404" and body["error"]["known"] == ["mesh.tool.alpha.wave"]


async def _equal(got: Any, want: Any) -> bool:
    return await got == want


async def test_stats_count_every_answer_and_an_error_once(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["alpha"] = [
        Behaviour(answer=echo, tools=("greet", "typed"), schemas={"typed": {"type": "object", "required": ["n"]}})
    ]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for _ in range(3):
        _, code = await m.call("mesh.tool.alpha.greet", {})
        assert code is None
    _, code = await m.call("mesh.tool.alpha.typed", {})
    assert code == "400"
    _, code = await m.call("mesh.tool.alpha.nope", {})  # no endpoint to count it on
    assert code == "404"
    stats = await ask(m, "STATS")
    assert stats["type"] == "io.nats.micro.v1.stats_response" and stats["started"].endswith("Z")
    greet = endpoint(stats, "mesh.tool.alpha.greet")
    assert (greet["num_requests"], greet["num_errors"], greet["last_error"]) == (3, 0, "")
    assert greet["processing_time"] > 0 and greet["average_processing_time"] == greet["processing_time"] // 3
    typed = endpoint(stats, "mesh.tool.alpha.typed")
    assert (typed["num_requests"], typed["num_errors"]) == (1, 1)
    assert typed["last_error"].startswith("400:") and "required argument 'n' is missing" in typed["last_error"]


async def test_a_timed_out_call_with_progress_is_one_error_in_the_stats(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, call_seconds=5)]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=100))
    got = await m.frames("mesh.tool.alpha.greet", {}, {"Mesh-Progress": "1"})
    assert (got[-1].headers or {}).get("Nats-Service-Error-Code") == "504"
    greet = endpoint(await ask(m, "STATS"), "mesh.tool.alpha.greet")
    assert (greet["num_requests"], greet["num_errors"]) == (1, 1) and greet["last_error"].startswith("504:")


async def test_stats_carry_over_a_change_of_the_tool_list(tmp_path: Path, m: Mesh, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for _ in range(2):
        await m.call("mesh.tool.alpha.greet", {})
    script.of("alpha")[0].change_tools(("greet", "wave"))

    async def both() -> bool:
        return len((await ask(m, "INFO"))["endpoints"]) == 2

    await until(both, "the second tool listed")
    assert endpoint(await ask(m, "STATS"), "mesh.tool.alpha.greet")["num_requests"] == 2


async def test_a_held_seats_verbs_are_seat_endpoints_and_the_seat_is_in_the_metadata(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["timer"] = [Behaviour(answer=echo, tools=("clock.now", "greet"))]
    await m.start("n1", module_folder(tmp_path, "timer", seats=STATELESS_CLOCK))
    await m.bundle_state("n1", "timer/tools", "ready")
    info = await ask(m, "INFO")
    seat = endpoint(info, "mesh.seat.clock.now")
    assert seat["name"] == "seat-clock_now" and seat["metadata"]["kind"] == "seat"
    assert info["metadata"] == {"node": "n1", "seats": "clock"}
    assert "mesh.tool.timer.clock.now" not in [e["subject"] for e in info["endpoints"]]


async def test_every_node_answers_info_and_each_instance_is_reached_by_its_id(tmp_path: Path, m: Mesh) -> None:
    a = await m.start("a", module_folder(tmp_path / "a", "alpha"))
    b = await m.start("b", module_folder(tmp_path / "b", "beta"))
    ids = {a.serving.service.id: "a", b.serving.service.id: "b"}  # type: ignore[union-attr]
    infos = await collect_infos(m.nc, 0.3)
    assert sorted((i["id"], i["metadata"]["node"]) for i in infos) == sorted(ids.items())
    for service_id, name in ids.items():
        assert (await ask(m, "INFO", service_id))["metadata"]["node"] == name


async def test_a_stopped_node_answers_no_service_api_verb(tmp_path: Path, m: Mesh) -> None:
    node = await m.start("n1", module_folder(tmp_path, "alpha"))
    service_id = node.serving.service.id  # type: ignore[union-attr]
    await m.stop("n1")
    for verb in ("PING", "INFO", "STATS"):
        with pytest.raises(nats.errors.NoRespondersError):
            await ask(m, verb, service_id)
