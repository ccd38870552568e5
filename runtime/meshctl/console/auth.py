"""Who is logged in to the console: sessions, the local login, OpenID Connect.

A session is a random id in a cookie (HttpOnly, SameSite=Lax, Secure when the console is reached
over TLS) that names a person kept here, with a CSRF token every form carries back. Sessions end
after `ttl_s`; at most MAX_SESSIONS are kept (the oldest goes first, said once in the log).

Two ways in:
- Local (no issuer): the console listens on loopback only, and the person is the OS user who started
  it (`unix:<host>`/<user>), who proves it with the login link the console printed on its start (a
  token only that user saw).
- OpenID Connect (`--auth-issuer`, `--auth-client-id`): the authorization code flow with PKCE (S256),
  state and nonce; the ID token's signature (the issuer's JWKS), issuer, audience, expiry and nonce
  are checked; the person is the token's subject at that issuer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx2
import jwt

from runtime.meshctl.errors import MeshError
from runtime.wire.identity import MAX_NAME_CHARS, Person

log = logging.getLogger("mesh.console")

COOKIE = "mesh_console"
MAX_SESSIONS = 10_000
MAX_PENDING = 1_000  # logins begun and not finished
PENDING_TTL_S = 600.0
ID_TOKEN_ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]
HTTP_TIMEOUT_S = 10.0


@dataclass
class Session:
    person: Person
    csrf: str
    expires: float  # time.monotonic()
    flash: str = ""  # what the last action's answer was, shown once on the next page


class Sessions:
    """The console's sessions, in memory: a console restart logs everyone out."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._said_full = False

    def open(self, person: Person) -> tuple[str, Session]:
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.popitem(last=False)
            if not self._said_full:
                log.warning("console: %d sessions open; the oldest are logged out to make room", MAX_SESSIONS)
                self._said_full = True
        sid = secrets.token_urlsafe(32)
        session = Session(person, secrets.token_urlsafe(32), time.monotonic() + self.ttl_s)
        self._by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session of this cookie, or None (none, unknown or expired: an expired one is dropped)."""
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        if time.monotonic() >= session.expires:
            del self._by_id[sid]
            return None
        return session

    def close(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)


def csrf_ok(session: Session, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(session.csrf.encode(), given.encode())


def safe_next(target: object) -> str:
    """A path on this console to go back to after a login; anything else is `/`."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target[:2000]
    return "/"


class LocalLogin:
    """The OS user's login: the token in the link the console printed when it started."""

    def __init__(self, person: Person) -> None:
        self.person = person
        self.token = secrets.token_urlsafe(32)

    def check(self, given: object) -> Person | None:
        if isinstance(given, str) and hmac.compare_digest(self.token.encode(), given.encode()):
            return self.person
        return None


@dataclass
class _Pending:
    verifier: str
    nonce: str
    next: str
    at: float


class OidcError(Exception):
    """A login that did not go through; the text says what was wrong, for the page and the log."""


def issuer_problem(issuer: str) -> str | None:
    parts = urlsplit(issuer)
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"):
        return None  # a test's or a developer's own issuer on this machine
    return f"--auth-issuer {issuer!r}: give the issuer's https:// URL (http:// only on loopback)"


class OidcLogin:
    """The authorization code flow with PKCE against one issuer (discovered at start)."""

    def __init__(self, issuer: str, client_id: str, client_secret: str | None, redirect_uri: str) -> None:
        if why := issuer_problem(issuer):
            raise MeshError(why)
        self.issuer = issuer.rstrip("/")
        self.client_id, self.client_secret, self.redirect_uri = client_id, client_secret, redirect_uri
        self.meta: dict[str, Any] = {}
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._keys: dict[str, jwt.PyJWK] = {}

    async def discover(self) -> None:
        url = self.issuer + "/.well-known/openid-configuration"
        try:
            async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
                r = await http.get(url)
                r.raise_for_status()
                meta = r.json()
        except (httpx2.HTTPError, ValueError) as e:
            raise MeshError(f"--auth-issuer: cannot read {url}: {e}") from None
        for key in ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(meta.get(key), str):
                raise MeshError(f"--auth-issuer: {url} names no {key}; is it an OpenID Connect issuer?")
        if meta["issuer"].rstrip("/") != self.issuer:
            raise MeshError(f"--auth-issuer {self.issuer!r}: its discovery names issuer {meta['issuer']!r}")
        methods = meta.get("code_challenge_methods_supported")
        if isinstance(methods, list) and "S256" not in methods:
            raise MeshError(f"--auth-issuer: {self.issuer} does not offer PKCE with S256, which the console needs")
        self.meta = meta
        await self._load_keys()

    async def _load_keys(self) -> None:
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            r = await http.get(self.meta["jwks_uri"])
            r.raise_for_status()
            found = jwt.PyJWKSet.from_dict(r.json())
        self._keys = {k.key_id or "": k for k in found.keys}

    def begin(self, next_path: str) -> str:
        """Where to send the browser: the issuer's authorization endpoint with state, nonce and the PKCE challenge."""
        now = time.monotonic()
        while self._pending and (
            len(self._pending) >= MAX_PENDING or now - next(iter(self._pending.values())).at > PENDING_TTL_S
        ):
            self._pending.popitem(last=False)
        state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
        self._pending[state] = _Pending(verifier, nonce, safe_next(next_path), now)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": "openid profile email",
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        return f"{self.meta['authorization_endpoint']}?{urlencode(query)}"

    async def finish(self, params: dict[str, str]) -> tuple[Person, str]:
        """The person of a finished login and the page to go back to; OidcError saying why not."""
        if "error" in params:
            raise OidcError(f"the issuer refused the login: {params['error'][:200]}")
        pending = self._pending.pop(params.get("state", ""), None)
        if pending is None or time.monotonic() - pending.at > PENDING_TTL_S:
            raise OidcError("this login's state is unknown or older than 10 minutes; log in again")
        code = params.get("code", "")
        if not code:
            raise OidcError("the issuer sent no code; log in again")
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "client_id": self.client_id,
            "code_verifier": pending.verifier,
        }
        if self.client_secret:
            form["client_secret"] = self.client_secret
        try:
            async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
                r = await http.post(self.meta["token_endpoint"], data=form)
            tokens = r.json()
        except (httpx2.HTTPError, ValueError) as e:
            raise OidcError(f"the issuer's token endpoint did not answer: {e}") from None
        if r.status_code != 200 or not isinstance(tokens, dict) or not isinstance(tokens.get("id_token"), str):
            raise OidcError(f"the issuer gave no ID token ({r.status_code}): {str(tokens)[:200]}")
        claims = await self._verified(tokens["id_token"], pending.nonce)
        return self._person(claims), pending.next

    async def _verified(self, token: str, nonce: str) -> dict[str, Any]:
        try:
            kid = jwt.get_unverified_header(token).get("kid") or ""
            if kid not in self._keys:
                await self._load_keys()  # the issuer rolled its keys
            key = self._keys.get(kid) or (next(iter(self._keys.values())) if len(self._keys) == 1 and not kid else None)
            if key is None:
                raise OidcError(f"the ID token is signed with key {kid[:64]!r}, which the issuer's JWKS does not hold")
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=ID_TOKEN_ALGORITHMS,
                audience=self.client_id,
                issuer=self.meta["issuer"],
                options={"require": ["exp", "iat", "sub", "iss", "aud"]},
            )
        except jwt.PyJWTError as e:
            raise OidcError(f"the ID token does not hold: {e}") from None
        except httpx2.HTTPError as e:
            raise OidcError(f"the issuer's keys cannot be read: {e}") from None
        if not isinstance(claims.get("nonce"), str) or not hmac.compare_digest(claims["nonce"], nonce):
            raise OidcError("the ID token's nonce is not this login's")
        return claims

    def _person(self, claims: dict[str, Any]) -> Person:
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub or not sub.isprintable() or len(sub) > MAX_NAME_CHARS:
            raise OidcError("the ID token's subject is not 1 to 256 printable characters")
        name = next(
            (v for k in ("name", "preferred_username", "email") if isinstance(v := claims.get(k), str) and v),
            sub,
        )
        if not name.isprintable() or len(name) > MAX_NAME_CHARS:
            name = sub
        return Person(iss=self.issuer, sub=sub, name=name)
