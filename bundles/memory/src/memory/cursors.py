"""Cursors for recall: a listing's order fixed when its first page is asked, so paging on
neither repeats nor skips an entry while entries are added or changed.

A ranked search cannot page by a key of the entries: every entry written changes bm25's
figures for all of them, and an upsert moves an entry to the top of the newest-first order.
So the first page of a listing with more pages keeps the ids of everything that matched, in
order (at most `MAX_LISTED`), and the cursor is that listing and a position in it: a page is
the next ids, read as they are now (a forgotten one is left out, a changed one shows its new
text); what was added after the first page is on a new first page. The same cursor asked
again gives the same page, so a retried call loses nothing.

Bounded: at most `MAX_LISTINGS` listings, each for `TTL_S` after it was last used; past that
the oldest goes, and its cursor answers that it has expired. Kept in the child's memory: a
restarted child knows none (the refusal says to start again).
"""

from __future__ import annotations

import secrets
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from .model import MAX_CURSOR, Refused

MAX_LISTED = 20_000
MAX_LISTINGS = 64
TTL_S = 900.0


@dataclass
class Listing:
    owner: str | None  # the caller who asked the first page: nobody else's cursor
    arguments: str  # the filters, as the first page had them
    ids: array[int]
    complete: bool  # False: more matched than MAX_LISTED
    used: float = field(default_factory=time.monotonic)


class Listings:
    def __init__(self, capacity: int = MAX_LISTINGS, ttl_s: float = TTL_S) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._open: OrderedDict[str, Listing] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def open(self, owner: str | None, arguments: str, ids: list[int], complete: bool) -> str:
        """A new listing; returns its token."""
        self._expire()
        while len(self._open) >= self.capacity:
            self._open.popitem(last=False)
        token = secrets.token_urlsafe(12)
        self._open[token] = Listing(owner, arguments, array("q", ids), complete)
        return token

    def cursor(self, token: str, position: int) -> str:
        return f"r.{token}.{position}"

    def find(self, cursor: object, owner: str | None, arguments: str) -> tuple[Listing, int]:
        """The listing a cursor continues and the position in it; Refused with what to do instead."""
        if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR:
            raise Refused(_NOT_OURS)
        kind, _, rest = cursor.partition(".")
        token, _, position = rest.rpartition(".")
        if kind != "r" or not token or not position.isdigit():
            raise Refused(_NOT_OURS)
        self._expire()
        listing = self._open.get(token)
        if listing is None or listing.owner != owner:  # someone else's is as unknown as none
            raise Refused(
                "cursor has expired or is unknown: a listing is kept for 15 minutes after its last page, at most "
                f"{self.capacity} at once, and not across a restart of the memory; ask again without cursor"
            )
        if listing.arguments != arguments:
            raise Refused(
                "cursor belongs to a recall with other filters: pass the same key, type, scope and query as for "
                "the first page (limit may change), or ask again without cursor"
            )
        at = int(position)
        if at > len(listing.ids):
            raise Refused(_NOT_OURS)
        listing.used = time.monotonic()
        self._open.move_to_end(token)
        return listing, at

    def _expire(self) -> None:
        limit = time.monotonic() - self.ttl_s
        while self._open:
            token, oldest = next(iter(self._open.items()))
            if oldest.used >= limit:
                break
            del self._open[token]


_NOT_OURS = (
    "cursor is not one this memory gave: pass next_cursor from the previous answer unchanged, or leave it out "
    "for the first page"
)
