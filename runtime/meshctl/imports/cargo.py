"""Import from crates.io: not yet; says so rather than half-doing it."""

from __future__ import annotations

from .core import Fetch, Resolved


def resolve(fetch: Fetch, args: list[str]) -> Resolved:
    raise fetch.fail(
        "crates.io imports are not built yet: use a go:, npm: or pypi: package, or make a Rust bundle "
        'of the crate\'s source by hand (language = "rust")'
    )
