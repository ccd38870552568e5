"""What any runner says of its bundle in the node's status: one `BundleStatus` for tools bundles,
service bundles the node runs, and systemd units alike."""

from __future__ import annotations

from typing import Protocol

import msgspec


class BundleStatus(msgspec.Struct):
    module: str
    bundle: str
    language: str
    state: str
    pid: int | None
    restarts: int
    tools: list[str]
    last_exit: str | None
    last_error: str | None
    protocol_version: str | None
    in_flight: int
    calls: int
    stderr_tail: list[str]
    kind: str = "tools"  # tools | service
    runs: str = "node"  # who runs it: node (supervised here) | systemd (a unit)
    state_for_s: float = 0.0  # how long it has been in `state` (e.g. how long a build has run)
    era: str | None = None  # "handshake" (initialize) or "stateless" (server/discover, 2026-07-28)
    # What its child runs confined with (launcher/sandbox.py `describe`): "landlock v7 + seccomp
    # + netns", or "none: <reason>"; "" before its first start.
    confinement: str = ""


class Lifecycle(Protocol):
    """What every runner knows of its child's life, whoever runs the child (the node or systemd)."""

    state: str
    pid: int | None
    restarts: int
    last_exit: str | None
    last_error: str | None


def bundle_status(
    runner: Lifecycle,
    module: str,
    bundle: str,
    language: str,
    stderr_tail: list[str],
    *,
    kind: str = "tools",
    runs: str = "node",
    tools: list[str] | None = None,
    protocol_version: str | None = None,
    in_flight: int = 0,
    calls: int = 0,
    state_for_s: float = 0.0,
    era: str | None = None,
    confinement: str = "",
) -> BundleStatus:
    """A bundle's status: its runner's life, and the facts only a tools bundle has (none for a service)."""
    return BundleStatus(
        module=module,
        bundle=bundle,
        language=language,
        state=runner.state,
        pid=runner.pid,
        restarts=runner.restarts,
        tools=tools or [],
        last_exit=runner.last_exit,
        last_error=runner.last_error,
        protocol_version=protocol_version,
        in_flight=in_flight,
        calls=calls,
        stderr_tail=stderr_tail,
        kind=kind,
        runs=runs,
        state_for_s=state_for_s,
        era=era,
        confinement=confinement,
    )
