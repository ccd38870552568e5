"""A bound on how many lines one noisy child puts into the node's log."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("mesh.bundle")


class LogBudget:
    """At most `rate` lines a second pass; then one line a second says how many were dropped."""

    def __init__(self, key: str, what: str, rate: int = 200) -> None:
        self.key, self.what, self.rate = key, what, rate
        self.window = 0
        self.count = 0
        self.dropped = 0

    def take(self) -> bool:
        now = int(time.monotonic())
        if now != self.window:
            if self.dropped:
                log.warning(
                    "[%s] %d %s not logged (more than %d a second)", self.key, self.dropped, self.what, self.rate
                )
            self.window, self.count, self.dropped = now, 0, 0
        self.count += 1
        if self.count > self.rate:
            self.dropped += 1
            return False
        return True
