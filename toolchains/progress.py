"""Progress of long builds: what is being built and for how long, while the compiler is silent.

A toolchain runs its compiler to the end before it says anything (the output is kept for the
error message), so a cold Rust build is minutes of nothing. `BuildProgress` is the `progress`
callback of `build_module`/`stage_bundle` plus a clock: on a terminal it keeps one live line at
the bottom ("building hello-rust/tools (rust) 42 s"), rewritten every second under the lines
that stay; anywhere else (a log, a pipe, CI) it writes plain lines only, and one "still
building ... after N s" line every `heartbeat_s` while a bundle builds.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from types import TracebackType
from typing import Callable, TextIO

# "[module/bundle] building (language)..." is how toolchains.build announces a bundle.
_STARTED = re.compile(r"^\s*\[([^\]]+)\] building \(([^)]+)\)")
# "[module/bundle] packed ..." ends it (a bundle built for the node, unpacked, never says it).
_ENDED = re.compile(r"^\s*\[([^\]]+)\] packed ")
HEARTBEAT_S = 30.0  # plain output: one line per half minute of a silent build
TICK_S = 1.0  # live line: redrawn every second


class LiveLine:
    """One line at the bottom of a terminal, rewritten in place: a carriage return, then erase to its end."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False  # the line is on the screen

    def draw(self, text: str) -> None:
        self.stream.write(f"\r\x1b[K{text}")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class BuildProgress:
    """A `progress` callback that also tells how long the current bundle has been building.

    Use as a context manager around the build; `done(key)` ends a bundle that no "packed" line
    ends (a build for the node). Thread-safe: the clock runs in its own daemon thread.
    """

    def __init__(
        self,
        write: Callable[[str], None] | None = None,
        *,
        live: bool | None = None,
        stream: TextIO | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        tick_s: float = TICK_S,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._write = write if write is not None else self._print
        self.live = self._stream.isatty() if live is None else live
        self._heartbeat_s = heartbeat_s
        self._tick_s = tick_s
        self._lock = threading.Lock()
        self._current: tuple[str, str, float] | None = None  # (module/bundle, language, started)
        self._said_at = 0.0
        self._stop = threading.Event()
        self._clock: threading.Thread | None = None
        self._line = LiveLine(self._stream)

    def __enter__(self) -> BuildProgress:
        self._clock = threading.Thread(target=self._tick, name="build-progress", daemon=True)
        self._clock.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._clock is not None:
            self._clock.join(timeout=2)
        with self._lock:
            self._clear()

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        with self._lock:
            started, ended = _STARTED.match(line), _ENDED.match(line)
            if started:
                self._current = (started[1], started[2], now)
                self._said_at = now
            elif ended and self._current is not None and ended[1] == self._current[0]:
                self._current = None
            self._clear()
            self._write(line)
            self._draw(now)

    def start(self, key: str, language: str) -> None:
        """The bundle `key` ("module/bundle") starts building (for callers that announce it themselves)."""
        now = time.monotonic()
        with self._lock:
            self._current = (key, language, now)
            self._said_at = now
            self._draw(now)

    def done(self, key: str) -> None:
        """The bundle `key` ("module/bundle") is built (for callers whose lines carry no "packed")."""
        with self._lock:
            if self._current is not None and self._current[0] == key:
                self._current = None
                self._clear()

    def _print(self, line: str) -> None:
        print(line, file=self._stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            with self._lock:
                if self._current is None:
                    continue
                if self.live:
                    self._draw(now)
                elif now - self._said_at >= self._heartbeat_s:
                    key, language, started = self._current
                    self._said_at = now
                    self._write(f"[{key}] still building ({language}) after {now - started:.0f} s")

    def _draw(self, now: float) -> None:
        if not self.live or self._current is None:
            return
        key, language, started = self._current
        self._line.draw(f"  building {key} ({language}) {now - started:.0f} s")

    def _clear(self) -> None:
        self._line.clear()
