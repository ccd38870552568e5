"""One agent of the handoff acceptance (seed 002): a process that knows nothing of the other
agent and touches only the `handoff` seat. Run twice, as two OS processes with two identities.

    handoff_agent.py a --workdir DIR --bus nats://alice:pw@127.0.0.1:4222
    handoff_agent.py b --workdir DIR --bus nats://bob:pw@127.0.0.1:4222 [--find watch]
    (--relay instead of --bus: calls go as JSON lines on stdout, results come back on stdin)

Agent A has a task in two halves (DIR/task.json): half 1 it does alone; half 2 needs the scale
factor that only B's calibration file holds. A looks where it can, then opens entry 1 and waits
on it; with the answer it finishes half 2. Then it opens entry 2, a question nobody can answer,
replies once to the follow-up and waits for the entry to end. Agent B polls handoff.list for
open entries (or, with --find watch, long-polls handoff.watch), claims each, answers what its
own files tell it, and otherwise asks one follow-up and blocks. Each writes what it did to DIR/report.json. Neither ever escalates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

SEAT = "handoff"
FINAL = {"resolved", "blocked", "escalated"}


class Refused(Exception):
    """The desk answered with a tool error (isError) or the node with a runtime error."""


class Bus:
    """The seat's verbs as requests on mesh.seat.handoff.<verb>, on this agent's own connection."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.nc: Any = None

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(self.url, name=self.name)

    async def call(self, verb: str, arguments: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        msg = await self.nc.request(f"mesh.seat.{SEAT}.{verb}", json.dumps(arguments).encode(), timeout=timeout)
        if msg.headers and "Nats-Service-Error-Code" in msg.headers:
            raise Refused(f"{verb}: {msg.headers['Nats-Service-Error-Code']} {msg.data.decode(errors='replace')}")
        return json.loads(msg.data)

    async def stop(self) -> None:
        await self.nc.close()


class Relay:
    """The verbs as JSON lines to whoever runs this process (it stamps the caller by the pipe)."""

    async def start(self) -> None:
        pass

    async def call(self, verb: str, arguments: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        print(json.dumps({"verb": verb, "arguments": arguments}), flush=True)
        line = await asyncio.wait_for(asyncio.to_thread(sys.stdin.readline), timeout)
        if not line:
            raise Refused("the relay closed")
        return json.loads(line)

    async def stop(self) -> None:
        pass


class Agent:
    def __init__(self, transport: Bus | Relay, workdir: Path) -> None:
        self.transport = transport
        self.workdir = workdir
        self.report: dict[str, Any] = {"calls": []}

    async def verb(self, verb: str, **arguments: Any) -> dict[str, Any]:
        result = await self.transport.call(verb, arguments, timeout=arguments.get("timeout_s", 0) + 10)
        self.report["calls"].append(verb)
        if result.get("isError"):
            raise Refused(f"{verb}: {result['content'][0]['text']}")
        return result["structuredContent"]

    async def wait_final(self, entry_id: str, on_change: Any = None, limit_s: float = 60) -> dict[str, Any]:
        """Wait (as the opener: the entry is blocking meanwhile) until the entry is final."""
        deadline = time.monotonic() + limit_s
        entry = await self.verb("get", id=entry_id)
        while entry["state"] not in FINAL:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{entry_id} still {entry['state']} after {limit_s}s")
            if on_change:
                await on_change(entry)
            entry = (await self.verb("wait", id=entry_id, timeout_s=2))["entry"]
        return entry


# --- agent A --------------------------------------------------------------------------------
async def agent_a(agent: Agent) -> None:
    task = json.loads((agent.workdir / "task.json").read_text())
    half1 = sum(task["numbers"])  # half 1: A can do it alone
    agent.report["half1"] = half1

    # Half 2 needs the scale factor. A looks everywhere it can reach first: that is `versucht`.
    looked = sorted(str(p.relative_to(agent.workdir)) for p in agent.workdir.rglob("*") if p.is_file())
    known = [
        p
        for p in agent.workdir.rglob("*")
        if p.is_file() and "scale_factor" in p.read_text(errors="replace") and p.name != "task.json"
    ]
    agent.report["could_answer_alone"] = bool(known)
    if known:
        raise SystemExit("A found the factor itself: the question would not be real")
    first = await agent.verb(
        "open",
        projekt=task["projekt"],
        frage="What is the scale_factor in the calibration file of the line?",
        versucht=f"searched my own workdir ({', '.join(looked)}); the calibration file is not there",
        benoetigt="the scale_factor as a number",
    )
    agent.report["entry1"] = first["id"]
    entry = await agent.wait_final(first["id"])
    agent.report["entry1_state"] = entry["state"]
    if entry["state"] != "resolved":
        raise SystemExit(f"entry 1 ended {entry['state']}; half 2 cannot be done")
    number = re.search(r"-?\d+(?:\.\d+)?", entry["antwort"])
    if number is None:
        raise SystemExit(f"entry 1's answer {entry['antwort']!r} holds no number; half 2 cannot be done")
    factor = float(number.group())  # half 2 uses the answer
    half2 = half1 * factor
    agent.report["half2"] = half2
    (agent.workdir / "output.txt").write_text(
        f"half 1: sum = {half1}\nhalf 2: sum * scale_factor {factor:g} = {half2:g}\n"
    )

    second = await agent.verb(
        "open",
        projekt=task["projekt"],
        frage="What did the customer decide in yesterday's call about the deadline?",
        versucht="read my notes and the task; the call is not in them",
        benoetigt="the decision, one sentence",
    )
    agent.report["entry2"] = second["id"]
    replied = False

    async def reply_once(e: dict[str, Any]) -> None:
        nonlocal replied
        if e["rueckfrage"] and not e["rueckfrage_antwort"] and not replied:
            await agent.verb("reply", id=e["id"], antwort="the call with the customer's buyer, yesterday 14:00")
            replied = True

    entry = await agent.wait_final(second["id"], on_change=reply_once)
    agent.report["entry2_state"] = entry["state"]
    agent.report["replied"] = replied


# --- agent B --------------------------------------------------------------------------------
class Finder:
    """How B finds open work: by polling handoff.list, or by handoff.watch, a long poll that
    returns as soon as an open entry appears (its `after` carried from one call to the next)."""

    def __init__(self, agent: Agent, how: str) -> None:
        self.agent, self.how, self.after = agent, how, 0

    async def open_entries(self) -> list[dict[str, Any]]:
        if self.how == "poll":
            entries: list[dict[str, Any]] = (await self.agent.verb("list", state="open"))["entries"]
            if not entries:
                await asyncio.sleep(0.1)
            return entries
        page = await self.agent.verb("watch", state="open", after=self.after, timeout_s=5)
        self.after = page["after"]
        return list(page["entries"])


async def agent_b(agent: Agent, expect: int, find: str, limit_s: float = 60) -> None:
    calibration = json.loads((agent.workdir / "calibration.json").read_text())
    handled: list[dict[str, Any]] = []
    finder = Finder(agent, find)
    deadline = time.monotonic() + limit_s
    while len(handled) < expect:
        if time.monotonic() > deadline:
            raise TimeoutError(f"found {len(handled)} of {expect} entries with {find}")
        done = {h["id"] for h in handled}
        entries = [e for e in await finder.open_entries() if e["id"] not in done]  # B finds work only itself
        if not entries:
            continue
        entry = await agent.verb("claim", id=entries[0]["id"])
        handled.append({"id": entry["id"], "frage": entry["frage"], "priority_seen": entry["priority"]})
        if "scale_factor" in entry["frage"]:
            await agent.verb("answer", id=entry["id"], antwort=f"scale_factor = {calibration['scale_factor']}")
            handled[-1]["did"] = "answered"
            continue
        # B cannot reach this; one follow-up, then it blocks: no ping-pong.
        asked = await agent.verb("ask", id=entry["id"], rueckfrage="Which call do you mean: who took part, and when?")
        while not asked["rueckfrage_antwort"]:
            asked = (await agent.verb("wait", id=entry["id"], timeout_s=2))["entry"]
        await agent.verb("block", id=entry["id"], grund="I have no record of that call; nobody I can reach took part")
        handled[-1]["did"] = "blocked"
    agent.report["handled"] = handled


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["a", "b"])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--bus")
    parser.add_argument("--relay", action="store_true")
    parser.add_argument("--expect", type=int, default=2, help="B: how many entries to handle")
    parser.add_argument("--find", choices=["poll", "watch"], default="poll", help="B: how it finds open entries")
    args = parser.parse_args()
    transport: Bus | Relay = Bus(args.bus, f"handoff-agent-{args.role}") if args.bus else Relay()
    agent = Agent(transport, args.workdir)
    await transport.start()
    try:
        if args.role == "a":
            await agent_a(agent)
        else:
            await agent_b(agent, args.expect, args.find)
        agent.report["ok"] = True
    except (Refused, TimeoutError, SystemExit) as e:
        agent.report["ok"] = False
        agent.report["error"] = str(e)
    finally:
        (args.workdir / "report.json").write_text(json.dumps(agent.report, indent=1))
        await transport.stop()
    return 0 if agent.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
