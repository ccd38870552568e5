"""In-process tests: children are FakeChild (tests/support/fake_child.py), no process is started."""

from tests.support.fake_child import script

__all__ = ["script"]
