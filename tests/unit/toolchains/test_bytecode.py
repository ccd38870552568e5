"""Python bytecode compiled once where a bundle is placed (toolchains/bytecode.py)."""

from __future__ import annotations

import logging
import struct
import sys
from pathlib import Path

import pytest

from toolchains.bytecode import compile_bytecode

TAG = sys.implementation.cache_tag


def pyc_flags(pyc: Path) -> int:
    """The PEP 552 flags word of a .pyc: bit 0 hash-based, bit 1 checked against the source."""
    return struct.unpack("<I", pyc.read_bytes()[4:8])[0]


def test_a_folder_is_compiled_hash_based_and_unchecked(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "main.py").write_text("import pkg\n")
    assert compile_bytecode(tmp_path) is True
    for pyc in (tmp_path / "pkg" / "__pycache__" / f"__init__.{TAG}.pyc", tmp_path / "__pycache__" / f"main.{TAG}.pyc"):
        assert pyc.is_file(), pyc
        assert pyc_flags(pyc) == 0b01  # hash-based, never checked: no timestamp in it, no stat at import


def test_a_file_that_does_not_compile_is_named_and_the_rest_compiled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "good.py").write_text("x = 1\n")
    (tmp_path / "bad.py").write_text("print 'python 2'\n")
    with caplog.at_level(logging.WARNING, logger="mesh.bytecode"):
        assert compile_bytecode(tmp_path) is False
    assert (tmp_path / "__pycache__" / f"good.{TAG}.pyc").is_file()
    assert not (tmp_path / "__pycache__" / f"bad.{TAG}.pyc").exists()
    assert "1 file(s) do not compile (" in caplog.text and "bad.py" in caplog.text
