"""The operator side's errors: one `MeshError` base with its exit code, rendered once at the CLI's edge.

Exit codes: 0 ok, 1 a check, a call or a refused request failed, 2 bad usage or no bus.
Errors of the node's own packages that reach a verb (a manifest that does not load, a build that
fails, a delivery refused) are named here by their class, not imported, so that a verb loads only
what it uses; they render as one line each and exit 1.
"""

from __future__ import annotations


class MeshError(Exception):
    """A verb that cannot do what was asked: one line that says what was wrong and what would be right."""

    code = 2

    def __init__(self, message: str, code: int | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(message)

    def lines(self) -> list[str]:
        return [f"meshctl: {self}"]


class Refused(MeshError):
    """The mesh (a node, a bucket, a check) said no: exit 1."""

    code = 1


# Errors of the node's packages a verb may meet, by module and class name (checked along the MRO).
FOREIGN = frozenset(
    {
        "runtime.hosting.units.UnitError",
        "runtime.wire.membership.DeliveryError",
        "runtime.seats.move.SeatMoveError",
        "toolchains.base.ToolchainMissing",
        "toolchains.base.BuildFailed",
        "toolchains.build.BuildError",
        "toolchains.artifact.ArtifactError",
        "manifests.imported.LockError",
    }
)
MANIFEST_ERROR = "manifests.load.ManifestError"
JETSTREAM_ERROR = "nats.js.errors.APIError"


def _named(e: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__}


def as_mesh_error(e: BaseException) -> MeshError | None:
    """The error as the CLI shows it, or None when it is not one a verb expects (a bug: a traceback)."""
    if isinstance(e, MeshError):
        return e
    names = _named(e)
    if MANIFEST_ERROR in names:
        return _Problems([str(p) for p in getattr(e, "problems", [e])])
    if JETSTREAM_ERROR in names:
        return Refused(jetstream_refusal(e))
    if names & FOREIGN:
        return Refused(str(e))
    return None


class _Problems(Refused):
    """Every problem of a manifest on a line of its own (they name file and field themselves)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))

    def lines(self) -> list[str]:
        return list(self.problems)


def jetstream_refusal(e: BaseException) -> str:
    """A JetStream API error as one line: what the server said, and who may use the buckets."""
    said = getattr(e, "description", None) or type(e).__name__
    return (
        f"the bus refused a JetStream request: {said} (code {getattr(e, 'code', None)}, error "
        f"{getattr(e, 'err_code', None)}); the buckets (delivery, seat leases and homes) are the mesh account's: "
        "run this as the node's user (it finds bus-mesh.password beside bus.json) or with the mesh account's "
        "--user/--password or --creds"
    )
