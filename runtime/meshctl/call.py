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
from nats.aio.client import Client

from runtime.client import CallError, MeshClient, NodeRefused
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


async def run_call(nc: Client, subject: str, body: bytes, timeout_s: float, as_json: bool) -> int:
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
