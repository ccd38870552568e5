"""ServiceRunner with a fake child: the tools bundles' restart policy, minus MCP.

The same loop (launcher/supervise.py) and policy (launcher/restart.py) as a tools bundle: up is
`running` without a handshake; exits restart at once, then back off, then fail; a reset brings
it back; a stop ends it. A real process is in tests/test_services.py.
"""

from __future__ import annotations

import asyncio

from launcher.process import ChildSpec
from launcher.service import ServiceRunner, ServiceSpec
from tests.support.fake_child import FAST_RESTART, Behaviour, Script, StateRecording


class Recording(StateRecording, ServiceRunner):
    """A service runner that keeps every state it went through, in order."""


def spec() -> ServiceSpec:
    return ServiceSpec("m", "daemon", "go", ChildSpec(argv=["fake"], cwd="/", env={}), FAST_RESTART, 0.1)


async def test_running_without_a_handshake_and_stopped(script: Script) -> None:
    script.default = Behaviour(handshake=False, exit_on_eof=False)  # speaks nothing: a service
    runner = Recording(spec())
    task = asyncio.get_running_loop().create_task(runner.run())
    await runner.reach("running")
    status = runner.status()
    assert (status.kind, status.runs, status.state, status.tools, status.restarts) == (
        "service",
        "node",
        "running",
        [],
        0,
    )
    assert status.pid == script.started[0].pid
    await runner.stop()
    await asyncio.wait_for(task, 2)
    assert runner.states == ["starting", "running", "stopped"] and runner.pid is None


async def test_a_dying_service_restarts_then_backs_off_then_fails_and_a_reset_brings_it_back(script: Script) -> None:
    script.default = Behaviour(handshake=False, exit_on_eof=False, exit_after=0.0, stderr="daemon: no config")
    runner = Recording(spec())
    task = asyncio.get_running_loop().create_task(runner.run())
    await runner.reach("failed")
    # As a tools bundle: the first restart at once, then backoff; max_restarts=3 in the window.
    assert runner.states[:4] == ["starting", "running", "starting", "running"]
    assert "backoff" in runner.states and runner.states.count("starting") == 4
    assert runner.restarts == 3 and runner.last_exit == "exit code 1"
    assert runner.last_error == "it said: daemon: no config"
    script.default = Behaviour(handshake=False, exit_on_eof=False)
    runner.request_restart()
    await runner.reach("running")
    assert len(script.started) == 5
    # An operator's restart of a running service shows `restarting` at once, then a new child.
    runner.request_restart()
    assert runner.state == "restarting"
    await runner.reach("running")
    assert len(script.started) == 6 and runner.states[-3:] == ["restarting", "starting", "running"]
    await runner.stop()
    await asyncio.wait_for(task, 2)
