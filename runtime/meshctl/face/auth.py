"""The HTTP face as an OAuth 2.1 protected resource (MCP authorization, 2025-06-18 and 2025-11-25).

`Gate` is the ASGI app in front of the face's front (http_front.py): every request meets it first.
- `Host` must be one this face answers for, with its numeric port (DNS rebinding: a page of
  another site that resolves its name to 127.0.0.1 sends its own name); 421 otherwise.
- Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource/mcp` (and at the
  bare well-known path), naming the issuer, the scopes and the resource.
- With an issuer: every request to the endpoint carries `Authorization: Bearer <token>`, verified by
  tokens.py (cached); none: 401 with `WWW-Authenticate: Bearer resource_metadata="..."`; a bad one:
  401 `invalid_token` saying why; a token without a required scope: 403 `insufficient_scope`; an
  issuer that does not answer: 503. A good one puts the person on the request (`scope["mesh.person"]`,
  which the face passes on with each call, both ways) and the package's `AuthenticatedUser`
  (`scope["user"]`), which binds a 2025-11-25 session to the person who opened it: the package
  answers another person's request on it 404, and the hot path serves only the owner (http_front.py).
- Sessions per person (per client address without auth) are capped (limits.py), beside the global cap.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.meshctl.face.catalog import FaceError
from runtime.meshctl.face.limits import SessionCaps, opening
from runtime.meshctl.face.tokens import IssuerUnreachable, TokenRejected, TokenVerifier, VerifierSettings

log = logging.getLogger("mesh.face")

PRM_PATH = "/.well-known/oauth-protected-resource"
PERSON_KEY = "mesh.person"  # the ASGI scope key of the request's person (runtime.wire.identity.Person)
OWNER_KEY = "mesh.owner"  # the package's AuthorizationContext of the request's token


class AuthTable(msgspec.Struct, forbid_unknown_fields=True):
    """`[auth]` of the face's config file (the command line's --auth-* flags win)."""

    issuer: str | None = None
    audience: str | None = None  # default: the resource (the face's own URL, RFC 8707)
    resource: str | None = None  # the face's URL as clients reach it; default http://HOST:PORT/mcp
    scopes: list[str] = []  # every token must carry these
    person_claim: str = "sub"
    introspection_client_id: str | None = None
    introspection_secret_file: str | None = None  # the secret, read from this file (0600)
    cache_size: int = 4096
    cache_s: float = 300.0


class HttpTable(msgspec.Struct, forbid_unknown_fields=True):
    """`[http]` of the face's config file: the bounds of the HTTP face."""

    allow_unauthenticated: bool = False  # a non-loopback address without an issuer: only when said
    max_sessions: int = 256
    sessions_per_person: int = 16  # per token's person with auth; per client address without
    session_idle_s: float = 300.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    allowed_hosts: list[str] = []  # more Host values (name:port) this face answers for


class _FaceConfig(msgspec.Struct):
    auth: AuthTable = msgspec.field(default_factory=AuthTable)
    http: HttpTable = msgspec.field(default_factory=HttpTable)


@dataclass
class HttpSettings:
    """What the HTTP face enforces, from the flags and the config file, checked at start."""

    host: str
    port: int
    auth: AuthTable
    http: HttpTable
    resource: str = ""
    hosts: set[bytes] = field(default_factory=set)  # Host values taken, exactly
    introspection_secret: str | None = None

    @property
    def on(self) -> bool:
        return self.auth.issuer is not None


def load_http_settings(
    host: str,
    port: int,
    config: Path | None,
    *,
    issuer: str | None,
    audience: str | None,
    scopes: list[str],
    allow_unauthenticated: bool,
    resource: str | None = None,
) -> HttpSettings:
    """The face's HTTP settings; FaceError naming what is wrong and what would be right."""
    tables = _FaceConfig()
    if config is not None:
        try:
            data = tomllib.loads(config.read_text())
            tables = msgspec.convert({k: data[k] for k in ("auth", "http") if k in data}, _FaceConfig)
        except OSError as e:
            raise FaceError(f"{config}: cannot read it ({e.strerror})") from None
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
            raise FaceError(
                f"{config}: {e}; [auth] takes issuer, audience, resource, scopes, person_claim, ..."
            ) from None
    a, h = tables.auth, tables.http
    if issuer is not None:
        a.issuer = issuer
    if audience is not None:
        a.audience = audience
    if resource is not None:
        a.resource = resource
    a.scopes = a.scopes + [s for s in scopes if s not in a.scopes]
    h.allow_unauthenticated = h.allow_unauthenticated or allow_unauthenticated
    for name, value, least in (
        ("max_sessions", h.max_sessions, 1),
        ("sessions_per_person", h.sessions_per_person, 1),
        ("session_idle_s", h.session_idle_s, 1),
        ("header_timeout_s", h.header_timeout_s, 0.1),
        ("body_timeout_s", h.body_timeout_s, 0.1),
        ("cache_size", a.cache_size, 1),
    ):
        if not value >= least:
            raise FaceError(f"[http] {name} is {value}; give at least {least}")
    shown_host = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    settings = HttpSettings(host, port, a, h, resource=a.resource or f"http://{shown_host}:{port}/mcp")
    if a.issuer is not None:
        for what, url in (("issuer", a.issuer), ("resource", settings.resource)):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("https", "http") or not parts.netloc or parts.query or parts.fragment:
                raise FaceError(f"--auth-{what} {url!r}: give an http(s) URL with no query, e.g. https://id.example")
            if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
                raise FaceError(
                    f"{what} {url}: plain http is only for loopback (bearer tokens would cross the network readable); "
                    + (
                        "give https"
                        if what == "issuer"
                        else "serve the face behind TLS and name the URL clients use: --auth-resource https://HOST/mcp"
                    )
                )
        if a.introspection_secret_file is not None:
            try:
                settings.introspection_secret = Path(a.introspection_secret_file).read_text().strip()
            except OSError as e:
                raise FaceError(
                    f"[auth] introspection_secret_file {a.introspection_secret_file}: {e.strerror}"
                ) from None
    elif not is_loopback(host):
        if not h.allow_unauthenticated:
            raise FaceError(
                f"--http on {host} (not loopback) without authorization serves the mesh's tools to anyone on the "
                "network: give --auth-issuer URL (the face then takes only tokens that issuer vouches for), or "
                "say --allow-unauthenticated (with --allow-origin URL for each web origin that may call it), "
                "or bind 127.0.0.1"
            )
        log.warning(
            "the face serves %s:%d without authorization (--allow-unauthenticated): anyone who reaches it calls the "
            "mesh's tools as the face",
            host,
            port,
        )
    settings.hosts = _hosts(host, port, settings.resource, h.allowed_hosts)
    return settings


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address (brackets of an IPv6 literal allowed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hosts(host: str, port: int, resource: str, more: list[str]) -> set[bytes]:
    """Every `Host` value the face answers for: its address with its port, the loopback names when it
    is on loopback or every address, the resource URL's host (its port as given and as the default)."""
    names = {host.strip("[]")}
    if is_loopback(host) or host in ("0.0.0.0", "::", ""):
        names |= {"127.0.0.1", "localhost", "::1"}
    found = {(f"[{n}]" if ":" in n else n) + f":{port}" for n in names}
    parts = urllib.parse.urlsplit(resource)
    if parts.hostname:
        shown = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        default = 443 if parts.scheme == "https" else 80
        found.add(f"{shown}:{parts.port or default}")
        if (parts.port or default) == default:
            found.add(shown)
    found |= set(more)
    return {h.lower().encode("latin-1") for h in found}


def prm_url(resource: str) -> str:
    """RFC 9728 §3.1: the well-known name between the resource's host and its path."""
    parts = urllib.parse.urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{PRM_PATH}{parts.path.rstrip('/')}"


class Gate:
    """ASGI: Host check, Protected Resource Metadata, bearer tokens, session caps; then `app`."""

    def __init__(self, app: ASGIApp, settings: HttpSettings, *, path: str = "/mcp") -> None:
        self.app, self.settings, self.path = app, settings, path
        a = settings.auth
        self.verifier: TokenVerifier | None = None
        if a.issuer is not None:
            client = (
                (a.introspection_client_id, settings.introspection_secret)
                if a.introspection_client_id and settings.introspection_secret
                else None
            )
            self.verifier = TokenVerifier(
                VerifierSettings(
                    issuer=a.issuer,
                    audience=a.audience or settings.resource,
                    person_claim=a.person_claim,
                    introspection_client=client,
                    cache_size=a.cache_size,
                    cache_s=a.cache_s,
                )
            )
        self.caps = SessionCaps(settings.http.sessions_per_person)
        self.manager: Any = None  # the package's session manager, set by serve_http
        self.metadata_url = prm_url(settings.resource)
        self._prm_paths = {PRM_PATH, urllib.parse.urlsplit(self.metadata_url).path}
        prm: dict[str, Any] = {"resource": settings.resource, "bearer_methods_supported": ["header"]}
        prm["resource_name"] = "mesh (meshctl mcp)"
        if a.issuer is not None:
            prm["authorization_servers"] = [a.issuer]
            prm["scopes_supported"] = a.scopes or None
        self._prm = json.dumps({k: v for k, v in prm.items() if v is not None}).encode()
        scope_part = f', scope="{" ".join(a.scopes)}"' if a.scopes else ""
        self._challenge = f'Bearer resource_metadata="{self.metadata_url}"{scope_part}'

    async def aclose(self) -> None:
        if self.verifier is not None:
            await self.verifier.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v for k, v in scope["headers"] if k == b"host"), None)
        if host is None or host.lower() not in self.settings.hosts:
            shown = host.decode("latin-1")[:100] if host is not None else "none"
            await _plain(
                send, 421, f"this face answers for Host {sorted(h.decode() for h in self.settings.hosts)}; got {shown}"
            )
            return
        path = scope["path"]
        if path in self._prm_paths:
            if scope["method"] not in ("GET", "HEAD"):
                await _plain(send, 405, "GET the protected resource metadata")
                return
            await _respond(
                send, 200, self._prm, [(b"content-type", b"application/json"), (b"cache-control", b"max-age=300")]
            )
            return
        if path != self.path:
            await self.app(scope, receive, send)
            return
        if self.verifier is not None and not await self._authorized(scope, send):
            return
        opens = scope["method"] == "POST" and self.manager is not None and opening(scope)
        who = self._whose(scope) if opens else None
        if who is not None:
            refusal = self.caps.refusal(who, self.manager)
            if refusal is not None:
                await _respond(send, 429, refusal, [(b"content-type", b"application/json"), (b"retry-after", b"60")])
                return
            await self.app(scope, receive, self.caps.recording(send, who))
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _whose(scope: Scope) -> tuple[str, str] | None:
        """Whom a new session counts against: the token's person; without auth the client's address,
        except loopback (every local client is 127.0.0.1: they share the global cap)."""
        owner = scope.get(OWNER_KEY)
        if owner is not None:
            return _owner_key(owner)
        address = str((scope.get("client") or ("?", 0))[0])
        return None if is_loopback(address) else ("address", address)

    async def _authorized(self, scope: Scope, send: Send) -> bool:
        assert self.verifier is not None
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None or not header[:7].lower() == b"bearer ":
            await self._refuse(send, 401, None, "a bearer token is required (Authorization: Bearer <token>)")
            return False
        try:
            found = await self.verifier.verified(header[7:].strip().decode("latin-1"))
        except TokenRejected as e:
            await self._refuse(send, 401, "invalid_token", e.reason)
            return False
        except IssuerUnreachable as e:
            log.warning("%s", e)
            await _plain(send, 503, f"the face cannot check the token now: {e}")
            return False
        missing = [s for s in self.settings.auth.scopes if s not in found.access.scopes]
        if missing:
            await self._refuse(send, 403, "insufficient_scope", f"the token lacks the scope {' '.join(missing)}")
            return False
        scope["user"] = found.user
        scope["auth"] = found.credentials
        scope[PERSON_KEY] = found.person
        scope[OWNER_KEY] = found.owner
        return True

    async def _refuse(self, send: Send, status: int, error: str | None, description: str) -> None:
        challenge = self._challenge
        if error is not None:
            clean = description.replace('"', "'").replace("\\", "/")
            challenge += f', error="{error}", error_description="{clean}"'
        body = json.dumps({"error": error or "invalid_request", "error_description": description}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"www-authenticate", challenge.encode("latin-1", "replace")),
        ]
        await _respond(send, status, body, headers)


def _owner_key(owner: Any) -> tuple[str, str]:
    return ("person", f"{owner.get('issuer')} {owner.get('subject')}")


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(send: Send, status: int, text: str) -> None:
    await _respond(send, status, text.encode(), [(b"content-type", b"text/plain; charset=utf-8")])
