"""The embedded bus's accounts line says where the node made caller passwords, or that it made none."""

from __future__ import annotations

from pathlib import Path

from runtime.bus.accounts import EmbeddedAccounts
from runtime.config import CallerAccount


def test_summary_names_the_password_files_the_node_made(tmp_path: Path) -> None:
    accounts = EmbeddedAccounts(
        tmp_path, [CallerAccount(account="alice", user="alice", password="s"), CallerAccount(account="bob", user="bob")]
    )
    line = accounts.summary()
    assert "callers alice/alice, bob/bob" in line
    assert f"caller passwords made in {tmp_path / 'callers' / 'bob.password'}" in line


def test_summary_with_every_password_in_the_config_does_not_say_none(tmp_path: Path) -> None:
    accounts = EmbeddedAccounts(tmp_path, [CallerAccount(account="alice", user="alice", password="s")])
    line = accounts.summary()
    assert "in none" not in line
    assert line.endswith("every configured caller's password is in the config")
    assert str(tmp_path / "bus-mesh.password") in line


def test_summary_without_callers_says_how_to_add_one(tmp_path: Path) -> None:
    line = EmbeddedAccounts(tmp_path, []).summary()
    assert "callers none" in line and "`meshctl caller add NAME`" in line
    for name in ("bus-mesh.password", "bus-local.password", "bus-mcp.password"):
        assert oct((tmp_path / name).stat().st_mode & 0o777) == "0o600"
