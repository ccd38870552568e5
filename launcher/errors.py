"""Errors of the launcher, with the facts in fields. The runtime renders them at the edge."""

from __future__ import annotations

from typing import Any


class LauncherError(Exception):
    pass


class SessionClosed(LauncherError):
    """The child's session ended (exit, broken pipe) while a call was in flight."""

    def __init__(self, bundle: str, reason: str) -> None:
        self.bundle, self.reason = bundle, reason
        super().__init__(f"{bundle}: {reason}")


class ProtocolError(LauncherError):
    """The child answered, but not as MCP says it must."""

    def __init__(self, bundle: str, reason: str) -> None:
        self.bundle, self.reason = bundle, reason
        super().__init__(f"{bundle}: {reason}")


# Where a call's time went when it timed out: the one deadline set at its arrival covers all three.
WAITED_FOR_START, WAITED_FOR_SLOT, WAITED_FOR_CHILD = "start", "slot", "child"


class CallTimedOut(LauncherError):
    def __init__(self, bundle: str, what: str, timeout_ms: int, waited_for: str = WAITED_FOR_CHILD) -> None:
        self.bundle, self.what, self.timeout_ms, self.waited_for = bundle, what, timeout_ms, waited_for
        super().__init__(f"{bundle}: {what} took longer than {timeout_ms} ms (waiting for the {waited_for})")


class BundleOverloaded(LauncherError):
    """No free slot, and the calls already waiting for one fill the bound: the facts for a 503."""

    def __init__(self, bundle: str, in_flight: int, limit: int, waiting: int, waiting_bytes_limit: int) -> None:
        self.bundle, self.in_flight, self.limit = bundle, in_flight, limit
        self.waiting, self.waiting_bytes_limit = waiting, waiting_bytes_limit
        super().__init__(f"bundle {bundle} is overloaded: {in_flight} in flight of {limit}, {waiting} waiting")


class ChildError(LauncherError):
    """A JSON-RPC error the child answered (e.g. unknown tool, invalid params)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code, self.message, self.data = code, message, data
        super().__init__(f"JSON-RPC error {code}: {message}")


class BundleUnavailable(LauncherError):
    """A call reached a bundle that is not serving: the facts for a 503."""

    def __init__(
        self,
        bundle: str,
        state: str,
        last_exit: str | None,
        stderr_tail: list[str],
        reason: str = "",
    ) -> None:
        self.bundle, self.state, self.last_exit, self.stderr_tail, self.reason = (
            bundle,
            state,
            last_exit,
            stderr_tail,
            reason,
        )
        super().__init__(f"bundle {bundle} is {state}" + (f": {reason}" if reason else ""))
