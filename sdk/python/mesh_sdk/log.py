"""Logging to stderr: stdout carries only the protocol, and the runtime captures stderr."""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(levelname)s %(name)s: %(message)s"
_configured = False


def setup_logging(level: str | None = None) -> None:
    """One plain line per record on stderr; level from `level`, else LOG_LEVEL, else INFO.

    Plain lines (no colours, no multi-line boxes) because the runtime stores the last stderr
    lines of a bundle for its status and error replies. Idempotent.
    """
    global _configured
    name = (level or os.environ.get("LOG_LEVEL") or "INFO").upper()
    resolved = logging.getLevelName(name)
    if not isinstance(resolved, int):
        resolved = logging.INFO
    root = logging.getLogger()
    root.setLevel(resolved)
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        _configured = True


def logger(name: str = "bundle") -> logging.Logger:
    """A logger for a bundle's own code; its records go to stderr once logging is set up."""
    return logging.getLogger(name)
