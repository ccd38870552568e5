"""When a supervised child that ended starts again: the one restart policy of every child the
node supervises (a tools bundle, a service bundle it runs itself).

The first restart after a stable run is immediate; after that the delay doubles from
`backoff_initial_s` up to `backoff_max_s`, with jitter (50-100 %); more than `max_restarts`
exits within `window_s` and the child is failed until an operator resets it.
"""

from __future__ import annotations

import collections
import random

import msgspec


class RestartPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When a child that ended is started again; also the `[restart]` table of the node's config."""

    max_restarts: int = 5  # within window_s; one more and the bundle is failed
    window_s: float = 60.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 30.0
    stable_after_s: float = 10.0  # a child that served this long starts again at once


class GiveUp(msgspec.Struct, frozen=True):
    """Too many exits within the window: the child stays down until reset."""

    exits: int  # restarts counted in the window (the exit that gave up not included)
    window_s: float


class Restarts:
    """The exits of one child and what follows each: a delay before the next start, or give up."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._recent: collections.deque[float] = collections.deque()  # exit times within the window
        self._failures = 0  # exits since the last stable run

    def reset(self) -> None:
        """An operator's reset: the count starts again."""
        self._recent.clear()
        self._failures = 0

    def after_exit(self, now: float, up_since: float | None) -> float | GiveUp:
        """The child ended at `now` (loop clock) having been up (ready, running) since `up_since`,
        if it ever was: the delay before the next start, or GiveUp."""
        policy = self.policy
        if up_since is not None and now - up_since >= policy.stable_after_s:
            self._failures = 0
        self._recent.append(now)
        while self._recent and now - self._recent[0] > policy.window_s:
            self._recent.popleft()
        if len(self._recent) > policy.max_restarts:
            return GiveUp(len(self._recent) - 1, policy.window_s)
        delay = 0.0
        if self._failures > 0:
            base = min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** (self._failures - 1))
            delay = base * random.uniform(0.5, 1.0)
        self._failures += 1
        return delay
