"""Where every verb's settings come from: flags over the node's config file over the defaults.

One resolver for all verbs (`node run`, `node unit`, `node units`, and the bus options of the
verbs that talk to a node), so they agree on a node's name, state folder and bus.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

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


def client_config(args: argparse.Namespace) -> tuple[NatsConfig, str | None]:
    """The bus to talk to, and the local node's name when it was found from its state folder."""
    cfg = nats_config(args)
    if cfg.url:
        return cfg, None
    state = Path(args.state_dir) if args.state_dir else default_state_dir()
    info = read_bus_info(state)
    if info is None:
        raise MeshError(
            f"no local node found (no running node's bus.json in {state}); start one with `meshctl node run` "
            "or name the bus with --nats URL"
        )
    cfg = msgspec.structs.replace(cfg, url=info.url)
    if info.password_file and not (cfg.user or cfg.token or cfg.creds or cfg.nkey_seed):
        # The local bus has accounts: the operator of this machine speaks from the mesh account.
        try:
            password = Path(info.password_file).read_text().strip()
        except OSError as e:
            raise MeshError(
                f"the local bus has accounts and {info.password_file} cannot be read ({e.strerror}); "
                "run as the node's user, or call as a caller with --user and --password"
            ) from None
        cfg = msgspec.structs.replace(cfg, user=info.user, password=password)
    return cfg, info.node
