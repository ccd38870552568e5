"""The bound on a child's calls in flight: a slot handed to a waiter that gives up at that instant
is never lost, and a waiter cancelled then is cancelled (not given the slot)."""

from __future__ import annotations

import asyncio

import pytest

from launcher.slots import Slots


async def test_a_waiter_cancelled_as_the_slot_is_handed_to_it_stays_cancelled_and_the_slot_goes_on() -> None:
    slots = Slots(1, max_waiting=4, max_waiting_bytes=1024)
    assert slots.try_acquire()
    first = asyncio.create_task(slots.acquire(30))
    second = asyncio.create_task(slots.acquire(30))
    await asyncio.sleep(0)  # both wait
    assert slots.waiting == 2
    # A node's stop cancels every call at once: the holder frees its slot, handing it to `first`,
    # in the same turn as `first` is cancelled.
    slots.release()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1) is True  # the slot went on to the next waiter
    assert (slots.used, slots.waiting) == (1, 0)
    slots.release()
    assert slots.used == 0


async def test_a_waiter_timing_out_as_the_slot_is_handed_to_it_passes_the_slot_on() -> None:
    slots = Slots(1, max_waiting=4, max_waiting_bytes=1024)
    assert slots.try_acquire()
    assert await slots.acquire(0.01, 10) is False
    assert (slots.used, slots.waiting, slots.waiting_bytes) == (1, 0, 0)
    slots.release()
    assert slots.used == 0 and slots.try_acquire()
