"""Issue 9, the child's side, in-process: health with a busy child, garbage on stdout, a stop that
does not wait out a handshake or a build, an operator restart, bounded queues. FakeChild children.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import pytest

from launcher import errors
from launcher.bundle import HealthPolicy
from launcher.errors import BundleUnavailable
from launcher.process import ChildProcess, ChildSpec, _Lines
from launcher.session import Session
from tests.support.fake_child import Behaviour, RecordingRunner, Script, echo, runner_spec

GREET = b'"greet"'
# Pings every 50 ms, each given 50 ms, two misses kill: a deaf child is gone within about 0.2 s.
QUICK_PINGS = HealthPolicy(init_timeout_s=1, ping_interval_s=0.05, ping_timeout_s=0.05, ping_misses=2, stop_grace_s=0.1)


def run(runner: RecordingRunner) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(runner.run())


async def stop(runner: RecordingRunner, task: asyncio.Task[None]) -> None:
    await runner.stop()
    await asyncio.wait_for(task, 2)


# --- item 9: a busy single-threaded child is not pinged to death --------------------------------
async def test_item9_busy_single_threaded_child_is_not_killed_by_missed_pings(script: Script) -> None:
    # It reads one message at a time: while a 0.6 s call runs, pings wait behind it (12 missed).
    script.default = Behaviour(answer=echo, single_threaded=True, call_seconds=0.6)
    runner = RecordingRunner(runner_spec(timeout_ms=3000, health=QUICK_PINGS))
    task = run(runner)
    await runner.reach("ready")
    loop = asyncio.get_running_loop()
    pending = runner.begin(GREET, b'{"n":1}', loop.time() + 3)
    assert pending is not None
    result = await runner.finish(pending)
    assert b"greet" in bytes(result)
    assert len(script.started) == 1 and runner.restarts == 0, runner.last_error
    await stop(runner, task)


async def test_item9_once_its_call_is_past_its_timeout_a_deaf_child_is_killed(script: Script) -> None:
    # The rule's other half: the call's timeout bounds the grace; after it, missed pings count again.
    script.children = [Behaviour(answer=echo, single_threaded=True, call_seconds=60)]
    runner = RecordingRunner(runner_spec(timeout_ms=300, health=QUICK_PINGS))
    task = run(runner)
    await runner.reach("ready")
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending = runner.begin(GREET, b"{}", started + 0.3)
    assert pending is not None
    with pytest.raises(Exception) as timed_out:
        await runner.finish(pending)
    assert type(timed_out.value).__name__ == "CallTimedOut"
    async with asyncio.timeout(2):
        while len(script.started) < 2:
            await asyncio.sleep(0.01)
    killed_after = loop.time() - started
    assert "stopped answering ping" in (runner.last_error or "")
    print(f"deaf single-threaded child killed {killed_after:.2f} s after its 0.3 s call began")
    await stop(runner, task)


# --- item 7: garbage on stdout is rate-limited and is no sign of life -----------------------------
async def test_item7_garbage_lines_are_logged_within_a_budget(caplog: pytest.LogCaptureFixture) -> None:
    session = Session("m/tools")
    caplog.set_level(logging.WARNING, logger="mesh.session")
    for i in range(5000):
        session.feed(b"not json %d" % i)
    warnings = [r for r in caplog.records if r.name == "mesh.session"]
    print(f"5000 garbage lines: {len(warnings)} log lines")
    assert session.skipped_lines == 5000
    assert len(warnings) <= 201, len(warnings)


async def test_item7_a_child_writing_garbage_but_not_answering_ping_is_killed(script: Script) -> None:
    script.children = [Behaviour(answer=echo, answers_ping=False, garbage_every=0.01)]
    runner = RecordingRunner(runner_spec(health=QUICK_PINGS))
    task = run(runner)
    async with asyncio.timeout(3):
        while len(script.started) < 2:
            await asyncio.sleep(0.01)
    assert "stopped answering ping" in (runner.last_error or "")
    await stop(runner, task)


# --- item 14: stop interrupts a handshake or a build at once -------------------------------------
async def test_item14_stop_interrupts_a_handshake_at_once(script: Script, caplog: pytest.LogCaptureFixture) -> None:
    script.default = Behaviour(handshake=False)
    slow = HealthPolicy(init_timeout_s=20, ping_interval_s=30, ping_timeout_s=1, ping_misses=2, stop_grace_s=0.1)
    runner = RecordingRunner(runner_spec(health=slow))
    task = run(runner)
    await runner.reach("starting")
    await asyncio.sleep(0.05)
    began = time.monotonic()
    await stop(runner, task)
    took = time.monotonic() - began
    print(f"stop during a handshake took {took * 1000:.0f} ms")
    assert took < 0.5
    assert runner.state == "stopped"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_item14_stop_interrupts_a_build_at_once(script: Script) -> None:
    async def slow_build() -> ChildSpec:
        await asyncio.sleep(30)
        return ChildSpec(argv=["fake"], cwd="/", env={})

    runner = RecordingRunner(runner_spec(prepare=slow_build))
    task = run(runner)
    await runner.reach("building")
    began = time.monotonic()
    await stop(runner, task)
    took = time.monotonic() - began
    print(f"stop during a build took {took * 1000:.0f} ms")
    assert took < 0.5 and runner.state == "stopped"


# --- item 15: an operator restart shows in status; calls ride over it ----------------------------
async def test_item15_operator_restart_shows_restarting_and_a_call_rides_over_it(script: Script) -> None:
    script.default = Behaviour(answer=echo, handshake_after=0.1)
    runner = RecordingRunner(runner_spec())
    task = run(runner)
    await runner.reach("ready")
    first = script.started[0]
    runner.request_restart()
    assert runner.status().state == "restarting"
    loop = asyncio.get_running_loop()
    assert runner.begin(GREET, b'{"during":"restart"}', loop.time() + 2) is None  # not written to the old child
    pending = await runner.begin_when_ready(GREET, b'{"during":"restart"}', loop.time() + 2)
    result = await runner.finish(pending)
    assert b"during" in bytes(result)
    assert len(script.started) == 2 and first.exited.done()
    assert runner.status().state == "ready" and runner.restarts == 1
    await stop(runner, task)


# --- item 3: the calls waiting for a slot are bounded in count and bytes -------------------------
async def test_item3_calls_waiting_for_a_slot_are_bounded_in_count_and_bytes(script: Script) -> None:
    script.default = Behaviour(answer=echo, call_seconds=0.3)
    runner = RecordingRunner(runner_spec(max_in_flight=1, max_waiting=2, max_waiting_bytes=1000))
    task = run(runner)
    await runner.reach("ready")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2
    first = runner.begin(GREET, b"{}", deadline)
    assert first is not None
    waiting = [asyncio.ensure_future(runner.begin_when_ready(GREET, b'{"w":%d}' % i, deadline)) for i in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(errors.BundleOverloaded) as full:
        await runner.begin_when_ready(GREET, b"{}", deadline)
    assert (full.value.in_flight, full.value.limit, full.value.waiting) == (1, 1, 2)
    await runner.finish(first)
    for w in waiting:
        await runner.finish(await w)
    # Bytes: one call too large to wait is refused even with room in the count.
    first = runner.begin(GREET, b"{}", loop.time() + 2)
    assert first is not None
    with pytest.raises(errors.BundleOverloaded) as heavy:
        await runner.begin_when_ready(GREET, b'{"x":"' + b"y" * 2000 + b'"}', loop.time() + 2)
    assert heavy.value.waiting_bytes_limit == 1000
    await runner.finish(first)
    await stop(runner, task)


# --- item 2: a broken pipe while answering one line loses none of the others ---------------------
def test_item2_a_handler_failing_with_a_broken_pipe_loses_no_line_of_the_chunk() -> None:
    seen: list[bytes] = []

    def handler(line: bytes) -> None:
        seen.append(line)
        if line.startswith(b"ping"):
            raise BrokenPipeError("the child's stdin is closed")

    lines = _Lines(handler, 1024)
    lines.feed(b"ping 1\nanswer 1\nping 2\nanswer 2\npart")
    lines.feed(b"ial\n")
    assert seen == [b"ping 1", b"answer 1", b"ping 2", b"answer 2", b"partial"]


async def test_item3_a_bundle_that_is_down_is_still_unavailable_not_overloaded(script: Script) -> None:
    script.default = Behaviour(exit_after=0.0)
    runner = RecordingRunner(runner_spec(max_in_flight=1, max_waiting=0))
    task = run(runner)
    await runner.reach("failed")
    with pytest.raises(BundleUnavailable):
        await runner.begin_when_ready(GREET, b"{}", asyncio.get_running_loop().time() + 1)
    await stop(runner, task)


async def _spawn(code: str, limit: int) -> tuple[ChildProcess, list[bytes]]:
    lines: list[bytes] = []
    spec = ChildSpec(argv=[sys.executable, "-c", code], cwd="/", env={}, max_stdin_bytes=limit)
    return await ChildProcess.spawn(spec, lines.append, lambda line: None), lines


async def test_item2_a_child_that_does_not_read_its_stdin_is_killed_past_the_bound() -> None:
    child, _ = await _spawn("import time; time.sleep(60)", 1024 * 1024)
    message = b"x" * 4095 + b"\n"
    written = 0
    with pytest.raises(BrokenPipeError) as full:
        for _ in range(10_000):  # 40 MB if nothing stopped it
            child.write(message)
            written += len(message)
            await asyncio.sleep(0)  # one message a turn: each write checks what is still unread
    status = await asyncio.wait_for(child.wait(), 5)
    child.close()
    print(f"killed after {written} bytes written to a child that reads nothing")
    assert "does not read its stdin" in str(full.value) and child.broken_reason is not None
    assert status == -9 and written < 2 * 1024 * 1024


async def test_item2_one_message_larger_than_the_bound_reaches_a_child_that_reads() -> None:
    code = "import sys; line = sys.stdin.buffer.readline(); print(len(line), flush=True)"
    child, lines = await _spawn(code, 1024 * 1024)
    child.write(b"y" * (3 * 1024 * 1024) + b"\n")
    assert await asyncio.wait_for(child.wait(), 10) == 0
    child.close()
    assert lines == [b"%d" % (3 * 1024 * 1024 + 1)] and child.broken_reason is None
