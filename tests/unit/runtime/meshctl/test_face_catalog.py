"""The face's naming rule and catalog, in process: what a client sees from given $SRV.INFO answers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from runtime.meshctl.face.catalog import Catalog, FaceError, Selection, load_selection
from runtime.meshctl.face.names import NAME_PATTERN, assign_names, plain_name


def test_seat_verbs_and_module_tools() -> None:
    assert plain_name("mesh.seat.memory.remember") == "memory_remember"
    assert plain_name("mesh.tool.hello-go.greet") == "hello-go_greet"
    assert plain_name("mesh.tool.m.a/b c") == "m_a_b_c"


def test_collisions_resolve_the_same_whatever_the_order() -> None:
    subjects = ["mesh.tool.memory.remember", "mesh.seat.memory.remember", "mesh.tool.memory_remember"]
    first, notes = assign_names(subjects)
    for _ in range(5):
        random.shuffle(subjects)
        assert assign_names(subjects)[0] == first
    assert first["mesh.seat.memory.remember"] == "memory_remember"  # seat verbs keep the name
    others = {first["mesh.tool.memory.remember"], first["mesh.tool.memory_remember"]}
    assert len(others) == 2 and all(n.startswith("memory_remember_") and len(n) == 24 for n in others)
    assert len(notes) == 2 and all("memory_remember is mesh.seat.memory.remember's" in n for n in notes)


def test_long_names_are_cut_with_a_hash_and_stay_valid() -> None:
    long = "mesh.tool." + "m" * 40 + "." + "t" * 40
    other = "mesh.tool." + "m" * 40 + "." + "t" * 39 + "u"
    names, notes = assign_names([long, other])
    assert len(names[long]) == 64 and names[long] != names[other]
    assert names[long].startswith("m" * 40 + "_" + "t" * 14 + "_")
    assert all(NAME_PATTERN.match(n) for n in names.values())
    assert len(notes) == 2 and "longer than 64" in notes[0]


def _info(node: str, *endpoints: tuple[str, dict[str, Any]], state: str = "ready") -> dict[str, Any]:
    rows = []
    for subject, definition in endpoints:
        meta = {"kind": "tool", "module": subject.split(".")[2], "tool": definition.get("name"), "state": state}
        meta["mcp_tool"] = json.dumps(definition)
        rows.append({"name": "x", "subject": subject, "metadata": meta})
    return {"id": f"id-{node}", "metadata": {"node": node}, "endpoints": rows}


GREET = {"name": "greet", "description": "Say hello", "inputSchema": {"type": "object", "required": ["name"]}}


def test_the_same_subject_on_two_nodes_is_one_tool() -> None:
    catalog = Catalog(Selection())
    assert catalog.rebuild([_info("b", ("mesh.tool.hello.greet", GREET)), _info("a", ("mesh.tool.hello.greet", GREET))])
    (tool,) = catalog.tools
    assert tool.name == "hello_greet" and tool.nodes == ("a", "b")
    assert tool.definition == {**GREET, "name": "hello_greet"}  # description and schema unchanged
    assert not catalog.rebuild(
        [_info("a", ("mesh.tool.hello.greet", GREET)), _info("b", ("mesh.tool.hello.greet", GREET))]
    )
    assert catalog.rebuild([_info("a", ("mesh.tool.hello.greet", GREET), state="failed")])  # b left, a failed
    assert catalog.rebuild([], gone={"id-a"}) and catalog.tools == []


def test_hostile_endpoints_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    bad: list[Any] = [
        "nonsense",
        {"subject": "mesh.tool.x.y"},
        {"subject": "evil.subject", "metadata": {"tool": "y", "mcp_tool": "{}"}},
        {"subject": "mesh.tool.x.>", "metadata": {"tool": "y", "mcp_tool": "{}"}},
        {"subject": "mesh.tool.x.y", "metadata": {"tool": "y", "mcp_tool": "not json"}},
        {"subject": "mesh.tool.x.y", "metadata": {"tool": "y", "mcp_tool": json.dumps({"name": "z"})}},
        {"subject": "mesh.tool.x.y", "metadata": {"tool": "y", "mcp_tool": "x" * 300_000}},
    ]
    catalog = Catalog(Selection())
    catalog.rebuild([{"id": "n", "metadata": {"node": "n"}, "endpoints": bad}, "not an info", {"endpoints": 7}])
    assert catalog.tools == []
    catalog.rebuild([{"id": "n", "metadata": {"node": "n"}, "endpoints": bad}])
    said = [r.getMessage() for r in caplog.records if r.name == "mesh.face"]
    assert len(said) == len(bad) and len(set(said)) == len(said)  # each said once, not on every rebuild


def test_selection_patterns_and_cap() -> None:
    infos = [_info("a", *((f"mesh.tool.m{i}.t", {"name": "t"}) for i in range(5)))]
    catalog = Catalog(Selection(only=["m*_t"], exclude=["mesh.tool.m1.*"], max_tools=3))
    catalog.rebuild(infos)
    assert [t.name for t in catalog.tools] == ["m0_t", "m2_t", "m3_t"]
    assert [t.name for t in catalog.left_out] == ["m1_t", "m4_t"]


def test_profiles(tmp_path: Path) -> None:
    config = tmp_path / "mcp.toml"
    config.write_text('[profiles.mem]\nonly = ["memory_*"]\nexcept = ["memory_forget"]\nmax_tools = 9\n')
    chosen = load_selection(config, "mem", ["extra_*"], [], None)
    assert chosen == Selection(only=["memory_*", "extra_*"], exclude=["memory_forget"], max_tools=9)
    with pytest.raises(FaceError, match="has no profile 'nope'; it has: mem"):
        load_selection(config, "nope", [], [], None)
    config.write_text("[profiles.mem]\nonlyy = []\n")
    with pytest.raises(FaceError, match="only = "):
        load_selection(config, "mem", [], [], None)
    with pytest.raises(FaceError, match="needs a config file"):
        load_selection(None, "mem", [], [], None)
    with pytest.raises(FaceError, match="at least 1"):
        load_selection(None, None, [], [], 0)


async def test_a_call_while_the_bus_is_away_is_an_error_at_once() -> None:
    """The face's own client (the SDK's in-process one) calling while the face has no bus: an
    isError result now, not a call parked in the NATS client's buffer until the reconnect."""
    import anyio
    from mcp import Client
    from nats.aio.client import Client as Nats

    from runtime.meshctl.face.server import Face

    face = Face(Nats(), Catalog(Selection()))  # never connected
    face.catalog.rebuild([_info("a", ("mesh.tool.hello.greet", GREET))])
    async with Client(face.server, cache=None) as c:
        assert [t.name for t in (await c.list_tools()).tools] == ["hello_greet"]
        with anyio.fail_after(1):
            result = await c.call_tool("hello_greet", {"name": "Ada"})
    assert result.is_error and "not connected to the bus" in result.content[0].text  # type: ignore[union-attr]
