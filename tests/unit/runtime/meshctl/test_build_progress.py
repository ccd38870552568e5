"""Build progress: a live line on a terminal, plain lines (with a heartbeat) anywhere else."""

from __future__ import annotations

import io
import time

from runtime.meshctl.verbs.node import _state_shown
from toolchains.progress import BuildProgress


def test_plain_lines_pass_through_and_a_silent_build_says_it_is_still_going() -> None:
    lines: list[str] = []
    with BuildProgress(lines.append, live=False, heartbeat_s=0.1, tick_s=0.02) as progress:
        progress("[hello-rust/tools] building (rust)...")
        time.sleep(0.35)  # the compiler is silent
        progress("[hello-rust/tools] packed out/hello-rust.tar (1 MB, 1 file) in 0.4 s")
        said = len(lines)
        time.sleep(0.2)  # nothing is building: no heartbeat
    assert lines[0] == "[hello-rust/tools] building (rust)..."
    still = [line for line in lines if "still building" in line]
    assert still and all(line.startswith("[hello-rust/tools] still building (rust) after ") for line in still)
    assert lines[said - 1].startswith("[hello-rust/tools] packed ")
    assert len(lines) == said, "a heartbeat came after the bundle was packed"


def test_a_terminal_gets_one_live_line_under_the_lines_that_stay() -> None:
    screen = io.StringIO()
    with BuildProgress(live=True, stream=screen, tick_s=0.02) as progress:
        progress("[hello-go/tools] building (go)...")
        time.sleep(0.1)
        progress("[hello-go/tools] go: building bundle 'tools'")
        progress("[hello-go/tools] packed out/hello-go.tar in 0.1 s")
    text = screen.getvalue()
    assert "\r\x1b[K  building hello-go/tools (go) 0 s" in text
    # Every kept line is written on a cleared line, and the live line is gone at the end.
    assert "\r\x1b[K[hello-go/tools] go: building bundle 'tools'\n" in text
    assert text.endswith("[hello-go/tools] packed out/hello-go.tar in 0.1 s\n")


def test_a_build_for_the_node_is_started_and_ended_by_name() -> None:
    lines: list[str] = []
    with BuildProgress(lines.append, live=False, heartbeat_s=0.05, tick_s=0.01) as progress:
        progress.start("m/b", "rust")
        time.sleep(0.2)
        progress.done("m/b")
        said = len(lines)
        time.sleep(0.1)
    assert any(line.startswith("[m/b] still building (rust) after ") for line in lines)
    assert len(lines) == said


def test_node_status_shows_how_long_a_build_has_run() -> None:
    assert _state_shown("building", 42.4) == "building (42 s)"
    assert _state_shown("ready", 99.0) == "ready"
