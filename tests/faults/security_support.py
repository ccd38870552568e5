"""Helpers for the security tests: a nats-server run from a config file, nkeys and a JWT chain,
a CA with server and client certificates, and `meshctl` run as a bounded subprocess.

Everything stays on loopback; every server is ended by the test that started it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.bus.accounts import accounts_block
from runtime.bus.embedded import free_port, nats_server_binary
from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, NodeProcess, make_module, stop_process, wait_port

# meshctl must answer within this; past it the run is a hang, which is a failure of its own.
MESHCTL_LIMIT_S = 20.0


class ConfiguredServer:
    """A nats-server on 127.0.0.1 whose auth and TLS come from a config file written here."""

    def __init__(self, workdir: Path, body: str, *, scheme: str = "nats", jetstream: bool = True) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.scheme = scheme
        workdir.mkdir(parents=True, exist_ok=True)
        js = f"jetstream {{ store_dir: {json.dumps(str(workdir / 'js'))} }}\n" if jetstream else ""
        self.config = workdir / "server.conf"
        self.config.write_text(f"listen: 127.0.0.1:{self.port}\n{js}{body}\n")
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> ConfiguredServer:
        # -t checks the config first, so a config mistake is named instead of a port that never opens.
        check = subprocess.run(
            [nats_server_binary(), "-c", str(self.config), "-t"], capture_output=True, text=True, timeout=20
        )
        if check.returncode != 0:
            raise AssertionError(f"nats-server rejects {self.config}:\n{check.stdout}{check.stderr}")
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(self.config)], stdout=subprocess.DEVNULL, stderr=open(self.log_path, "ab")
        )
        try:
            wait_port(self.port)
        except TimeoutError:
            self.stop()
            raise AssertionError(f"nats-server did not listen:\n{self.log()}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        stop_process(self.proc)


def toml_value(value: object) -> str:
    # JSON strings, numbers and lists of strings are valid TOML values.
    return json.dumps(value)


def node_config(nats: dict[str, str], *, top: dict[str, object] | None = None) -> str:
    """FAST_CONFIG with top-level keys before it and a [nats] table after it."""
    head = "".join(f"{k} = {toml_value(v)}\n" for k, v in (top or {}).items())
    table = "".join(f"{k} = {toml_value(v)}\n" for k, v in nats.items())
    return f"{head}{FAST_CONFIG}\n[nats]\n{table}"


def meshctl(
    *args: str, env: dict[str, str] | None = None, timeout: float = MESHCTL_LIMIT_S
) -> subprocess.CompletedProcess[str]:
    """Run meshctl; it must end by itself within `timeout` (a hang fails the test, naming the verb)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_NATS_")}
    full_env.update(env or {})
    started = time.monotonic()
    try:
        return subprocess.run(
            [*MESHCTL, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"meshctl {' '.join(args)} hung: still running after {time.monotonic() - started:.0f} s; "
            f"stderr so far: {(e.stderr or b'')!r}"
        ) from None


# --- nkeys and the NATS JWT v2 chain ---------------------------------------------------------
def new_nkey(prefix: int) -> tuple[str, str]:
    """(seed, public key) of a fresh nkey of the given role (nkeys.PREFIX_BYTE_USER, ...)."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), prefix)
    kp = nkeys.from_seed(bytearray(seed))
    return seed.decode(), kp.public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode_jwt(claims: dict, signer_seed: str) -> str:
    """A NATS JWT: ed25519-nkey signature over `header.claims`, jti the hash of the claims."""
    import nkeys

    body = dict(claims)
    body.setdefault("iat", int(time.time()))
    body["jti"] = ""
    digest = hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).digest()
    body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode()
    signature = nkeys.from_seed(bytearray(signer_seed.encode())).sign(signing_input)
    return f"{header}.{payload}.{_b64(signature)}"


@dataclass
class OperatorChain:
    server_config: str  # the operator/resolver part of a nats-server config
    creds: Path  # a user .creds file for the account


CREDS_TEMPLATE = """-----BEGIN NATS USER JWT-----
{jwt}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{seed}
------END USER NKEY SEED------

*************************************************************
"""


def operator_chain(folder: Path) -> OperatorChain:
    """Operator -> account (JetStream on) -> user, plus a system account, preloaded in a MEMORY resolver."""
    import nkeys

    op_seed, op_pub = new_nkey(nkeys.PREFIX_BYTE_OPERATOR)
    sys_seed, sys_pub = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    acc_seed, acc_pub = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, user_pub = new_nkey(nkeys.PREFIX_BYTE_USER)
    unlimited = {
        "subs": -1,
        "data": -1,
        "payload": -1,
        "imports": -1,
        "exports": -1,
        "wildcards": True,
        "conn": -1,
        "leaf": -1,
    }
    operator = encode_jwt(
        {
            "iss": op_pub,
            "sub": op_pub,
            "name": "mesh-test-operator",
            "nats": {"system_account": sys_pub, "type": "operator", "version": 2},
        },
        op_seed,
    )
    system = encode_jwt(
        {"iss": op_pub, "sub": sys_pub, "name": "SYS", "nats": {"limits": unlimited, "type": "account", "version": 2}},
        op_seed,
    )
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account = encode_jwt(
        {
            "iss": op_pub,
            "sub": acc_pub,
            "name": "MESH",
            "nats": {"limits": {**unlimited, **jetstream}, "type": "account", "version": 2},
        },
        op_seed,
    )
    user = encode_jwt(
        {
            "iss": acc_pub,
            "sub": user_pub,
            "name": "node",
            "nats": {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2},
        },
        acc_seed,
    )
    del sys_seed  # nobody signs as the system account here
    folder.mkdir(parents=True, exist_ok=True)
    creds = folder / "node.creds"
    creds.write_text(CREDS_TEMPLATE.format(jwt=user, seed=user_seed))
    creds.chmod(0o600)
    config = (
        f"operator: {operator}\n"
        f"system_account: {sys_pub}\n"
        "resolver: MEMORY\n"
        f"resolver_preload: {{\n  {sys_pub}: {system}\n  {acc_pub}: {account}\n}}\n"
    )
    return OperatorChain(server_config=config, creds=creds)


# --- TLS ---------------------------------------------------------------------------------------
@dataclass
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls(folder: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        path.chmod(0o600)
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("mesh test CA"))
        .issuer_name(name("mesh test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        cn: str, usage: x509.ObjectIdentifier, san: list[x509.GeneralName]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    server_cert, server_key = leaf(
        "127.0.0.1",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client_cert, client_key = leaf("mesh-node", ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("mesh-node")])
    return TlsFiles(
        ca=write_cert(ca_cert, folder / "ca.pem"),
        server_cert=write_cert(server_cert, folder / "server.pem"),
        server_key=write_key(server_key, folder / "server-key.pem"),
        client_cert=write_cert(client_cert, folder / "client.pem"),
        client_key=write_key(client_key, folder / "client-key.pem"),
    )


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict: Uid, Gid, Groups..."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def accounts_mesh(
    root: Path, callers: list[tuple[str, str, str]], identity: str, name: str
) -> tuple[ConfiguredServer, NodeProcess]:
    """A nats-server with the mesh account (user mesh-node) and these caller accounts, and a node
    on it serving module `who` (the raw child: its tool `meta` answers the `_meta` it saw) with
    this `[identity]` table; the node has said "serving on" when this returns."""
    server = ConfiguredServer(root / "bus", accounts_block([("mesh-node", "mesh-pw")], callers)).start()
    make_module(root / "mods", "who")
    config = node_config({"url": server.url, "user": "mesh-node", "password": "mesh-pw"}) + f"\n[identity]\n{identity}"
    node = NodeProcess(root, root / "mods", None, name, config=config)
    try:
        node.wait_log("serving on", timeout=20)
    except BaseException:
        node.kill()
        server.stop()
        raise
    return server, node
