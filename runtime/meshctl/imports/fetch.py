"""What every registry's importer shares: how it reaches its registry (`Fetch`), what it found
(`Resolved`), and how it fails (`ImportFailed`, naming the spec and that nothing was written)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from manifests.imported import REGISTRIES, PackageLock
from runtime.meshctl.errors import Refused
from runtime.meshctl.imports.spec import ImportSpec

CLIENT_TIMEOUT_S = 900  # a cold cache on a slow link
OUTPUT_TAIL_LINES = 12


class ImportFailed(Refused):
    def __init__(self, spec: str, reason: str) -> None:
        self.spec, self.reason = spec, reason
        super().__init__(f"import of {spec} failed: {reason}; nothing was written")


@dataclass
class Resolved:
    """What a registry's importer found: the lock, and the registry's own files for the source folder."""

    lock: PackageLock
    files: dict[str, bytes] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class Fetch:
    """How an importer may reach its registry."""

    spec: ImportSpec
    text: str  # the spec as the user wrote it, for errors
    cache: Path  # the package cache (toolchains.packaged.package_cache_dir)
    offline: bool
    work: Path  # a scratch folder, removed afterwards
    log: Callable[[str], None]

    def fail(self, reason: str) -> ImportFailed:
        return ImportFailed(self.text, reason)

    def run(self, command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
        """Run a registry client; its stdout, or ImportFailed with the tail of what it said."""
        try:
            proc = subprocess.run(
                command,
                cwd=cwd,
                env=env if env is not None else dict(os.environ),
                capture_output=True,
                text=True,
                timeout=CLIENT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise self.fail(
                f"`{command[0]}` is not installed; importing from {REGISTRIES[self.spec.registry]} needs it"
            ) from None
        except subprocess.TimeoutExpired:
            raise self.fail(f"`{' '.join(command[:3])}` did not finish in {CLIENT_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            said = [
                line
                for line in (proc.stderr + proc.stdout).strip().splitlines()
                if line.strip() and "A complete log of this run" not in line  # npm's pointer to its own log
            ]
            tail = "\n  ".join(said[-OUTPUT_TAIL_LINES:]) or f"exit code {proc.returncode}"
            hint = " (offline: is the package in the cache? run without --offline once)" if self.offline else ""
            raise self.fail(f"`{' '.join(command[:3])}` refused it{hint}:\n  {tail}")
        return proc.stdout
