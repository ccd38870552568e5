"""`mesh.events.tools` (runtime/node/changes.py): a node says when what it serves changed, so that
watchers (the MCP face, `meshctl mcp`) look again; one message per burst, the last as it leaves."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import msgspec
import pytest

from runtime.wire.events import ChangeEvent
from runtime.wire.subjects import CHANGES_SUBJECT
from tests.support.fake_child import Script
from tests.support.inproc import Mesh, module_folder, until


class Heard:
    """Every ChangeEvent on the bus, in order."""

    def __init__(self) -> None:
        self.events: list[ChangeEvent] = []

    def reasons(self, node: str = "n1") -> list[str]:
        return [r for e in self.events if e.node == node for r in e.reasons]

    async def said(self, words: str, node: str = "n1") -> ChangeEvent:
        def find() -> ChangeEvent | None:
            return next((e for e in self.events if e.node == node and any(words in r for r in e.reasons)), None)

        return await until(find, f"a change event saying {words!r}")


@pytest.fixture
async def heard(m: Mesh) -> AsyncIterator[Heard]:
    h = Heard()

    async def on(msg: object) -> None:
        h.events.append(msgspec.json.decode(msg.data, type=ChangeEvent))  # type: ignore[attr-defined]

    sub = await m.nc.subscribe(CHANGES_SUBJECT, cb=on)
    await m.nc.flush()
    yield h
    await sub.unsubscribe()


async def test_a_node_that_joins_says_so_with_its_service_id(tmp_path: Path, m: Mesh, heard: Heard) -> None:
    node = await m.start("n1", module_folder(tmp_path, "alpha"))
    event = await heard.said("node n1 joined")
    assert event.service_id == node.serving.service.id and not event.leaving  # type: ignore[union-attr]


async def test_a_bundle_that_changes_state_is_told(tmp_path: Path, m: Mesh, heard: Heard, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await heard.said("node n1 joined")  # what happened before the bus answered is in this one
    script.of("alpha")[0].kill()
    await heard.said("bundle alpha/tools starting")
    await heard.said("bundle alpha/tools ready")


async def test_a_changed_tool_list_is_told(tmp_path: Path, m: Mesh, heard: Heard, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await heard.said("node n1 joined")
    before = len(heard.events)
    script.of("alpha")[0].change_tools(("greet", "wave"))
    await until(lambda: len(heard.events) > before, "an event after list_changed")
    assert any("alpha/tools" in r for e in heard.events[before:] for r in e.reasons)


async def test_a_node_leaving_says_so_last(tmp_path: Path, m: Mesh, heard: Heard) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await heard.said("node n1 joined")
    await m.stop("n1")
    last = await heard.said("node n1 stopping")
    assert last.leaving and last is heard.events[-1]
    assert [e.leaving for e in heard.events] == [False] * (len(heard.events) - 1) + [True]


async def test_a_burst_of_changes_is_few_messages_with_at_most_eight_reasons_each(
    tmp_path: Path, m: Mesh, heard: Heard, script: Script
) -> None:
    await m.start("n1", *[module_folder(tmp_path, f"m{i}") for i in range(12)])
    await heard.said("node n1 joined")
    before = len(heard.events)
    for child in script.started:  # every child at once: 12 x starting, then 12 x ready
        child.kill()

    def told() -> int:  # changes said, by name or counted in "and N more"
        burst = heard.events[before:]
        return sum(int(r.split()[1]) if r.startswith("and ") else 1 for e in burst for r in e.reasons)

    await until(lambda: told() >= 24, "24 changes told")
    burst = heard.events[before:]
    assert 1 <= len(burst) < 12, [e.reasons for e in burst]
    assert all(len(e.reasons) <= 9 for e in burst)  # eight, and "and N more"
    assert any(r.startswith("and ") and r.endswith(" more") for e in burst for r in e.reasons)


async def test_two_nodes_each_speak_for_themselves(tmp_path: Path, m: Mesh, heard: Heard) -> None:
    a = await m.start("a", module_folder(tmp_path / "a", "alpha"))
    b = await m.start("b", module_folder(tmp_path / "b", "alpha"))
    assert (await heard.said("node a joined", node="a")).service_id == a.serving.service.id  # type: ignore[union-attr]
    assert (await heard.said("node b joined", node="b")).service_id == b.serving.service.id  # type: ignore[union-attr]
    await m.stop("a")
    await heard.said("node a stopping", node="a")
    assert not [e for e in heard.events if e.node == "b" and e.leaving]
