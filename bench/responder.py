"""NATS alone: a nats-py responder that answers every request at once.

`python bench/responder.py URL SUBJECT`. It subscribes the way the node does (a callback, in a
queue group) and answers with a CallToolResult of the size the echo child's answer has, so the
"NATS alone" leg carries the same bytes as the node's path.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import nats

REPLY = b'{"content":[{"type":"text","text":"{\\"text\\":\\"hello\\"}"}],"isError":false}'


async def main(url: str, subject: str) -> None:
    nc = await nats.connect(url, name="bench-responder")

    async def answer(msg: nats.aio.msg.Msg) -> None:
        await nc.publish(msg.reply, REPLY)

    await nc.subscribe(subject, queue="bench", cb=answer)
    await nc.flush()
    print("responder ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
