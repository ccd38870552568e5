"""The bound on a tools child's calls in flight, and on the calls waiting for a slot."""

from __future__ import annotations

import asyncio
import collections


class Slots:
    """A bound on calls in flight; waiting is cheap when there is room (the common case).

    The waiters are bounded too (`max_waiting` calls, `max_waiting_bytes` of their arguments).
    """

    def __init__(self, size: int, max_waiting: int, max_waiting_bytes: int) -> None:
        self.size = size
        self.used = 0
        self.max_waiting, self.max_waiting_bytes = max_waiting, max_waiting_bytes
        self.waiting_bytes = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def room_to_wait(self, size: int) -> bool:
        return len(self._waiters) < self.max_waiting and self.waiting_bytes + size <= self.max_waiting_bytes

    def try_acquire(self) -> bool:
        if self.used < self.size and not self._waiters:
            self.used += 1
            return True
        return False

    async def acquire(self, timeout: float, size: int = 0) -> bool:
        if self.used < self.size and not self._waiters:
            self.used += 1
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.waiting_bytes += size
        got = False
        try:
            # Not wait_for: on 3.11 it swallows a cancel that comes as the slot is handed over, and
            # a node's stop (every call cancelled at once) then wrote a call to the child instead.
            async with asyncio.timeout(timeout):
                await fut
            got = True
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting_bytes -= size
            if not got:
                if fut.done() and not fut.cancelled():
                    self.release()  # handed over as this waiter gave up (timeout, cancel): on to the next
                else:
                    try:
                        self._waiters.remove(fut)
                    except ValueError:
                        pass

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over: `used` stays the same
                return
        self.used -= 1
