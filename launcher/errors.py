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


class CallTimedOut(LauncherError):
    def __init__(self, bundle: str, what: str, timeout_ms: int) -> None:
        self.bundle, self.what, self.timeout_ms = bundle, what, timeout_ms
        super().__init__(f"{bundle}: {what} took longer than {timeout_ms} ms")


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
