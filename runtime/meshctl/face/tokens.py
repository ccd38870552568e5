"""Bearer tokens for the HTTP face: whose they are, checked against the issuer the face trusts.

A JWT access token is verified with the issuer's keys (its JWKS, found through its metadata:
`/.well-known/oauth-authorization-server`, else `/.well-known/openid-configuration`): an
asymmetric signature by the key its `kid` names, `iss`, `exp`/`nbf` (30 s leeway), `aud` (the
face's audience). A `kid` the face has not seen makes it fetch the JWKS again (at most once a
second: a flood of made-up kids costs the issuer one request a second, not one a token). A token
that is not a JWT goes to the issuer's introspection endpoint (RFC 7662), when it has one and the
face has client credentials for it.

A verified token is kept (keyed by its SHA-256) until it expires or `cache_s` passed, whichever is
first, in a cache of at most `cache_size` tokens (least recently used out): the face does not verify
the same token on every call. An introspected token is asked about again after `cache_s`, so a
revocation takes effect within that time; a JWT is trusted until it expires, as JWTs are.

Uses the `mcp` package's `AccessToken` (so the package's session-owner check compares the person)
and PyJWT for the JOSE work.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import jwt
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials

from runtime.wire.identity import MAX_NAME_CHARS, Person

log = logging.getLogger("mesh.face")

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY_S = 30
JWKS_REFETCH_S = 1.0  # at most one JWKS fetch a second on unknown kids
DISCOVERY_RETRY_S = 5.0  # an issuer that did not answer is asked again after this long
HTTP_TIMEOUT_S = 10.0
MAX_TOKEN_CHARS = 16_384  # a header longer than this is not a token any issuer sends


class TokenRejected(Exception):
    """The token is not one the face takes: `reason` says why (it goes into the 401's description)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IssuerUnreachable(Exception):
    """The issuer's metadata, keys or introspection did not answer: the face cannot judge the token."""

    def __init__(self, issuer: str, what: str, problem: str) -> None:
        super().__init__(f"the issuer {issuer} did not give its {what}: {problem}")
        self.issuer, self.what, self.problem = issuer, what, problem


@dataclass(frozen=True)
class Verified:
    """A token the face took: the package's user (its AccessToken), the person behind it, until when it is kept."""

    user: AuthenticatedUser
    person: Person
    owner: AuthorizationContext  # the package's session owner for this token: (client id, issuer, subject)
    keep_until: float
    credentials: AuthCredentials  # starlette's, for the scope (made once per token, not per request)

    @property
    def access(self) -> AccessToken:
        return self.user.access_token


@dataclass
class VerifierSettings:
    issuer: str
    audience: str
    person_claim: str = "sub"
    introspection_client: tuple[str, str] | None = None  # (client id, secret) for RFC 7662
    cache_size: int = 4096
    cache_s: float = 300.0


@dataclass
class TokenVerifier:
    """The face's token verifier (the `mcp` package's TokenVerifier protocol, and `verified` for the face)."""

    settings: VerifierSettings
    http: httpx2.AsyncClient = field(default_factory=lambda: httpx2.AsyncClient(timeout=HTTP_TIMEOUT_S))
    _metadata: dict[str, Any] | None = None
    _metadata_failed_at: float = -1e9
    _keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    _keys_fetched_at: float = -1e9
    _cache: OrderedDict[bytes, Verified] = field(default_factory=OrderedDict)
    _lock: anyio.Lock = field(default_factory=anyio.Lock)
    counts: dict[str, int] = field(default_factory=lambda: {"verified": 0, "cached": 0, "rejected": 0})

    async def aclose(self) -> None:
        await self.http.aclose()

    # --- the mcp package's TokenVerifier --------------------------------------------------------
    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            return (await self.verified(token)).access
        except (TokenRejected, IssuerUnreachable):
            return None

    # --- the face's ---------------------------------------------------------------------------
    async def verified(self, token: str) -> Verified:
        """The token's person and access, from the cache or verified now; TokenRejected or IssuerUnreachable."""
        if len(token) > MAX_TOKEN_CHARS:
            raise TokenRejected(f"the token is {len(token)} characters; at most {MAX_TOKEN_CHARS}")
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        now = time.time()
        kept = self._cache.get(key)
        if kept is not None:
            if kept.keep_until > now:
                self._cache.move_to_end(key)
                self.counts["cached"] += 1
                return kept
            del self._cache[key]
        try:
            claims = await (self._jwt(token) if token.count(".") == 2 else self._introspect(token))
            found = self._taken(token, claims, now)
        except TokenRejected:
            self.counts["rejected"] += 1
            raise
        self.counts["verified"] += 1
        self._cache[key] = found
        if len(self._cache) > self.settings.cache_size:
            self._cache.popitem(last=False)
        return found

    def _taken(self, token: str, claims: dict[str, Any], now: float) -> Verified:
        s = self.settings
        subject = claims.get(s.person_claim)
        if not isinstance(subject, str) or not subject:
            raise TokenRejected(f"the token has no {s.person_claim!r} claim naming the person")
        name = next(
            (v for v in (claims.get("preferred_username"), claims.get("email")) if isinstance(v, str) and v),
            subject,
        )
        for what, text in (("subject", subject), ("name", name)):
            if not text.isprintable() or len(text) > MAX_NAME_CHARS:
                raise TokenRejected(f"the token's {what} is unprintable or over {MAX_NAME_CHARS} characters")
        person = Person(iss=s.issuer, sub=subject, name=name)
        scopes = _scopes(claims)
        exp = claims.get("exp")
        expires = int(exp) if isinstance(exp, (int, float)) else None
        client_id = claims.get("client_id") or claims.get("azp") or ""
        access = AccessToken(
            token=token,
            client_id=str(client_id),
            scopes=scopes,
            expires_at=expires,
            resource=s.audience,
            subject=subject,
            claims={"iss": s.issuer},
        )
        keep_until = min(float(expires) if expires is not None else now + s.cache_s, now + s.cache_s)
        user = AuthenticatedUser(access)
        return Verified(user, person, authorization_context(user), keep_until, AuthCredentials(scopes))

    # --- JWT ----------------------------------------------------------------------------------
    async def _jwt(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise TokenRejected(f"the token is not a JWT ({e})") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise TokenRejected(f"the token is signed with {alg!r}; the face takes {', '.join(ALGORITHMS)}")
        key = await self._key(kid if isinstance(kid, str) else None)
        s = self.settings
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=s.audience,
                issuer=s.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRejected("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRejected("the token is not valid yet (nbf or iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise TokenRejected(f"the token is not for this resource (its aud is not {s.audience})") from None
        except jwt.InvalidIssuerError:
            raise TokenRejected(f"the token was not issued by {s.issuer}") from None
        except jwt.InvalidSignatureError:
            raise TokenRejected("the token's signature does not verify with the issuer's key") from None
        except jwt.PyJWTError as e:
            raise TokenRejected(f"the token is not valid: {e}") from None
        return claims

    async def _key(self, kid: str | None) -> jwt.PyJWK:
        key = self._pick(kid)
        if key is not None:
            return key
        async with self._lock:
            key = self._pick(kid)  # another request fetched them meanwhile
            if key is None and time.monotonic() - self._keys_fetched_at >= JWKS_REFETCH_S:
                await self._fetch_keys()
                key = self._pick(kid)
        if key is None:
            known = ", ".join(sorted(self._keys)) or "none"
            raise TokenRejected(f"the token's key {kid!r} is not among the issuer's keys ({known})")
        return key

    def _pick(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is not None:
            return self._keys.get(kid)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None  # no kid: only with one key

    async def _fetch_keys(self) -> None:
        metadata = await self.metadata()
        uri = metadata.get("jwks_uri")
        if not isinstance(uri, str):
            raise TokenRejected(f"the issuer {self.settings.issuer} names no jwks_uri; it cannot vouch for a JWT")
        self._keys_fetched_at = time.monotonic()
        document = await self._get_json(uri, "JWKS")
        keys: dict[str, jwt.PyJWK] = {}
        for entry in document.get("keys", []) if isinstance(document.get("keys"), list) else []:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                keys[str(entry.get("kid", ""))] = jwt.PyJWK(entry)
            except jwt.PyJWTError as e:  # a key type PyJWT cannot use: the others still count
                log.warning("issuer %s: a JWKS key is left out: %s", self.settings.issuer, e)
        self._keys = keys
        log.info("issuer %s: %d signing keys (%s)", self.settings.issuer, len(keys), ", ".join(keys))

    # --- metadata and introspection -------------------------------------------------------------
    async def metadata(self) -> dict[str, Any]:
        """The issuer's authorization server metadata (RFC 8414, else OpenID discovery), read once."""
        if self._metadata is not None:
            return self._metadata
        issuer = self.settings.issuer
        if time.monotonic() - self._metadata_failed_at < DISCOVERY_RETRY_S:
            raise IssuerUnreachable(issuer, "metadata", "it did not answer a moment ago")
        problems = []
        for url in _discovery_urls(issuer):
            try:
                found = await self._get_json(url, "metadata")
            except IssuerUnreachable as e:
                problems.append(f"{url}: {e.problem}")
                continue
            if found.get("issuer") != issuer:
                problems.append(f"{url} names the issuer {found.get('issuer')!r}, not {issuer!r}")
                continue
            self._metadata = found
            return found
        self._metadata_failed_at = time.monotonic()
        raise IssuerUnreachable(issuer, "metadata", "; ".join(problems))

    async def _introspect(self, token: str) -> dict[str, Any]:
        s = self.settings
        metadata = await self.metadata()
        endpoint = metadata.get("introspection_endpoint")
        if not isinstance(endpoint, str) or s.introspection_client is None:
            raise TokenRejected(
                "the token is not a JWT, and the face cannot introspect it (the issuer offers no "
                "introspection_endpoint, or the face has no introspection client id and secret)"
            )
        try:
            response = await self.http.post(endpoint, data={"token": token}, auth=s.introspection_client)
        except httpx2.HTTPError as e:
            raise IssuerUnreachable(s.issuer, "introspection", f"{type(e).__name__}: {e}") from None
        if response.status_code != 200:
            raise IssuerUnreachable(s.issuer, "introspection", f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            claims = response.json()
        except ValueError:
            raise IssuerUnreachable(s.issuer, "introspection", "the answer is not JSON") from None
        if not isinstance(claims, dict) or claims.get("active") is not True:
            raise TokenRejected("the issuer says the token is not active (expired, revoked or unknown)")
        if "iss" in claims and claims["iss"] != s.issuer:
            raise TokenRejected(f"the token was not issued by {s.issuer}")
        audience = claims.get("aud")
        if audience is not None and s.audience not in (audience if isinstance(audience, list) else [audience]):
            raise TokenRejected(f"the token is not for this resource (its aud is not {s.audience})")
        exp = claims.get("exp")
        if isinstance(exp, (int, float)) and exp + LEEWAY_S < time.time():
            raise TokenRejected("the token has expired")
        return claims

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = await self.http.get(url)
        except httpx2.HTTPError as e:
            raise IssuerUnreachable(self.settings.issuer, what, f"{type(e).__name__}: {e}") from None
        if response.status_code != 200:
            raise IssuerUnreachable(self.settings.issuer, what, f"HTTP {response.status_code} from {url}")
        try:
            found = response.json()
        except ValueError:
            raise IssuerUnreachable(self.settings.issuer, what, f"{url} did not answer JSON") from None
        if not isinstance(found, dict):
            raise IssuerUnreachable(self.settings.issuer, what, f"{url} did not answer a JSON object")
        return found


def _discovery_urls(issuer: str) -> list[str]:
    """RFC 8414 (the well-known name before the issuer's path), then OpenID Connect (after it)."""
    scheme, _, rest = issuer.partition("://")
    host, slash, path = rest.partition("/")
    path = (slash + path).rstrip("/")
    return [
        f"{scheme}://{host}/.well-known/oauth-authorization-server{path}",
        f"{issuer.rstrip('/')}/.well-known/openid-configuration",
    ]


def _scopes(claims: dict[str, Any]) -> list[str]:
    found = claims.get("scope", claims.get("scp"))
    if isinstance(found, str):
        return found.split()
    if isinstance(found, list):
        return [s for s in found if isinstance(s, str)]
    return []
