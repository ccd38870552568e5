"""An OAuth 2.1 / OpenID Connect authorization server for tests, run as a real process on 127.0.0.1.

It is a whole server on a real HTTP stack (Starlette on uvicorn), its tokens signed with real RSA
keys (PyJWT, cryptography): what a test's resource server or relying party meets is what it would
meet from a production issuer, nothing that accepts any token.

- Discovery: `/.well-known/oauth-authorization-server` (RFC 8414) and
  `/.well-known/openid-configuration` (the same document), `/jwks` (RFC 7517).
- Authorization code with PKCE (S256 only, as OAuth 2.1 asks): `/authorize` shows a login form,
  `/login` checks the person's password and redirects with a one-time code (60 s); `resource`
  (RFC 8707) becomes the access token's audience; `nonce` goes into the ID token.
- `/token`: `authorization_code`, `refresh_token` (rotated: a used refresh token is refused) and
  `client_credentials` (a confidential client acting as itself: `sub` is its client id).
- `/introspect` (RFC 7662, for a confidential client), `/revoke` (RFC 7009), `/userinfo` (OIDC),
  `/register` (RFC 7591 dynamic registration, as the MCP SDK's OAuth client uses it).
- Access tokens are JWTs (RFC 9068, `typ: at+jwt`), or opaque strings for a client registered
  with `"access_token_format": "opaque"` (then only introspection says what they are).
- Test controls under `/admin/` (loopback only, like the whole server): `rotate` makes a new
  signing key (the old one stays in the JWKS unless `drop_old`), `mint` signs a token with any
  claims (expired, another audience, ...), `state` counts what the server did.

Run: `python -m tests.support.oauth_server --port 0 --config conf.json` prints one line, the
issuer URL, once it listens. In a test: `with oauth_server(tmp_path) as auth: auth.url ...`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import secrets
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

CODE_TTL_S = 60
DEFAULT_CONFIG: dict[str, Any] = {
    "users": {
        "alice": {"password": "alice-pw", "name": "Alice Liddell", "email": "alice@example.test"},
        "bob": {"password": "bob-pw", "name": "Bob Builder", "email": "bob@example.test"},
    },
    "clients": {
        # A public client (a desktop MCP client): PKCE, no secret.
        "desktop": {"redirect_uris": ["http://127.0.0.1/callback"], "public": True},
        # A confidential client: client credentials, and introspection for a resource server.
        "service": {"secret": "service-secret", "grant_types": ["client_credentials"]},
        "opaque-desktop": {
            "redirect_uris": ["http://127.0.0.1/callback"],
            "public": True,
            "access_token_format": "opaque",
        },
    },
    "scopes": ["openid", "profile", "email", "offline_access", "mesh", "mesh:admin"],
    "access_token_ttl_s": 300,
    "refresh_token_ttl_s": 3600,
    "default_audience": None,  # the audience of a token asked for with no `resource`; None: the client id
}


class OAuthError(Exception):
    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error, self.description, self.status = error, description, status

    def response(self) -> JSONResponse:
        body = {"error": self.error, "error_description": self.description}
        headers = {"WWW-Authenticate": 'Basic realm="token"'} if self.status == 401 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


@dataclass
class _Key:
    kid: str
    private: rsa.RSAPrivateKey

    def public_jwk(self) -> dict[str, Any]:
        jwk = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}


@dataclass
class _Grant:
    """What a code, a refresh token or an opaque access token stands for."""

    client_id: str
    sub: str
    scope: list[str]
    audience: str
    expires: float
    redirect_uri: str = ""
    challenge: str = ""
    nonce: str | None = None
    used: bool = False


def _new_key() -> _Key:
    return _Key(kid=secrets.token_hex(8), private=rsa.generate_private_key(public_exponent=65537, key_size=2048))


@dataclass
class AuthServer:
    config: dict[str, Any]
    issuer: str = ""
    keys: list[_Key] = field(default_factory=lambda: [_new_key()])
    codes: dict[str, _Grant] = field(default_factory=dict)
    refresh: dict[str, _Grant] = field(default_factory=dict)
    opaque: dict[str, _Grant] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)  # jti of revoked JWT access tokens
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # --- documents --------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        i = self.issuer
        return {
            "issuer": i,
            "authorization_endpoint": f"{i}/authorize",
            "token_endpoint": f"{i}/token",
            "jwks_uri": f"{i}/jwks",
            "introspection_endpoint": f"{i}/introspect",
            "revocation_endpoint": f"{i}/revoke",
            "registration_endpoint": f"{i}/register",
            "userinfo_endpoint": f"{i}/userinfo",
            "scopes_supported": self.config["scopes"],
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
            "introspection_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "name", "email", "preferred_username"],
        }

    def jwks(self) -> dict[str, Any]:
        return {"keys": [k.public_jwk() for k in self.keys]}

    # --- tokens -----------------------------------------------------------------------------
    def sign(self, claims: dict[str, Any], typ: str = "at+jwt", kid: str | None = None) -> str:
        key = next((k for k in self.keys if k.kid == kid), None) if kid else self.keys[-1]
        if key is None:
            raise OAuthError("invalid_request", f"no key {kid!r}; keys: {[k.kid for k in self.keys]}")
        return jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": key.kid, "typ": typ})

    def person_claims(self, sub: str) -> dict[str, Any]:
        user = self.config["users"].get(sub)
        if user is None:
            return {}
        return {"preferred_username": sub, "name": user.get("name", sub), "email": user.get("email")}

    def issue(self, grant: _Grant, *, refreshable: bool) -> dict[str, Any]:
        now = int(time.time())
        ttl = int(self.config["access_token_ttl_s"])
        client = self.config["clients"][grant.client_id]
        if client.get("access_token_format") == "opaque":
            access = secrets.token_urlsafe(32)
            self.opaque[access] = _Grant(grant.client_id, grant.sub, grant.scope, grant.audience, now + ttl)
        else:
            claims = {
                "iss": self.issuer,
                "sub": grant.sub,
                "aud": grant.audience,
                "client_id": grant.client_id,
                "scope": " ".join(grant.scope),
                "iat": now,
                "nbf": now,
                "exp": now + ttl,
                "jti": secrets.token_hex(12),
                **self.person_claims(grant.sub),
            }
            access = self.sign(claims)
        answer: dict[str, Any] = {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": ttl,
            "scope": " ".join(grant.scope),
        }
        if refreshable:
            token = secrets.token_urlsafe(32)
            expires = now + int(self.config["refresh_token_ttl_s"])
            self.refresh[token] = _Grant(grant.client_id, grant.sub, grant.scope, grant.audience, expires)
            answer["refresh_token"] = token
        if "openid" in grant.scope and grant.sub in self.config["users"]:
            id_claims = {"iss": self.issuer, "sub": grant.sub, "aud": grant.client_id, "iat": now, "exp": now + ttl}
            id_claims.update(auth_time=now, **self.person_claims(grant.sub))
            if grant.nonce:
                id_claims["nonce"] = grant.nonce
            answer["id_token"] = self.sign(id_claims, typ="JWT")
        self.count("tokens_issued")
        return answer

    def active(self, token: str) -> dict[str, Any] | None:
        """What introspection says of a token this server issued and still stands by, else None."""
        now = time.time()
        grant = self.opaque.get(token)
        if grant is not None:
            if grant.expires <= now or grant.used:
                return None
            claims = {"sub": grant.sub, "aud": grant.audience, "exp": int(grant.expires), "iss": self.issuer}
            return {
                **claims,
                "client_id": grant.client_id,
                "scope": " ".join(grant.scope),
                **self.person_claims(grant.sub),
            }
        public = {k.kid: k.private.public_key() for k in self.keys}
        try:
            kid = str(jwt.get_unverified_header(token).get("kid"))
            claims = jwt.decode(token, public[kid], algorithms=["RS256"], options={"verify_aud": False})
        except (jwt.PyJWTError, KeyError):
            return None
        if claims.get("iss") != self.issuer or claims.get("jti") in self.revoked:
            return None
        return claims

    # --- client authentication --------------------------------------------------------------
    def client_of(self, request: Request, form: dict[str, str], *, confidential: bool = False) -> str:
        client_id, secret = form.get("client_id", ""), form.get("client_secret")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(header[6:]).decode()
            except (ValueError, UnicodeDecodeError):
                raise OAuthError("invalid_client", "the Basic credentials are not base64 of id:secret", 401) from None
            client_id, _, secret = decoded.partition(":")
            client_id, secret = urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
        client = self.config["clients"].get(client_id)
        if client is None:
            raise OAuthError("invalid_client", f"no client {client_id!r} is registered", 401)
        if client.get("public") and not confidential:
            return client_id
        if not client.get("secret") or not secrets.compare_digest(str(secret or ""), client["secret"]):
            raise OAuthError("invalid_client", f"client {client_id!r}: wrong or missing secret", 401)
        return client_id

    def scopes(self, asked: str | None, client_id: str) -> list[str]:
        client = self.config["clients"][client_id]
        allowed = client.get("scopes", self.config["scopes"])
        wanted = (asked or " ".join(client.get("default_scopes", ["mesh"]))).split()
        extra = [s for s in wanted if s not in allowed]
        if extra:
            raise OAuthError("invalid_scope", f"scopes {extra} are not offered to {client_id!r}; offered: {allowed}")
        return wanted

    def audience(self, resource: str | None, client_id: str) -> str:
        return resource or self.config.get("default_audience") or client_id


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def _no_store(body: dict[str, Any], status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})


def _login_page(params: dict[str, str], problem: str = "") -> HTMLResponse:
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in params.items()
    )
    warn = f"<p role='alert'>{html.escape(problem)}</p>" if problem else ""
    page = (
        "<!doctype html><title>Sign in</title><h1>Sign in</h1>"
        f"{warn}<form method='post' action='/login'>{hidden}"
        "<label>User <input name='username' autocomplete='username'></label>"
        "<label>Password <input name='password' type='password'></label>"
        "<button type='submit'>Sign in</button></form>"
    )
    return HTMLResponse(page, status_code=400 if problem else 200)


def make_app(server: AuthServer) -> Starlette:
    async def form_of(request: Request) -> dict[str, str]:
        form = await request.form()
        return {k: v for k, v in form.items() if isinstance(v, str)}

    def check_authorize(params: dict[str, str]) -> dict[str, Any]:
        client = server.config["clients"].get(params.get("client_id", ""))
        if client is None:
            raise OAuthError("invalid_client", f"no client {params.get('client_id')!r} is registered")
        redirect = params.get("redirect_uri", "")
        if redirect not in client.get("redirect_uris", []):
            raise OAuthError("invalid_request", f"redirect_uri {redirect!r} is not registered for this client")
        if params.get("response_type") != "code":
            raise OAuthError("unsupported_response_type", "only response_type=code")
        if params.get("code_challenge_method", "") != "S256" or not params.get("code_challenge"):
            raise OAuthError("invalid_request", "PKCE is required: code_challenge with code_challenge_method=S256")
        return client

    async def authorize(request: Request) -> Response:
        params = dict(request.query_params)
        try:
            check_authorize(params)
            server.scopes(params.get("scope"), params["client_id"])
        except OAuthError as e:
            return e.response()
        return _login_page(params)

    async def login(request: Request) -> Response:
        form = await form_of(request)
        username, password = form.pop("username", ""), form.pop("password", "")
        try:
            check_authorize(form)
            scope = server.scopes(form.get("scope"), form["client_id"])
        except OAuthError as e:
            return e.response()
        user = server.config["users"].get(username)
        if user is None or not secrets.compare_digest(password, user["password"]):
            return _login_page(form, "unknown user or wrong password")
        code = secrets.token_urlsafe(24)
        server.codes[code] = _Grant(
            form["client_id"],
            username,
            scope,
            server.audience(form.get("resource"), form["client_id"]),
            time.time() + CODE_TTL_S,
            redirect_uri=form["redirect_uri"],
            challenge=form["code_challenge"],
            nonce=form.get("nonce"),
        )
        query = {"code": code, "iss": server.issuer} | ({"state": form["state"]} if "state" in form else {})
        return RedirectResponse(form["redirect_uri"] + "?" + urllib.parse.urlencode(query), status_code=302)

    async def token(request: Request) -> Response:
        form = await form_of(request)
        try:
            return _no_store(grant_token(request, form))
        except OAuthError as e:
            return e.response()

    def grant_token(request: Request, form: dict[str, str]) -> dict[str, Any]:
        kind = form.get("grant_type")
        client_id = server.client_of(request, form)
        client = server.config["clients"][client_id]
        if kind not in client.get("grant_types", ["authorization_code", "refresh_token"]):
            raise OAuthError("unauthorized_client", f"client {client_id!r} may not use grant_type {kind!r}")
        if kind == "authorization_code":
            grant = server.codes.pop(form.get("code", ""), None)
            if grant is None or grant.expires < time.time() or grant.client_id != client_id:
                raise OAuthError("invalid_grant", "the code is unknown, used, expired or another client's")
            if grant.redirect_uri != form.get("redirect_uri"):
                raise OAuthError("invalid_grant", "redirect_uri differs from the authorization request's")
            if _s256(form.get("code_verifier", "")) != grant.challenge:
                raise OAuthError("invalid_grant", "code_verifier does not match the code_challenge")
            if form.get("resource") and form["resource"] != grant.audience:
                raise OAuthError("invalid_target", "resource differs from the authorization request's")
            return server.issue(grant, refreshable=True)
        if kind == "refresh_token":
            grant = server.refresh.get(form.get("refresh_token", ""))
            if grant is None or grant.used or grant.expires < time.time() or grant.client_id != client_id:
                raise OAuthError("invalid_grant", "the refresh token is unknown, used, expired or another client's")
            grant.used = True  # rotated: each refresh token is good once
            scope = server.scopes(form["scope"], client_id) if form.get("scope") else grant.scope
            if any(s not in grant.scope for s in scope):
                raise OAuthError("invalid_scope", f"a refresh may narrow the scopes {grant.scope}, not widen them")
            audience = form.get("resource") or grant.audience
            return server.issue(_Grant(client_id, grant.sub, scope, audience, 0), refreshable=True)
        if kind == "client_credentials":
            if client.get("public"):
                raise OAuthError("unauthorized_client", "a public client has no credentials of its own")
            scope = server.scopes(form.get("scope"), client_id)
            audience = server.audience(form.get("resource"), client_id)
            return server.issue(_Grant(client_id, client_id, scope, audience, 0), refreshable=False)
        raise OAuthError(
            "unsupported_grant_type", f"grant_type {kind!r}: authorization_code, refresh_token, client_credentials"
        )

    async def introspect(request: Request) -> Response:
        form = await form_of(request)
        try:
            server.client_of(request, form, confidential=True)
        except OAuthError as e:
            return e.response()
        server.count("introspections")
        claims = server.active(form.get("token", ""))
        return _no_store({"active": False} if claims is None else {"active": True, "token_type": "Bearer", **claims})

    async def revoke(request: Request) -> Response:
        form = await form_of(request)
        try:
            client_id = server.client_of(request, form)
        except OAuthError as e:
            return e.response()
        value = form.get("token", "")
        for store in (server.refresh, server.opaque):
            grant = store.get(value)
            if grant is not None and grant.client_id == client_id:
                grant.used = True
        claims = server.active(value)
        if claims is not None and claims.get("client_id") == client_id and "jti" in claims:
            server.revoked.add(claims["jti"])
        return Response(status_code=200)

    async def userinfo(request: Request) -> Response:
        header = request.headers.get("authorization", "")
        claims = server.active(header[7:]) if header.lower().startswith("bearer ") else None
        if claims is None:
            return Response(status_code=401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return JSONResponse({"sub": claims["sub"], **server.person_claims(claims["sub"])})

    async def register(request: Request) -> Response:
        try:
            asked = await request.json()
        except ValueError:
            return OAuthError("invalid_client_metadata", "the body is not JSON").response()
        uris = asked.get("redirect_uris") if isinstance(asked, dict) else None
        if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
            return OAuthError("invalid_redirect_uri", "give redirect_uris: a list of URLs").response()
        client_id = "dyn-" + secrets.token_hex(8)
        method = asked.get("token_endpoint_auth_method", "none")
        entry: dict[str, Any] = {"redirect_uris": uris, "public": method == "none"}
        answer = {**asked, "client_id": client_id, "client_id_issued_at": int(time.time())}
        answer.update(token_endpoint_auth_method=method, grant_types=["authorization_code", "refresh_token"])
        answer.setdefault("response_types", ["code"])
        if method != "none":
            entry["secret"] = answer["client_secret"] = secrets.token_urlsafe(24)
            answer["client_secret_expires_at"] = 0
        server.config["clients"][client_id] = entry
        server.count("registrations")
        return JSONResponse(answer, status_code=201)

    async def admin_rotate(request: Request) -> Response:
        body = await request.json() if await request.body() else {}
        server.keys.append(_new_key())
        if body.get("drop_old"):
            server.keys = server.keys[-1:]
        return JSONResponse({"kid": server.keys[-1].kid, "kids": [k.kid for k in server.keys]})

    async def admin_mint(request: Request) -> Response:
        body = await request.json()
        now = int(time.time())
        claims = {"iss": server.issuer, "iat": now, "nbf": now, "exp": now + 300, "jti": secrets.token_hex(12)}
        claims.update(server.person_claims(str(body.get("claims", {}).get("sub", ""))))
        claims.update(body.get("claims", {}))
        claims = {k: v for k, v in claims.items() if v is not None}
        try:
            return JSONResponse({"token": server.sign(claims, kid=body.get("kid"))})
        except OAuthError as e:
            return e.response()

    async def admin_state(request: Request) -> Response:
        return JSONResponse({"counts": server.counts, "kids": [k.kid for k in server.keys]})

    async def metadata(request: Request) -> Response:
        return JSONResponse(server.metadata())

    async def jwks(request: Request) -> Response:
        server.count("jwks")
        return JSONResponse(server.jwks())

    return Starlette(
        routes=[
            Route("/.well-known/oauth-authorization-server", metadata),
            Route("/.well-known/openid-configuration", metadata),
            Route("/jwks", jwks),
            Route("/authorize", authorize),
            Route("/login", login, methods=["POST"]),
            Route("/token", token, methods=["POST"]),
            Route("/introspect", introspect, methods=["POST"]),
            Route("/revoke", revoke, methods=["POST"]),
            Route("/userinfo", userinfo, methods=["GET", "POST"]),
            Route("/register", register, methods=["POST"]),
            Route("/admin/rotate", admin_rotate, methods=["POST"]),
            Route("/admin/mint", admin_mint, methods=["POST"]),
            Route("/admin/state", admin_state),
        ]
    )


# --- as a process -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    import socket

    import uvicorn

    parser = argparse.ArgumentParser(description="a test OAuth 2.1 / OIDC authorization server on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--config", help="a JSON file merged over the default config (users, clients, ...)")
    args = parser.parse_args(argv)
    config = json.loads(json.dumps(DEFAULT_CONFIG))
    if args.config:
        config.update(json.loads(Path(args.config).read_text()))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))  # loopback only, always
    sock.listen(128)  # connections wait in the backlog until uvicorn serves them
    server = AuthServer(config, issuer=f"http://127.0.0.1:{sock.getsockname()[1]}")
    uv = uvicorn.Server(uvicorn.Config(make_app(server), log_level="warning", access_log=False))
    print(server.issuer, flush=True)
    uv.run(sockets=[sock])


@dataclass
class RunningAuthServer:
    """A handle on the server process a test started: its issuer URL and its test controls."""

    url: str
    process: subprocess.Popen[str]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def mint(self, kid: str | None = None, **claims: Any) -> str:
        """A token signed by the server's key (the newest, or `kid`) with these claims over its defaults."""
        return str(self._post("/admin/mint", {"claims": claims, "kid": kid})["token"])

    def rotate(self, drop_old: bool = False) -> str:
        return str(self._post("/admin/rotate", {"drop_old": drop_old})["kid"])

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/admin/state", timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def token(self, **form: str) -> dict[str, Any]:
        """POST /token with this form (e.g. grant_type, client_id, client_secret)."""
        request = urllib.request.Request(self.url + "/token", urllib.parse.urlencode(form).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def login(self, authorize_url: str, username: str, password: str) -> tuple[str, str | None]:
        """What a person does in the browser: open the authorization URL, sign in; returns (code, state)
        from the redirect to the client's redirect URI."""
        query = urllib.parse.urlsplit(authorize_url).query
        params = dict(urllib.parse.parse_qsl(query))
        with urllib.request.urlopen(authorize_url, timeout=10) as page:
            assert b"<form" in page.read()
        form = urllib.parse.urlencode({**params, "username": username, "password": password}).encode()
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            opener.open(urllib.request.Request(self.url + "/login", form, method="POST"), timeout=10)
        except urllib.error.HTTPError as e:
            if e.code != 302:
                raise
            location = e.headers["Location"]
        else:
            raise AssertionError("the login did not redirect")
        back = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))
        return back["code"], back.get("state")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextmanager
def oauth_server(folder: Path, **config: Any) -> Iterator[RunningAuthServer]:
    """The server as a process on a free loopback port, `config` merged over DEFAULT_CONFIG; ended after."""
    conf = folder / "oauth-server.json"
    conf.write_text(json.dumps(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.oauth_server", "--port", "0", "--config", str(conf)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the OAuth server did not start (exit {process.poll()}): {url!r}")
        yield RunningAuthServer(url, process)
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
