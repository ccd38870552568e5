"""The HTTP face's auth and bounds as read at start (runtime/meshctl/face/auth.py): what a config or
the flags may say, what is refused and how, and which Host values the face answers for."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtime.meshctl.face.auth import load_http_settings, prm_url
from runtime.meshctl.face.catalog import FaceError
from runtime.meshctl.face.limits import opening


def _load(host: str = "127.0.0.1", config: Path | None = None, **flags: object) -> object:
    given = {"issuer": None, "audience": None, "scopes": [], "allow_unauthenticated": False, **flags}
    return load_http_settings(host, 8765, config, **given)  # type: ignore[arg-type]


def test_loopback_needs_nothing_and_hosts_are_exact() -> None:
    s = load_http_settings("127.0.0.1", 8765, None, issuer=None, audience=None, scopes=[], allow_unauthenticated=False)
    assert not s.on and s.resource == "http://127.0.0.1:8765/mcp"
    assert s.hosts == {b"127.0.0.1:8765", b"localhost:8765", b"[::1]:8765"}
    assert b"127.0.0.1:8765.evil.com" not in s.hosts


def test_a_non_loopback_address_needs_an_issuer_or_says_it_has_none(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(FaceError, match="--auth-issuer URL.*--allow-unauthenticated"):
        _load("0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="mesh.face"):
        s = load_http_settings("0.0.0.0", 8765, None, issuer=None, audience=None, scopes=[], allow_unauthenticated=True)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "without authorization" in caplog.records[0].getMessage()
    assert b"127.0.0.1:8765" in s.hosts and b"0.0.0.0:8765" in s.hosts
    # With an issuer: the URL clients use must be https (tokens would cross the network readable).
    with pytest.raises(FaceError, match="--auth-resource https://HOST/mcp"):
        _load("0.0.0.0", issuer="https://id.example")
    with caplog.at_level(logging.WARNING, logger="mesh.face"):
        caplog.clear()
        authed = load_http_settings(
            "0.0.0.0",
            8765,
            None,
            issuer="https://id.example",
            audience=None,
            scopes=["mesh"],
            allow_unauthenticated=False,
            resource="https://mesh.example/mcp",
        )
    assert authed.on and not caplog.records and authed.auth.scopes == ["mesh"]
    assert b"mesh.example" in authed.hosts and authed.resource == "https://mesh.example/mcp"


def test_the_config_file_and_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "face.toml"
    config.write_text(
        '[profiles.small]\nonly = ["who_*"]\n'
        '[auth]\nissuer = "https://id.example"\nresource = "https://mesh.example/mcp"\nscopes = ["mesh"]\n'
        "[http]\nsessions_per_person = 2\n"
    )
    s = load_http_settings(
        "127.0.0.1", 8765, config, issuer=None, audience="api://mesh", scopes=["extra"], allow_unauthenticated=False
    )
    assert (s.auth.issuer, s.auth.audience, s.auth.scopes) == ("https://id.example", "api://mesh", ["mesh", "extra"])
    assert s.http.sessions_per_person == 2
    assert {b"mesh.example:443", b"mesh.example", b"127.0.0.1:8765"} <= s.hosts
    assert prm_url(s.resource) == "https://mesh.example/.well-known/oauth-protected-resource/mcp"
    config.write_text("[auth]\nisuer = 'x'\n")
    with pytest.raises(FaceError, match="isuer"):
        _load(config=config)
    config.write_text("[http]\nheader_timeout_s = 0\n")
    with pytest.raises(FaceError, match="header_timeout_s is 0"):
        _load(config=config)
    with pytest.raises(FaceError, match="plain http is only for loopback"):
        _load(issuer="http://id.example")
    with pytest.raises(FaceError, match="give an http"):
        _load(issuer="id.example")


def test_which_requests_open_a_session() -> None:
    assert opening({"headers": [(b"content-type", b"application/json")]})
    assert not opening({"headers": [(b"mcp-session-id", b"abc")]})
    assert not opening({"headers": [(b"mcp-protocol-version", b"2026-07-28")]})
    assert opening({"headers": [(b"mcp-protocol-version", b"2025-11-25")]})
