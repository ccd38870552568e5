"""`meshctl node status`'s seat lines: each fact once."""

from __future__ import annotations

from runtime.meshctl.cli import _seat_line


def seat(reason: str) -> dict[str, str]:
    return {"seat": "memory", "state": "elsewhere", "holder": "node-a", "module": "memory", "reason": reason}


def test_a_seat_held_elsewhere_names_the_holder_once() -> None:
    line = _seat_line(seat("node node-a holds seat memory (module memory)"))
    assert line == "seat memory: held by node node-a, not here (module memory)"


def test_a_holder_running_another_module_is_named() -> None:
    line = _seat_line(seat("node node-a holds seat memory (module memory-next)"))
    assert line.endswith("not here (module memory): node node-a holds seat memory (module memory-next)")
