"""Where every verb's settings come from: flags over the node's config file over the defaults.

One resolver for all verbs (`node run`, `node unit`, `node units`, and the bus options of the
verbs that talk to a node), so they agree on a node's name, state folder and bus.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from runtime.bus.info import read_bus_info
from runtime.config import ConfigError, NatsConfig, NodeConfig, default_state_dir, listen_problem, load_config
from runtime.meshctl.errors import MeshError


def bus_options() -> argparse.ArgumentParser:
    """The options of every verb that talks to the bus, given to its parser as `parents=`."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("bus")
    g.add_argument("--nats", metavar="URL", help="NATS server URL(s), comma-separated; default: the local node's bus")
    g.add_argument("--state-dir", metavar="DIR", help=f"the local node's state folder (default {default_state_dir()})")
    # dest nats_*: `node unit(s)` have a --user of their own (the unit's user).
    g.add_argument("--user", dest="nats_user", help="NATS user")
    g.add_argument("--password", dest="nats_password", help="NATS password (or MESH_NATS_PASSWORD)")
    g.add_argument("--token", dest="nats_token", help="NATS token (or MESH_NATS_TOKEN)")
    g.add_argument("--creds", dest="nats_creds", metavar="FILE", help="NATS credentials file")
    g.add_argument("--nkey", dest="nats_nkey", metavar="FILE", help="NATS nkey seed file")
    g.add_argument("--tls-ca", dest="nats_tls_ca", metavar="FILE", help="CA certificate for TLS")
    g.add_argument("--tls-cert", dest="nats_tls_cert", metavar="FILE", help="client certificate for TLS")
    g.add_argument("--tls-key", dest="nats_tls_key", metavar="FILE", help="client key for TLS")
    g.add_argument(
        "--caller-file",
        metavar="FILE",
        help="the caller login an operator made (meshctl caller add NAME --out FILE); or MESH_CALLER_FILE, "
        f"default {default_caller_file()} when there is no local node of your own",
    )
    return p


def nats_config(args: argparse.Namespace, base: NatsConfig | None = None) -> NatsConfig:
    """The bus options given, over `base` (the config file's [nats] table)."""
    given = {
        "url": getattr(args, "nats", None),
        "user": getattr(args, "nats_user", None),
        "password": getattr(args, "nats_password", None) or os.environ.get("MESH_NATS_PASSWORD"),
        "token": getattr(args, "nats_token", None) or os.environ.get("MESH_NATS_TOKEN"),
        "creds": getattr(args, "nats_creds", None),
        "nkey_seed": getattr(args, "nats_nkey", None),
        "tls_ca": getattr(args, "nats_tls_ca", None),
        "tls_cert": getattr(args, "nats_tls_cert", None),
        "tls_key": getattr(args, "nats_tls_key", None),
    }
    return msgspec.structs.replace(base or NatsConfig(), **{k: v for k, v in given.items() if v})


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The node's settings: its --config file, with the flags this verb was given over it.

    Left open where neither says (name, state folder): `config.finish` fills them for a node
    that runs here; a unit for another machine may leave them to that machine.
    """
    try:
        config = load_config(getattr(args, "config", None))
    except ConfigError as e:
        raise MeshError(str(e)) from None
    changes: dict[str, Any] = {}
    for field in ("name", "state_dir", "manifests"):
        value = getattr(args, field, None)
        if value:
            changes[field] = value
    nats = nats_config(args, config.nats)
    port = getattr(args, "embedded_port", None)
    if port is not None:
        nats = msgspec.structs.replace(nats, embedded_port=port)
    metrics = getattr(args, "metrics", None)
    if metrics:
        if why := listen_problem(metrics):
            raise MeshError(f"--metrics {why}")
        changes["metrics"] = msgspec.structs.replace(config.metrics, listen=metrics)
    return msgspec.structs.replace(config, nats=nats, **changes)


Role = Literal["admin", "caller", "face", "console"]


class CallerFile(msgspec.Struct, forbid_unknown_fields=True):
    """What an operator hands another OS user (`meshctl caller add NAME --out FILE`): one caller's login.

    Read from `--caller-file FILE`, `MESH_CALLER_FILE`, or `~/.config/mesh-node/caller.json`.
    """

    url: str
    user: str
    password: str
    node: str | None = None
    via: str | None = None  # a delegate's channel ("mcp", "console"); None: an ordinary caller


@dataclass(frozen=True)
class Login:
    """The bus a verb talks to and as whom: `node` is the local node's name when bus.json said it,
    `delegate` whether these credentials are a delegate's (the face then passes the person)."""

    cfg: NatsConfig
    node: str | None = None
    delegate: bool = False


def default_caller_file() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "mesh-node" / "caller.json"


def read_caller_file(path: Path) -> CallerFile:
    try:
        return msgspec.json.decode(path.read_bytes(), type=CallerFile)
    except OSError as e:
        raise MeshError(f"cannot read the caller file {path}: {e.strerror}") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise MeshError(f"{path} is not a caller file (`meshctl caller add NAME --out FILE` writes one): {e}") from None


def _caller_file(args: argparse.Namespace, default_too: bool) -> CallerFile | None:
    named = getattr(args, "caller_file", None) or os.environ.get("MESH_CALLER_FILE")
    if named:
        return read_caller_file(Path(named))
    path = default_caller_file()
    return read_caller_file(path) if default_too and path.is_file() else None


def _with(cfg: NatsConfig, caller: CallerFile, url: str | None = None) -> Login:
    cfg = msgspec.structs.replace(cfg, url=url or caller.url, user=caller.user, password=caller.password)
    return Login(cfg, caller.node, caller.via is not None)


def _has_credentials(cfg: NatsConfig) -> bool:
    return bool(cfg.user or cfg.token or cfg.creds or cfg.nkey_seed)


def login(args: argparse.Namespace, role: Role = "admin") -> Login:
    """Who this verb is on the bus: the credentials given; else, for the node's own OS user, the
    login bus.json names for `role` (the mesh account for status, delivery and seats; the
    operator's caller for calls; the face user for `meshctl mcp`, the console user for `meshctl
    console`); else a caller file."""
    cfg = nats_config(args)
    # A caller file named (--caller-file, MESH_CALLER_FILE) is who this verb is, unless credentials are given.
    named = None if _has_credentials(cfg) else _caller_file(args, default_too=False)
    if named is not None:
        return _with(cfg, named, cfg.url)
    if cfg.url:
        return Login(cfg)
    state = Path(args.state_dir) if args.state_dir else default_state_dir()
    try:
        info = read_bus_info(state)
    except PermissionError:
        raise MeshError(
            f"cannot read {state}: a node's state folder is its OS user's alone; run as that user, or call as "
            "a caller with the file its operator made (`meshctl caller add NAME --out FILE`, then --caller-file FILE)"
        ) from None
    if info is None:
        if not _has_credentials(cfg) and (caller := _caller_file(args, default_too=True)) is not None:
            return _with(cfg, caller)
        raise MeshError(
            f"no local node found (no running node's bus.json in {state}); start one with `meshctl node run`, "
            "name the bus with --nats URL, or give the caller file an operator made with --caller-file FILE"
        )
    cfg = msgspec.structs.replace(cfg, url=info.url)
    if _has_credentials(cfg):
        return Login(cfg, info.node)
    user, password_file = {
        "admin": (info.user, info.password_file),
        "caller": (info.caller_user, info.caller_password_file),
        "face": (info.face_user, info.face_password_file),
        "console": (info.console_user, info.console_password_file),
    }[role]
    if not password_file:  # a node on a bus it joined: that bus's credentials are the verb's to give
        return Login(cfg, info.node)
    try:
        password = Path(password_file).read_text().strip()
    except OSError as e:
        raise MeshError(
            f"the local bus has accounts and {password_file} cannot be read ({e.strerror}); "
            "run as the node's user, or call as a caller with --caller-file FILE (or --user and --password)"
        ) from None
    delegate = role in ("face", "console")
    return Login(msgspec.structs.replace(cfg, user=user, password=password), info.node, delegate=delegate)


def client_config(args: argparse.Namespace, role: Role = "admin") -> tuple[NatsConfig, str | None]:
    """The bus to talk to, and the local node's name when it was found from its state folder."""
    found = login(args, role)
    return found.cfg, found.node
