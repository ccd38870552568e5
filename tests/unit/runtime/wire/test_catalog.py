"""The catalogue's keys, records and bounds (runtime/wire/catalog.py): what a node writes, what a reader refuses."""

from __future__ import annotations

import msgspec
import pytest

from runtime.wire.catalog import (
    MAX_ENTRY_BYTES,
    MAX_PARTS,
    MAX_TOOL_BYTES,
    MAX_TOOLS_PER_NODE,
    DefsPart,
    Key,
    NodeRecord,
    Refused,
    StateRecord,
    ToolDef,
    beat_key,
    decode,
    defs_key,
    encode,
    node_key,
    parse_key,
    split_definitions,
    state_key,
)


def tool(name: str, pad: int = 0, module: str = "alpha") -> ToolDef:
    definition = {"name": name, "description": "x" * pad, "inputSchema": {"type": "object"}}
    return ToolDef(f"mesh.tool.{module}.{name}", "tool", name, msgspec.Raw(msgspec.json.encode(definition)))


def test_every_key_reads_back_as_what_it_names() -> None:
    assert parse_key(node_key("n1")) == Key("n1", "node")
    assert parse_key(beat_key("n1")) == Key("n1", "beat")
    assert parse_key(state_key("n1", "alpha", "tools")) == Key("n1", "state", "alpha", "tools")
    assert parse_key(defs_key("n1", "alpha", "tools", "0123456789abcdef", 3)) == Key(
        "n1", "defs", "alpha", "tools", "0123456789abcdef", 3
    )


@pytest.mark.parametrize(
    "key",
    [
        "N1.node",  # not a name
        "n1.node.more",
        "n1.state.alpha",
        "n1.state.Alpha.tools",
        "n1.defs.alpha.tools.0123.0",  # digest too short
        "n1.defs.alpha.tools.0123456789abcdef.100",  # past MAX_PARTS
        "n1.defs.alpha.tools.0123456789abcdef.01",
        "n1.other",
        "n1",
    ],
)
def test_a_key_that_is_not_the_catalogues_is_none(key: str) -> None:
    assert parse_key(key) is None


def test_a_bundles_list_is_one_part_when_it_fits_and_its_digest_says_what_it_holds() -> None:
    tools = [tool(f"t{i}", 500) for i in range(20)]
    split = split_definitions("alpha", "tools", tools)
    assert (len(split.parts), split.tools, split.left_out) == (1, 20, [])
    assert 10_000 < len(split.parts[0]) < MAX_ENTRY_BYTES
    # The same tools in another order: the same digest (the same keys on every node); a change: another.
    assert split_definitions("alpha", "tools", list(reversed(tools))).digest == split.digest
    assert split_definitions("alpha", "tools", tools[:-1]).digest != split.digest
    part = msgspec.json.decode(split.parts[0], type=DefsPart)
    assert [t.tool for t in part.tools] == sorted(t.tool for t in tools) and part.digest == split.digest


def test_a_long_list_is_split_into_parts_each_within_the_bound() -> None:
    tools = [tool(f"t{i:03}", 60_000) for i in range(10)]
    split = split_definitions("alpha", "tools", tools)
    assert split.tools == 10 and split.left_out == [] and len(split.parts) == 3  # 4 + 4 + 2 tools of 60 KB
    assert all(len(p) <= MAX_ENTRY_BYTES for p in split.parts)
    parts = [msgspec.json.decode(p, type=DefsPart) for p in split.parts]
    assert [(p.part, p.parts) for p in parts] == [(i, 3) for i in range(3)]
    assert sum(len(p.tools) for p in parts) == 10


def test_what_cannot_be_catalogued_is_left_out_naming_why() -> None:
    huge = tool("huge", MAX_TOOL_BYTES)
    split = split_definitions("alpha", "tools", [huge, tool("small")])
    assert split.tools == 1 and len(split.left_out) == 1 and split.left_out[0].startswith("huge: its definition takes")
    crowded = split_definitions("alpha", "tools", [tool(f"t{i}") for i in range(5)], room=3)
    assert crowded.tools == 3 and all(f"catalogues {MAX_TOOLS_PER_NODE} tools at most" in w for w in crowded.left_out)
    many = [tool(f"t{i:03}", MAX_TOOL_BYTES - 400) for i in range(MAX_PARTS + 2)]
    too_long = split_definitions("alpha", "tools", many)
    assert len(too_long.parts) == MAX_PARTS and len(too_long.left_out) == 2
    assert f"longer than {MAX_PARTS} parts" in too_long.left_out[0]


def test_a_bundle_without_tools_has_no_digest_and_no_part() -> None:
    assert split_definitions("alpha", "tools", []) == split_definitions("alpha", "tools", [])
    empty = split_definitions("alpha", "tools", [])
    assert (empty.digest, empty.parts, empty.tools) == ("", [], 0)


def part_value(tools: list[ToolDef], module: str = "alpha", digest: str = "0123456789abcdef") -> bytes:
    return encode(DefsPart(module, "tools", digest, 0, 1, tools))


PART_KEY = Key("n1", "defs", "alpha", "tools", "0123456789abcdef", 0)


def refused(key: Key, value: bytes) -> str:
    with pytest.raises(Refused) as e:
        decode(key, value)
    return str(e.value)


def test_a_reader_takes_a_part_that_is_what_its_key_says() -> None:
    got = decode(PART_KEY, part_value([tool("greet")]))
    assert isinstance(got, DefsPart) and got.tools[0].tool == "greet"
    seat = ToolDef("mesh.seat.memory.recall", "seat", "memory.recall", msgspec.Raw(b'{"name":"memory.recall"}'))
    assert isinstance(decode(PART_KEY, part_value([seat])), DefsPart)


@pytest.mark.parametrize(
    "bad, said",
    [
        (tool("greet", module="beta"), "not mesh.tool.alpha.<tool>"),
        (ToolDef("mesh.tool.alpha.a", "tool", "b", msgspec.Raw(b'{"name":"b"}')), "not mesh.tool.alpha.<tool>"),
        (ToolDef("mesh.tool.alpha.a", "tool", "a", msgspec.Raw(b'{"name":"z"}')), "named 'z', not 'a'"),
        (ToolDef("mesh.tool.alpha.a", "tool", "a", msgspec.Raw(b"[1]")), "not a JSON object with a name"),
        (ToolDef("mesh.tool.alpha.a", "thing", "a", msgspec.Raw(b'{"name":"a"}')), "neither tool nor seat"),
        (
            ToolDef("mesh.seat.memory", "seat", "memory", msgspec.Raw(b'{"name":"memory"}')),
            "not mesh.seat.<seat>.<verb>",
        ),
        (ToolDef("mesh.tool.alpha.>", "tool", ">", msgspec.Raw(b'{"name":">"}')), "not a subject"),
    ],
)
def test_a_tool_that_is_not_what_it_says_refuses_its_part(bad: ToolDef, said: str) -> None:
    assert said in refused(PART_KEY, part_value([tool("ok"), bad]))


def test_records_that_do_not_match_their_key_or_their_bounds_are_refused() -> None:
    assert "more than" in refused(Key("n1", "node"), b" " * 20_000)
    assert "not a node record" in refused(Key("n1", "node"), b"[]")
    record = NodeRecord("n2", "run", "svc", 5.0, 15.0, 0.0)
    assert "naming node 'n2'" in refused(Key("n1", "node"), encode(record))
    fast = NodeRecord("n1", "run", "svc", 5.0, 1.0, 0.0)
    assert "beat every 5.0 s with a TTL of 1.0 s" in refused(Key("n1", "node"), encode(fast))
    state = Key("n1", "state", "alpha", "tools")
    assert "the state of beta/tools" in refused(state, encode(StateRecord("beta", "tools", "1", "ready")))
    assert "state ''" in refused(state, encode(StateRecord("alpha", "tools", "1", "")))
    assert "digest" in refused(state, encode(StateRecord("alpha", "tools", "1", "ready", digest="ZZ")))
    newer = msgspec.json.encode({"module": "alpha", "bundle": "tools", "version": "1", "state": "ready", "format": 9})
    assert "format 9" in refused(state, newer)
    moved = encode(DefsPart("alpha", "tools", "0123456789abcdef", 1, 2, [tool("a")]))
    assert "not its key's" in refused(PART_KEY, moved)
