"""`meshctl module import SPEC`: a published MCP server becomes a module folder, pinned by hash.

One module per registry (npm, pypi, gomod, cargo) resolves the spec with the registry's own
client, fetches into the package cache and says what it fetched; `core` writes the folder.
"""

from runtime.meshctl.imports.core import import_package
from runtime.meshctl.imports.fetch import ImportFailed
from runtime.meshctl.imports.spec import ImportSpec, SpecError, parse_spec

__all__ = ["ImportFailed", "ImportSpec", "SpecError", "import_package", "parse_spec"]
