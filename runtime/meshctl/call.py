"""`meshctl call`: one call through the client library, its progress shown, Ctrl-C cancels it.

On a terminal (stderr) progress is a bar redrawn in place; otherwise one line per frame
(`progress 3/10 step 3`), so logs and tests read it. The result goes to stdout as before.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, TextIO

import anyio
import msgspec
from nats.aio.client import Client

from runtime.client import AskFrame, AskRefused, CallError, MeshClient, NodeRefused
from runtime.client_tasks import AskHandler, ask_text
from runtime.meshctl.errors import MeshError
from runtime.wire.callproto import ProgressFrame
from toolchains.progress import LiveLine

BAR_WIDTH = 30
EXIT_CANCELLED = 130  # what a shell reports for a command ended by SIGINT


class ProgressView:
    """Draws frames on `out`: a bar on a terminal, plain lines elsewhere."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.line = LiveLine(out)

    def __call__(self, frame: ProgressFrame) -> None:
        total = f"/{frame.total:g}" if frame.total is not None else ""
        message = f" {frame.message}" if frame.message else ""
        if not self.tty:
            print(f"progress {frame.progress:g}{total}{message}", file=self.out, flush=True)
            return
        if frame.total:
            done = max(0, min(BAR_WIDTH, int(BAR_WIDTH * frame.progress / frame.total)))
            bar = "[" + "#" * done + "." * (BAR_WIDTH - done) + "] "
        else:
            bar = ""
        self.line.draw(f"{bar}{frame.progress:g}{total}{message}"[:196])  # 200 with the 4 characters of the redraw

    def end(self) -> None:
        self.line.clear()


def ways_out(body: dict[str, Any]) -> list[str]:
    """The `ways_out` of an error reply, checked: at most 10 lines of 500 printable characters."""
    error = body.get("error")
    found = error.get("ways_out") if isinstance(error, dict) else None
    if not isinstance(found, list):
        return []
    return ["".join(c for c in way[:500] if c.isprintable()) for way in found[:10] if isinstance(way, str)]


class Answers:
    """A tool's asks answered: from a file of answers in order (`--answers FILE`), or on the terminal.

    The file holds a JSON list; each item is an ElicitResult (`{"action": "accept", "content": {...}}`,
    `{"action": "decline"}`) or, as a shorthand, the content object of an accept. Sampling and roots
    are refused: meshctl has no model and offers no roots.
    """

    def __init__(self, given: list[Any] | None, out: TextIO) -> None:
        self.given, self.out, self.used = given, out, 0

    @classmethod
    def from_file(cls, path: str, out: TextIO) -> Answers:
        try:
            data = json.loads(open(path, encoding="utf-8").read())  # noqa: SIM115 (read whole, closed at once)
        except (OSError, ValueError) as e:
            raise MeshError(f"--answers {path}: not a readable JSON file ({e}); give a JSON list of answers") from None
        if not isinstance(data, list) or not all(isinstance(a, dict) for a in data):
            raise MeshError(
                f'--answers {path}: must be a JSON list of objects, e.g. [{{"ok": true}}, {{"action": "decline"}}]'
            )
        return cls(data, out)

    async def __call__(self, frame: AskFrame) -> dict[str, Any]:
        if frame.method != "elicitation/create":
            raise AskRefused(
                f"meshctl call does not answer {frame.method}: it has no model and offers no roots", -32601
            )
        params = ask_text(frame)
        message = str(params.get("message", ""))[:2000]
        print(f"the tool asks: {message}", file=self.out, flush=True)
        if self.given is not None:
            if self.used >= len(self.given):
                print("meshctl: --answers has no answer left; declining", file=self.out)
                return {"action": "decline"}
            answer = self.given[self.used]
            self.used += 1
            return (
                answer
                if answer.get("action") in ("accept", "decline", "cancel")
                else {"action": "accept", "content": answer}
            )
        return await anyio.to_thread.run_sync(self._prompt, params)

    def _prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("mode") == "url":
            print(f"open {str(params.get('url', ''))[:2000]}", file=self.out, flush=True)
            return {"action": "accept" if _ask("done? [y/N] ").lower().startswith("y") else "decline"}
        schema = params.get("requestedSchema") or {}
        props = schema.get("properties") if isinstance(schema, dict) else None
        required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
        content: dict[str, Any] = {}
        print("(answer each field; !decline or !cancel ends the form)", file=self.out, flush=True)
        for name, spec in (props or {}).items():
            spec = spec if isinstance(spec, dict) else {}
            kind = spec.get("type", "string")
            hint = f" {spec['description'][:200]}" if isinstance(spec.get("description"), str) else ""
            choices = f" {spec['enum']}" if isinstance(spec.get("enum"), list) else ""
            while True:
                text = _ask(f"{name} ({kind}){choices}{hint}: ").strip()
                if text in ("!decline", "!cancel"):
                    return {"action": text[1:]}
                if not text and name not in required:
                    break
                value = _typed(kind, text)
                if value is not None:
                    content[name] = value
                    break
                print(f"  {name} takes a {kind}", file=self.out, flush=True)
        return {"action": "accept", "content": content}


def _ask(prompt: str) -> str:
    try:
        return input(prompt)
    except EOFError:
        return "!cancel"


def _typed(kind: str, text: str) -> Any:
    if kind == "boolean":
        return {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}.get(text.lower())
    if kind in ("number", "integer"):
        try:
            return int(text) if kind == "integer" else float(text)
        except ValueError:
            return None
    return text or None


async def run_call(
    nc: Client, subject: str, body: bytes, timeout_s: float, as_json: bool, answers: AskHandler | None = None
) -> int:
    """Call, print the result; the exit code (0 ok, 1 failed, 130 cancelled by Ctrl-C)."""
    view = ProgressView(sys.stderr)
    caller = MeshClient(nc)
    interrupted = False
    data = b""
    error: CallError | None = None
    async with anyio.create_task_group() as tg:

        async def on_sigint() -> None:
            nonlocal interrupted
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    interrupted = True
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(on_sigint)
        try:
            data = await caller.call(
                subject,
                body,
                timeout_s=timeout_s,
                on_progress=view,
                cancel_reason="cancelled by the user (Ctrl-C on meshctl call)",
                # A script's own trace (W3C's environment carrier), else the call starts one.
                traceparent=os.environ.get("TRACEPARENT"),
                tracestate=os.environ.get("TRACESTATE"),
                on_ask=answers,
            )
        except CallError as e:
            error = e
        tg.cancel_scope.cancel()
    view.end()
    await caller.close()
    if interrupted:
        print(f"meshctl: cancelled {subject}", file=sys.stderr)
        return EXIT_CANCELLED
    if error is not None:
        print(f"meshctl: {error.code} {error.message}", file=sys.stderr)
        if as_json and isinstance(error, NodeRefused):
            print(json.dumps(error.body))
        else:
            for way in ways_out(error.body):
                print(f"  way out: {way}", file=sys.stderr)
        return 1
    if as_json:
        print(data.decode())
        return 0
    result = json.loads(data)
    texts = [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]
    if texts:
        print("\n".join(texts))
    if result.get("structuredContent") is not None:
        print(json.dumps(result["structuredContent"], indent=2))
    return 1 if result.get("isError") else 0


async def run_detached(nc: Client, subject: str, body: bytes, timeout_s: float, wait_s: float) -> int:
    """A detached call: its task printed as JSON (after `wait_s` of waiting for its end, when given)."""
    caller = MeshClient(nc)
    try:
        record = await caller.start(subject, body, timeout_s=timeout_s)
        if wait_s > 0:
            record = await caller.task_result(record.task, wait_s=wait_s)
    except CallError as e:
        print(f"meshctl: {e.code} {e.message}", file=sys.stderr)
        return 1
    print(msgspec.json.encode(record).decode())
    return 0 if record.state in ("working", "input_required", "completed") else 1


async def run_task(nc: Client, action: str, task: str | None, wait_s: float) -> int:
    """`meshctl task get|result|list|cancel`: one task verb, its answer printed as JSON."""
    caller = MeshClient(nc)
    try:
        if action == "list":
            print(msgspec.json.encode(await caller.tasks()).decode())
            return 0
        if task is None:
            raise MeshError(f"meshctl task {action} needs a task id (meshctl task list shows yours)")
        if action == "get":
            record = await caller.task(task)
        elif action == "cancel":
            record = await caller.cancel(task)
        else:
            record = await caller.task_result(task, wait_s=wait_s)
    except CallError as e:
        print(f"meshctl: {e.code} {e.message}", file=sys.stderr)
        return 1
    print(msgspec.json.encode(record).decode())
    return 0
