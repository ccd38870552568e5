"""The module host (runtime/node/modules.py), the one owner of modules and routes: a child's
tools/list_changed changes what is served, an upgrade in place rides over the calls in flight,
a removal takes only its own subjects, a module of two bundles serves both.

Ported from tests/test_node.py and tests/faults/test_upgrade.py (which deliver a real upgrade)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder, placement, until


def says(word: str) -> Any:
    def answer(tool: str, arguments: dict[str, Any]) -> Any:
        return {"content": [{"type": "text", "text": word}]}

    return answer


async def text(m: Mesh, subject: str, args: Any = None) -> str:
    result, code = await m.call(subject, args or {}, timeout=10)
    assert code is None, result
    return str(result["content"][0]["text"])


async def test_a_tool_added_by_list_changed_is_served_and_one_removed_is_404(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.bundle_state("n1", "alpha/tools", "ready")
    _, code = await m.call("mesh.tool.alpha.extra0", {})
    assert code == "404"
    script.of("alpha")[0].change_tools(("extra0",))

    async def served() -> bool:
        return (await m.call("mesh.tool.alpha.extra0", {"new": 1}))[1] is None

    await until(served, "the new tool served")
    body, code = await m.call("mesh.tool.alpha.greet", {})
    assert code == "404" and body["error"]["known"] == ["mesh.tool.alpha.extra0"]
    assert (await m.status("n1")).bundle("alpha/tools").tools == ["extra0"]  # type: ignore[union-attr]


async def test_a_list_changed_naming_an_undeclared_seat_verb_becomes_a_problem(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.bundle_state("n1", "alpha/tools", "ready")
    assert (await m.status("n1")).problems == []
    script.of("alpha")[0].change_tools(("greet", "cache.get"))

    async def named() -> list[str]:
        return (await m.status("n1")).problems

    [problem] = await until(named, "the problem in status")
    assert "tool 'cache.get' is a verb of seat 'cache'" in problem
    script.of("alpha")[0].change_tools(("greet",))
    await until(lambda: _no_problems(m), "the problem gone with the tool")


async def _no_problems(m: Mesh) -> bool:
    return (await m.status("n1")).problems == []


async def test_a_call_in_flight_when_the_tools_change_is_answered(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, call_seconds=0.2)]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    pending = asyncio.create_task(m.call("mesh.tool.alpha.greet", {"held": 1}))
    child = script.of("alpha")[0]
    await until(child.calls, "the call in the child")
    child.change_tools(("greet", "wave"))
    result, code = await pending
    assert code is None and "held" in result["content"][0]["text"]


async def test_an_upgrade_in_place_rides_over_the_calls_in_flight(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["up"] = [Behaviour(answer=says("1.0.0"), call_seconds=0.3), Behaviour(answer=says("2.0.0"))]
    await m.start("n1", module_folder(tmp_path, "up", version="1.0.0", folder="up-1"), module_folder(tmp_path, "other"))
    await m.bundle_state("n1", "up/tools", "ready")
    other = script.of("other")[0]
    old = script.of("up")[0]
    held = [asyncio.create_task(text(m, "mesh.tool.up.greet")) for _ in range(10)]
    await until(lambda: len(old.calls()) == 10, "ten calls in the old version's child")
    upgrade = asyncio.create_task(
        m.modules("n1").add_module(placement(module_folder(tmp_path, "up", version="2.0.0", folder="up-2")))
    )
    # New calls, made while the old version still answers what it holds, wait for the new one.
    after = [asyncio.create_task(text(m, "mesh.tool.up.greet")) for _ in range(10)]
    assert await asyncio.gather(*held) == ["1.0.0"] * 10
    assert await asyncio.gather(*after) == ["2.0.0"] * 10
    await upgrade
    assert not old.running and other.running and len(script.of("other")) == 1
    status = await m.status("n1")
    assert [(s.name, s.version) for s in status.modules if s.name == "up"] == [("up", "2.0.0")]
    assert [b.module for b in status.bundles].count("up") == 1


async def test_a_removed_module_takes_only_its_own_subjects(tmp_path: Path, m: Mesh, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"), module_folder(tmp_path, "beta"))
    await m.bundle_state("n1", "beta/tools", "ready")
    await m.modules("n1").remove_module("beta")
    with pytest.raises(nats.errors.NoRespondersError):
        await m.nc.request("mesh.tool.beta.greet", b"{}", timeout=5)
    assert not script.of("beta")[0].running and script.of("alpha")[0].running
    status = await m.status("n1")
    assert [s.name for s in status.modules] == ["alpha"] and [b.module for b in status.bundles] == ["alpha"]
    assert await text(m, "mesh.tool.alpha.greet") == "greet: {}"
    await m.modules("n1").remove_module("beta")  # twice: nothing more to do


async def test_a_module_of_two_tools_bundles_serves_both_and_names_the_one_that_is_down(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    more = (
        '[[bundle]]\nname = "more"\nkind = "tools"\nlanguage = "python"\nsource = "."\nentry = ["python", "main.py"]\n'
    )
    script.modules["alpha/more"] = [Behaviour(answer=echo, tools=("wave",))]
    await m.start("n1", module_folder(tmp_path, "alpha", extra=more))
    await m.bundle_state("n1", "alpha/more", "ready")
    assert await text(m, "mesh.tool.alpha.greet") == "greet: {}"
    assert await text(m, "mesh.tool.alpha.wave") == "wave: {}"
    script.modules["alpha/more"] = [Behaviour(unstartable=True)]
    script.of("alpha", "more")[0].kill()
    await m.bundle_state("n1", "alpha/more", "failed")
    assert await text(m, "mesh.tool.alpha.greet") == "greet: {}"  # the other bundle serves on
    body, code = await m.call("mesh.tool.alpha.wave", {})  # may be the down bundle's: 503, not 404
    assert code == "503" and body["error"]["bundle"] == "alpha/more"


async def test_two_modules_with_the_same_tool_names_are_kept_apart(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["one"] = [Behaviour(answer=says("one"))]
    script.modules["two"] = [Behaviour(answer=says("two"))]
    await m.start("n1", module_folder(tmp_path, "one"), module_folder(tmp_path, "two"))
    assert [await text(m, f"mesh.tool.{name}.greet") for name in ("one", "two", "one")] == ["one", "two", "one"]


async def test_a_childs_environment_is_built_from_scratch_with_what_it_is_granted(
    tmp_path: Path, m: Mesh, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRANTED_VAR", "yes")
    monkeypatch.setenv("NODE_SECRET", "hidden")
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('["alpha/tools"]\nAPI_KEY = "k-123"\n\n["beta/tools"]\nOTHER_KEY = "not-alpha"\n')
    secrets.chmod(0o600)
    await m.start("n1", module_folder(tmp_path, "alpha", bundle='pass_env = ["GRANTED_VAR"]'), secrets=str(secrets))
    env = script.of("alpha")[0].spec.env  # type: ignore[union-attr]
    assert (env["MESH_NODE"], env["MESH_MODULE"], env["MESH_BUNDLE"]) == ("n1", "alpha", "tools")
    assert Path(env["MESH_DATA_DIR"]) == m.tmp / "state-n1" / "data" / "alpha" and Path(env["MESH_DATA_DIR"]).is_dir()
    assert Path(env["MESH_BUNDLE_DIR"]) == tmp_path / "alpha"
    assert env["GRANTED_VAR"] == "yes" and env["API_KEY"] == "k-123"
    assert "NODE_SECRET" not in env and "OTHER_KEY" not in env and "hidden" not in repr(env)


async def test_a_secrets_file_others_may_read_gives_no_secret_and_the_bundle_still_runs(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('["alpha/tools"]\nAPI_KEY = "k-123"\n')
    secrets.chmod(0o644)
    await m.start("n1", module_folder(tmp_path, "alpha"), secrets=str(secrets))
    assert "API_KEY" not in script.of("alpha")[0].spec.env  # type: ignore[union-attr]
    assert await text(m, "mesh.tool.alpha.greet") == "greet: {}"
