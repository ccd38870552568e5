"""The console's sessions, redirects, issuer rule, cookie flags and the bound on what it keeps of bus text."""

from __future__ import annotations

import time

import pytest
from starlette.responses import Response

from runtime.meshctl.console import auth
from runtime.meshctl.console.auth import Sessions, csrf_ok, issuer_problem, safe_next
from runtime.meshctl.console.reads import clip
from runtime.meshctl.console.web import Pages
from runtime.wire.identity import Person

ANNA = Person(iss="https://idp.example", sub="anna", name="Anna")


def test_a_session_ends_at_its_ttl_and_an_unknown_cookie_is_nobody() -> None:
    sessions = Sessions(ttl_s=0.2)
    sid, session = sessions.open(ANNA)
    assert sessions.get(sid) is session and sessions.get("forged") is None and sessions.get(None) is None
    time.sleep(0.25)
    assert sessions.get(sid) is None


def test_sessions_are_bounded_the_oldest_out_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "MAX_SESSIONS", 3)
    sessions = Sessions(ttl_s=60)
    sids = [sessions.open(ANNA)[0] for _ in range(5)]
    assert [sessions.get(s) is not None for s in sids] == [False, False, True, True, True]


def test_the_csrf_token_is_the_sessions_own() -> None:
    _, session = Sessions(60).open(ANNA)
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, session.csrf[:-1] + "x") and not csrf_ok(session, None) and not csrf_ok(session, "")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/memory?scope=billing", "/memory?scope=billing"),
        ("//evil.example/", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil", "/"),
        (None, "/"),
    ],
)
def test_after_a_login_only_a_path_of_this_console(target: object, expected: str) -> None:
    assert safe_next(target) == expected


def test_an_issuer_is_https_or_on_loopback() -> None:
    assert issuer_problem("https://idp.example") is None and issuer_problem("http://127.0.0.1:9000") is None
    assert "https://" in (issuer_problem("http://idp.example") or "")
    assert issuer_problem("ftp://idp.example") is not None


@pytest.mark.parametrize(("secure", "flag"), [(True, "secure"), (False, None)])
def test_the_cookie_is_httponly_lax_and_secure_over_tls(secure: bool, flag: str | None) -> None:
    response = Response()
    Pages(Sessions(60), secure_cookie=secure).set_cookie(response, "sid", 60)
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and ("secure" in cookie) == (flag is not None)


def test_text_from_the_bus_is_bounded_and_only_scalars_are_text() -> None:
    assert clip("x" * 5000, 100) == "x" * 100 + " [...]"
    assert clip({"a": 1}) == "" and clip(None) == "" and clip(3) == "3" and clip(True) == "true"
