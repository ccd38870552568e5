"""One call's progress and keepalive frames to its caller (docs/bus.md), in order, bounded."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING, Awaitable, TypeVar

import anyio
import msgspec
from nats.aio.client import Client

from runtime.wire.callproto import FRAME, FRAME_KEEPALIVE, FRAME_PROGRESS, KeepaliveFrame, ProgressFrame

if TYPE_CHECKING:
    from runtime.calls.desk import CallDesk

log = logging.getLogger("mesh.calls")

T = TypeVar("T")

FRAMES_WAITING = 256  # progress frames waiting to be published per call; past it the oldest go

_encode = msgspec.json.Encoder().encode


class Progress:
    """One call's progress frames to its reply subject, in order, with keepalives between them.

    The first keepalive goes at once (docs/bus.md); after it a timer handle, not a task, waits for
    the next one, and a publishing task runs only while there are frames or a keepalive to send:
    every face call asks for progress, and a task group with a pump task per call cost the node
    about 100 us a call (most calls end long before their first frame or second keepalive).
    """

    def __init__(self, nc: Client, reply: str, keepalive_s: float, owner: object, desk: CallDesk | None = None) -> None:
        self.nc, self.reply, self.keepalive_s, self.owner = nc, reply, keepalive_s, owner
        self.desk = desk  # counts the frames sent (metrics)
        self.frames: collections.deque[bytes] = collections.deque(maxlen=FRAMES_WAITING)
        self.dropped = 0
        self.stopped = False  # the call was cancelled: nothing more goes to its caller
        self._started = time.monotonic()
        self._open = False  # while `during` runs: frames are published as they come
        self._keepalive_due = False
        self._timer: asyncio.TimerHandle | None = None
        self._publisher: asyncio.Task[None] | None = None  # owned by `during`: awaited before it returns

    def add(self, frame: ProgressFrame) -> None:
        if len(self.frames) == FRAMES_WAITING:
            self.dropped += 1
        self.frames.append(_encode(frame))
        self._publish_soon()

    async def during(self, work: Awaitable[T]) -> T:
        """Await `work` while frames are published; what is still waiting goes out before it returns.

        An error of `work` comes out as itself.
        """
        self._open = True
        # The first keepalive at once: the caller learns a node has its call, and the interval to expect.
        await self._keepalive()
        self._arm()
        if self.frames:
            self._publish_soon()
        try:
            return await work
        finally:
            self._open = False
            if self._timer is not None:
                self._timer.cancel()
            with anyio.CancelScope(shield=True):
                if self._publisher is not None and not self._publisher.done():
                    await asyncio.wait([self._publisher])
                await self._flush()
            if self.dropped:
                log.warning(
                    "%d progress frames to %s dropped: more than %d were waiting",
                    self.dropped,
                    self.reply,
                    FRAMES_WAITING,
                )

    def _arm(self) -> None:
        """The next keepalive, after `keepalive_s` without another frame."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.keepalive_s, self._keepalive_now)

    def _keepalive_now(self) -> None:
        self._keepalive_due = True
        self._publish_soon()

    def _publish_soon(self) -> None:
        if self._open and (self._publisher is None or self._publisher.done()):
            self._publisher = asyncio.get_running_loop().create_task(self._publish_due())

    async def _publish_due(self) -> None:
        # Until nothing is due: a frame added while this publishes is sent by this same task.
        while self._open and (self.frames or self._keepalive_due):
            if self.frames:
                await self._flush()
            else:
                self._keepalive_due = False
                await self._keepalive()
            self._arm()

    async def _keepalive(self) -> None:
        elapsed = int((time.monotonic() - self._started) * 1000)
        frame = KeepaliveFrame(elapsed_ms=elapsed, interval_ms=int(self.keepalive_s * 1000))
        await self._publish(_encode(frame), FRAME_KEEPALIVE)

    async def _flush(self) -> None:
        while self.frames:
            await self._publish(self.frames.popleft(), FRAME_PROGRESS)
            if self.desk is not None:
                self.desk.progress_frames += 1

    async def _publish(self, body: bytes, kind: str) -> None:
        if self.stopped:
            return
        try:
            await self.nc.publish(self.reply, body, headers={FRAME: kind})
        except Exception as e:  # the bus is gone: the final reply will say nothing either
            log.debug("progress frame to %s not sent: %s", self.reply, e)
