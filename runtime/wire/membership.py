"""Delivery's wire: a node's membership in the KV bucket `mesh-membership`, artifacts in `mesh-bundles`.

`meshctl bundle deliver` (runtime/meshctl/deliver.py) writes what the node reconciles
(runtime/delivery/). Every field comes from the bus: `ref_problems` checks it with the manifest's
own rules before any of it becomes part of a path, a subject or a log line.
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError

from manifests.load import name_problem, shown, version_problem
from manifests.model import KINDS, LANGUAGES, SEAT_NAME_RE
from runtime.wire.subjects import BUNDLES_BUCKET, MEMBERSHIP_BUCKET
from toolchains.artifact import is_sha256

OBJECT_BUCKET = BUNDLES_BUCKET
KV_BUCKET = MEMBERSHIP_BUCKET


class ArtifactRef(msgspec.Struct, frozen=True):
    object: str  # name in the object store
    sha256: str  # of the artifact file
    language: str
    kind: str


class ModuleRef(msgspec.Struct, frozen=True):
    version: str
    seats: list[str]
    bundles: dict[str, ArtifactRef]


class Membership(msgspec.Struct):
    modules: dict[str, ModuleRef] = {}


class _RawMembership(msgspec.Struct):
    modules: dict[str, msgspec.Raw] = {}


def decode_membership(value: bytes) -> tuple[Membership, dict[str, bytes]]:
    """The entries that decode, and the raw bytes of each that does not: one malformed entry is
    that module's refusal, not the whole membership's. Raises msgspec errors when the value
    itself is not a membership."""
    raw = msgspec.json.decode(value, type=_RawMembership)
    wanted, broken = Membership(), dict[str, bytes]()
    for name, entry in raw.modules.items():
        try:
            wanted.modules[name] = msgspec.json.decode(entry, type=ModuleRef)
        except msgspec.ValidationError:
            broken[name] = bytes(entry)
    return wanted, broken


class DeliveryError(Exception):
    pass


def node_key(node: str) -> str:
    return f"node.{node}"


def object_name(module: str, bundle: str, version: str, sha256: str) -> str:
    """Where `meshctl bundle deliver` puts an artifact in the object store, and the only name a node fetches."""
    return f"{module}/{bundle}/{version}/{sha256[:16]}.tar.gz"


def ref_problems(module: str, ref: ModuleRef) -> list[str]:
    """Every field of one membership entry that breaks the manifest's rules; none may be used then.

    The fields come from the bus: each becomes part of a path, a subject or a log line only after
    this says it is a name, a version or a hash."""
    problems: list[str] = []
    if why := name_problem(module):
        return [f"module {why}"]  # the rest would be named under a name that is not one
    if why := version_problem(ref.version):
        problems.append(f"version {why}")
    if not ref.bundles:
        problems.append("bundles is empty; a delivered module names at least one artifact")
    for bundle, art in sorted(ref.bundles.items()):
        if why := name_problem(bundle, right='[a-z][a-z0-9-]{0,62}, e.g. "tools"'):
            problems.append(f"bundle key {why}")
            continue
        if not is_sha256(art.sha256):
            problems.append(f"bundles.{bundle}.sha256 is {shown(art.sha256)}; a sha256 is 64 lowercase hex digits")
        elif not problems and art.object != object_name(module, bundle, ref.version, art.sha256):
            expected = object_name(module, bundle, ref.version, art.sha256)
            problems.append(f"bundles.{bundle}.object is {shown(art.object)}; deliver names it {expected!r}")
        if art.language not in LANGUAGES:
            problems.append(f"bundles.{bundle}.language is {shown(art.language)}; one of {', '.join(LANGUAGES)}")
        if art.kind not in KINDS:
            problems.append(f"bundles.{bundle}.kind is {shown(art.kind)}; one of {', '.join(KINDS)}")
    for seat in ref.seats:
        if why := name_problem(seat, SEAT_NAME_RE, '[a-z][a-z0-9-]{0,62}, e.g. "memory"'):
            problems.append(f"seat {why}")
    return problems


def module_label(module: str) -> str:
    """A module's name as logs and status show it: itself when it is a name, else shortened and quoted."""
    return module if name_problem(module) is None else shown(module)


async def buckets(nc: Client) -> tuple[object, object]:
    js = nc.jetstream()
    try:
        obs = await js.object_store(OBJECT_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        obs = await js.create_object_store(OBJECT_BUCKET)
    try:
        kv = await js.key_value(KV_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        kv = await js.create_key_value(bucket=KV_BUCKET, history=5)
    return obs, kv
