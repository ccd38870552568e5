"""Service and step bundles supervised by the node itself ([services] host = "node"): the service
child is a fake too (a plain process: no MCP, its stdin closed), and so is every step.

Ported from tests/test_services.py, which delivers real ones to a node process."""

from __future__ import annotations

from pathlib import Path

import msgspec
import nats
import pytest

from runtime.config import ServicesConfig
from runtime.hosting.steps import record_path
from runtime.meshctl.deliver import deliver
from runtime.wire.control import RestartReply
from runtime.wire.subjects import RESTART, node_subject
from tests.support.fake_child import Behaviour, Script
from tests.support.inproc import Mesh, module_folder, placement, until
from toolchains.artifact import ArtifactMeta
from toolchains.pack import pack

NODE_RUNS = ServicesConfig(host="node")
SERVICE = (
    '[[bundle]]\nname = "daemon"\nkind = "service"\nlanguage = "python"\nsource = "."\nentry = ["python", "main.py"]\n'
)
STEP = (
    '[[bundle]]\nname = "migrate"\nkind = "step"\nlanguage = "python"\nsource = "."\nentry = ["python", "main.py"]\n'
    "timeout_ms = {timeout_ms}\n"
)
DAEMON = Behaviour(exit_on_eof=False, handshake=False)  # runs until stopped; reads nothing
STEP_OK = Behaviour(exit_on_eof=False, exit_after=0, exit_code=0, stderr="migrating 0.1.0")


def hosted(tmp_path: Path, *, step: bool = False, step_timeout_ms: int = 2000, version: str = "0.1.0") -> Path:
    extra = SERVICE + (STEP.format(timeout_ms=step_timeout_ms) if step else "")
    return module_folder(tmp_path, "hosted", extra=extra, version=version, folder=f"hosted-{version}")


async def test_a_service_runs_supervised_by_the_node_with_the_child_environment(
    tmp_path: Path, m: Mesh, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_SECRET", "do-not-leak")
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    status = await m.bundle_state("n1", "hosted/daemon", "running")
    daemon = status.bundle("hosted/daemon")
    assert daemon is not None and (daemon.kind, daemon.runs, daemon.language, daemon.tools) == (
        "service",
        "node",
        "python",
        [],
    )
    [child] = script.of("hosted", "daemon")
    assert daemon.pid == child.pid and child.running
    env = child.spec.env  # type: ignore[union-attr]
    assert (env["MESH_NODE"], env["MESH_MODULE"], env["MESH_BUNDLE"]) == ("n1", "hosted", "daemon")
    assert Path(env["MESH_DATA_DIR"]) == m.tmp / "state-n1" / "data" / "hosted" and Path(env["MESH_DATA_DIR"]).is_dir()
    assert "NODE_SECRET" not in env and "do-not-leak" not in repr(env)
    assert child.received == []  # the node writes nothing to a service
    await m.bundle_state("n1", "hosted/tools", "ready")  # its module's tools serve beside it


async def test_a_service_that_ends_is_started_again(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/daemon", "running")
    script.of("hosted", "daemon")[0].kill()

    async def again() -> bool:
        daemon = (await m.status("n1")).bundle("hosted/daemon")
        return daemon is not None and daemon.state == "running" and daemon.restarts == 1

    await until(again, "the service running again")
    first, second = script.of("hosted", "daemon")
    assert not first.running and second.running
    assert (await m.status("n1")).bundle("hosted/daemon").last_exit == "killed by SIGKILL"  # type: ignore[union-attr]


async def test_a_crash_looping_service_fails_and_an_operators_restart_brings_it_back(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["hosted/daemon"] = [Behaviour(exit_on_eof=False, exit_after=0, stderr="no config")]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    failed = (await m.bundle_state("n1", "hosted/daemon", "failed")).bundle("hosted/daemon")
    assert failed is not None and failed.last_exit == "exit code 1" and "no config" in failed.stderr_tail
    script.modules["hosted/daemon"] = [DAEMON]
    msg = await m.nc.request(node_subject("n1", RESTART), b'{"bundle": "hosted/daemon"}', timeout=5)
    assert msg.data == b'{"ok":true,"bundle":"hosted/daemon","was":"failed"}'
    await m.bundle_state("n1", "hosted/daemon", "running")


async def test_the_bundle_name_daemon_alone_restarts_the_service(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/daemon", "running")
    msg = await m.nc.request(node_subject("n1", RESTART), b'{"bundle": "daemon"}', timeout=5)
    assert msgspec.json.decode(msg.data, type=RestartReply) == RestartReply(
        ok=True, bundle="hosted/daemon", was="running"
    )
    await until(lambda: len(script.of("hosted", "daemon")) == 2, "a second service child")
    await m.bundle_state("n1", "hosted/daemon", "running")
    assert not script.of("hosted", "daemon")[0].running


async def test_a_removed_module_stops_its_service(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/daemon", "running")
    await m.modules("n1").remove_module("hosted")
    assert not script.of("hosted", "daemon")[0].running and not script.of("hosted")[0].running
    assert (await m.status("n1")).bundles == []


async def test_an_upgrade_replaces_the_service_with_the_new_versions(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/daemon", "running")
    await m.modules("n1").add_module(placement(hosted(tmp_path, version="0.2.0")))
    await m.bundle_state("n1", "hosted/daemon", "running")
    old, new = script.of("hosted", "daemon")
    assert not old.running and new.running
    assert "hosted-0.2.0" in new.spec.cwd  # type: ignore[union-attr]
    status = await m.status("n1")
    assert [b.bundle for b in status.bundles if b.module == "hosted"].count("daemon") == 1
    assert [(s.name, s.version) for s in status.modules] == [("hosted", "0.2.0")]


async def test_a_node_stop_stops_its_services(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", hosted(tmp_path), services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/daemon", "running")
    await m.stop("n1")
    assert not any(c.running for c in script.started)


async def test_a_step_runs_once_before_the_tools_and_services_start_and_not_again(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["hosted/migrate"] = [STEP_OK]
    script.modules["hosted/daemon"] = [DAEMON]
    folder = hosted(tmp_path, step=True)
    await m.start("n1", folder, services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/daemon", "running")
    await m.bundle_state("n1", "hosted/tools", "ready")
    first = [(c.spec.env["MESH_BUNDLE"]) for c in script.started]  # type: ignore[union-attr]
    assert first[0] == "migrate" and sorted(first[1:]) == ["daemon", "tools"], first
    assert record_path(m.tmp / "state-n1", "hosted", "migrate", "0.1.0").is_file()
    assert "migrate" not in [b.bundle for b in (await m.status("n1")).bundles]
    # The same version again (a node restart): its step ran already.
    await m.stop("n1")
    await m.start("n1", folder, services=NODE_RUNS)
    await m.bundle_state("n1", "hosted/tools", "ready")
    assert len(script.of("hosted", "migrate")) == 1


async def test_a_failing_step_refuses_its_module_naming_what_it_said(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["hosted/migrate"] = [
        Behaviour(exit_on_eof=False, exit_after=0, exit_code=3, stderr="migration failed: column x already exists")
    ]
    await m.start("n1", hosted(tmp_path, step=True), module_folder(tmp_path, "alpha"), services=NODE_RUNS)
    [problem] = (await m.status("n1")).problems
    assert problem.startswith("step hosted/migrate of hosted 0.1.0 failed: exit code 3") and (
        "column x already exists" in problem
    ), problem
    assert [c.spec.env["MESH_BUNDLE"] for c in script.of("hosted", "migrate")] == ["migrate"]  # type: ignore[union-attr]
    assert script.of("hosted") == [] and script.of("hosted", "daemon") == []
    with pytest.raises(nats.errors.NoRespondersError):
        await m.nc.request("mesh.tool.hosted.greet", b"{}", timeout=5)
    _, code = await m.call("mesh.tool.alpha.greet", {})  # the other module serves
    assert code is None


async def test_a_step_past_its_timeout_is_killed_and_refuses_its_module(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["hosted/migrate"] = [Behaviour(exit_on_eof=False)]  # never ends
    await m.start("n1", hosted(tmp_path, step=True, step_timeout_ms=100), services=NODE_RUNS)
    [problem] = (await m.status("n1")).problems
    assert "failed: timed out after 0.1 s (killed)" in problem, problem
    assert not script.of("hosted", "migrate")[0].running
    assert not record_path(m.tmp / "state-n1", "hosted", "migrate", "0.1.0").exists()


def packed(out: Path, version: str) -> list[Path]:
    """Module hosted at `version` as three real artifacts (step, service, tools), packed by the project's packer."""
    stage = out / f"stage-{version}"
    stage.mkdir(parents=True)
    (stage / "main.py").write_text("# the fake children run in the test's process\n")
    manifest = module_folder(out / "src", "hosted", extra=SERVICE + STEP.format(timeout_ms=2000), version=version)
    text = (manifest / "module.toml").read_text().replace('source = "."', 'source = "src"')
    kinds = {"migrate": "step", "daemon": "service", "tools": "tools"}
    return [
        pack(
            stage,
            ArtifactMeta(
                module="hosted",
                bundle=name,
                version=version,
                kind=kind,  # type: ignore[arg-type]
                language="python",
                entry=["python", "main.py"],
                manifest=text,
            ),
            out,
        )
        for name, kind in kinds.items()
    ]


async def test_a_delivered_version_whose_step_fails_is_refused_and_the_old_one_serves_on(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    failing = Behaviour(exit_on_eof=False, exit_after=0, exit_code=3, stderr="column x already exists")
    script.modules["hosted/migrate"] = [STEP_OK, failing]
    script.modules["hosted/daemon"] = [DAEMON]
    await m.start("n1", services=NODE_RUNS, membership=True)
    await deliver(m.nc, packed(tmp_path / "v1", "1.0.0"), "n1", None, lambda line: None)
    await m.bundle_state("n1", "hosted/tools", "ready", timeout=10)
    await m.bundle_state("n1", "hosted/daemon", "running")
    await deliver(m.nc, packed(tmp_path / "v2", "2.0.0"), "n1", None, lambda line: None)

    async def refused() -> list[str]:
        return [p for p in (await m.status("n1")).problems if "2.0.0 refused" in p]

    [problem] = await until(refused, "the refusal of 2.0.0", timeout=10)
    assert "step hosted/migrate of hosted 2.0.0 failed: exit code 3" in problem and "column x already exists" in problem
    status = await m.status("n1")
    assert [(s.name, s.version) for s in status.modules] == [("hosted", "1.0.0")]
    assert len(script.of("hosted")) == 1 and len(script.of("hosted", "daemon")) == 1  # nothing of 1.0.0 was touched
    assert all(c.running for c in script.of("hosted") + script.of("hosted", "daemon"))
    _, code = await m.call("mesh.tool.hosted.greet", {})
    assert code is None
