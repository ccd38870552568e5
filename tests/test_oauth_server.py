"""The test authorization server (tests/support/oauth_server.py) as a process: what a resource
server or relying party relies on holds (discovery, JWKS-verifiable tokens, PKCE, refresh rotation,
client credentials, introspection, key rotation), and what it must refuse, it refuses."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import jwt
import pytest

from tests.support.oauth_server import RunningAuthServer, oauth_server

REDIRECT = "http://127.0.0.1/callback"
RESOURCE = "http://127.0.0.1:9/mcp"


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAuthServer]:
    with oauth_server(tmp_path_factory.mktemp("oauth")) as server:
        yield server


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _post(url: str, form: dict[str, str], basic: tuple[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    headers = {}
    if basic is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
    request = urllib.request.Request(url, urllib.parse.urlencode(form).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _verify(auth: RunningAuthServer, token: str, audience: str) -> dict[str, Any]:
    """As a resource server does: the key named by `kid` from the JWKS, then the claims."""
    keys = {k["kid"]: k for k in _get(auth.url + "/jwks")["keys"]}
    key = jwt.PyJWK(keys[jwt.get_unverified_header(token)["kid"]])
    claims: dict[str, Any] = jwt.decode(token, key, algorithms=["RS256"], audience=audience, issuer=auth.url)
    return claims


def _code_flow(auth: RunningAuthServer, user: str, password: str, **extra: str) -> dict[str, Any]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = {
        "response_type": "code",
        "client_id": "desktop",
        "redirect_uri": REDIRECT,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "st-1",
        "scope": "openid mesh",
        "resource": RESOURCE,
        "nonce": "n-1",
        **extra,
    }
    code, state = auth.login(auth.url + "/authorize?" + urllib.parse.urlencode(query), user, password)
    assert state == "st-1"
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": "desktop"}
    status, answer = _post(auth.url + "/token", {**form, "code_verifier": verifier})
    assert status == 200, answer
    # The code is good once.
    status, again = _post(auth.url + "/token", {**form, "code_verifier": verifier})
    assert status == 400 and again["error"] == "invalid_grant"
    return answer


def test_discovery_names_every_endpoint(auth: RunningAuthServer) -> None:
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
        meta = _get(auth.url + path)
        assert meta["issuer"] == auth.url
        assert meta["code_challenge_methods_supported"] == ["S256"]
        for endpoint in ("authorization_endpoint", "token_endpoint", "jwks_uri", "introspection_endpoint"):
            assert meta[endpoint].startswith(auth.url + "/")
    assert all(k["kty"] == "RSA" and k["kid"] for k in _get(auth.url + "/jwks")["keys"])


def test_authorization_code_with_pkce_gives_tokens_for_the_person(auth: RunningAuthServer) -> None:
    answer = _code_flow(auth, "alice", "alice-pw")
    claims = _verify(auth, answer["access_token"], RESOURCE)  # RFC 8707: the resource is the audience
    assert (claims["sub"], claims["preferred_username"], claims["scope"]) == ("alice", "alice", "openid mesh")
    assert jwt.get_unverified_header(answer["access_token"])["typ"] == "at+jwt"
    id_token = _verify(auth, answer["id_token"], "desktop")
    assert (id_token["sub"], id_token["nonce"], id_token["email"]) == ("alice", "n-1", "alice@example.test")
    # Refresh: a new access token; the old refresh token is spent.
    refresh = {"grant_type": "refresh_token", "refresh_token": answer["refresh_token"], "client_id": "desktop"}
    status, renewed = _post(auth.url + "/token", refresh)
    assert status == 200 and _verify(auth, renewed["access_token"], RESOURCE)["sub"] == "alice"
    status, again = _post(auth.url + "/token", refresh)
    assert status == 400 and again["error"] == "invalid_grant"
    with urllib.request.urlopen(
        urllib.request.Request(auth.url + "/userinfo", headers={"Authorization": "Bearer " + renewed["access_token"]})
    ) as response:
        assert json.loads(response.read())["name"] == "Alice Liddell"


def test_what_the_server_refuses(auth: RunningAuthServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        auth.login(auth.url + "/authorize?" + urllib.parse.urlencode({"client_id": "desktop"}), "alice", "alice-pw")
    assert e.value.code == 400  # no PKCE, no redirect_uri
    query = {"response_type": "code", "client_id": "desktop", "redirect_uri": REDIRECT}
    query.update(code_challenge="x" * 43, code_challenge_method="S256")
    with pytest.raises(urllib.error.HTTPError) as e:  # a wrong password: the form again, no code
        auth.login(auth.url + "/authorize?" + urllib.parse.urlencode(query), "alice", "bob-pw")
    assert e.value.code == 400 and b"wrong password" in e.value.read()
    code, _ = auth.login(auth.url + "/authorize?" + urllib.parse.urlencode(query), "bob", "bob-pw")
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": "desktop"}
    status, answer = _post(auth.url + "/token", {**form, "code_verifier": "not-the-verifier"})
    assert status == 400 and "code_verifier" in answer["error_description"]
    status, answer = _post(auth.url + "/token", {"grant_type": "client_credentials", "client_id": "service"})
    assert status == 401 and answer["error"] == "invalid_client"


def test_client_credentials_and_introspection(auth: RunningAuthServer) -> None:
    creds = ("service", "service-secret")
    status, answer = _post(auth.url + "/token", {"grant_type": "client_credentials", "resource": RESOURCE}, creds)
    assert status == 200 and "refresh_token" not in answer
    assert _verify(auth, answer["access_token"], RESOURCE)["sub"] == "service"
    status, seen = _post(auth.url + "/introspect", {"token": answer["access_token"]}, creds)
    assert status == 200 and seen["active"] is True and seen["sub"] == "service"
    status, seen = _post(auth.url + "/introspect", {"token": "made-up"}, creds)
    assert status == 200 and seen == {"active": False}
    status, _ = _post(auth.url + "/introspect", {"token": answer["access_token"]})
    assert status == 401  # introspection is for a confidential client
    # Revoked: introspection stops standing by it.
    status, _ = _post(auth.url + "/revoke", {"token": answer["access_token"]}, creds)
    assert status == 200
    assert _post(auth.url + "/introspect", {"token": answer["access_token"]}, creds)[1] == {"active": False}


def test_opaque_tokens_are_known_only_through_introspection(auth: RunningAuthServer) -> None:
    verifier = "v" * 50
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = {"response_type": "code", "client_id": "opaque-desktop", "redirect_uri": REDIRECT, "resource": RESOURCE}
    query.update(code_challenge=challenge, code_challenge_method="S256")
    code, _ = auth.login(auth.url + "/authorize?" + urllib.parse.urlencode(query), "bob", "bob-pw")
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": "opaque-desktop"}
    status, answer = _post(auth.url + "/token", {**form, "code_verifier": verifier})
    assert status == 200 and answer["access_token"].count(".") != 2
    status, seen = _post(auth.url + "/introspect", {"token": answer["access_token"]}, ("service", "service-secret"))
    assert seen["active"] and (seen["sub"], seen["aud"], seen["preferred_username"]) == ("bob", RESOURCE, "bob")


def test_key_rotation_and_minted_tokens(auth: RunningAuthServer, tmp_path: Path) -> None:
    old = _get(auth.url + "/jwks")["keys"][-1]["kid"]
    new = auth.rotate()
    kids = [k["kid"] for k in _get(auth.url + "/jwks")["keys"]]
    assert old in kids and new in kids and new != old
    token = auth.mint(sub="alice", aud=RESOURCE, scope="mesh")
    assert jwt.get_unverified_header(token)["kid"] == new
    assert _verify(auth, token, RESOURCE)["name"] == "Alice Liddell"
    expired = auth.mint(sub="alice", aud=RESOURCE, exp=1, nbf=None)
    with pytest.raises(jwt.ExpiredSignatureError):
        _verify(auth, expired, RESOURCE)
    assert auth.state()["counts"]["jwks"] >= 1
