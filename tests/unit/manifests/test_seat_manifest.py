"""`[[seat]]` in the manifest: stateful by default, `stateless = true` to opt out, `failover` for
a seat whose data fails over by itself; every mistake named with file, field and what is right."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifests import ManifestError, load_module
from tests.unit.manifests.test_manifests import GOOD, write_module


def _seat(tmp_path: Path, lines: str):
    return load_module(write_module(tmp_path / "m", GOOD.replace('name = "memory"', 'name = "memory"\n' + lines, 1)))


def test_a_seat_is_stateful_and_local_by_default(tmp_path: Path) -> None:
    seat = _seat(tmp_path, "").module.seat[0]
    assert (seat.stateless, seat.failover) == (False, "local")


def test_stateless_and_replicated_are_read(tmp_path: Path) -> None:
    assert _seat(tmp_path / "a", "stateless = true").module.seat[0].stateless is True
    assert _seat(tmp_path / "b", 'failover = "replicated"').module.seat[0].failover == "replicated"


@pytest.mark.parametrize(
    "lines, words",
    [
        ('failover = "shared"', ["seat[0].failover", "'shared'", '"local"', '"replicated"']),
        ("failover = 1", ["seat[0].failover", "1", '"local"']),
        ('stateless = true\nfailover = "replicated"', ["seat[0].failover", "stateless seat keeps no data"]),
        ('stateless = "yes"', ["seat[0].stateless", "true or false"]),
        ("stateful = true", ["seat[0].stateful", "unknown field", "failover", "stateless"]),
    ],
)
def test_seat_mistakes_are_named(tmp_path: Path, lines: str, words: list[str]) -> None:
    with pytest.raises(ManifestError) as e:
        _seat(tmp_path, lines)
    text = str(e.value)
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"
