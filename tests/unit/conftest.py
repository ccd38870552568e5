"""The unit tests, mirroring the packages: no node process, no compiler (those carry `toolchain`)."""

from tests.support.fake_child import script

__all__ = ["script"]
