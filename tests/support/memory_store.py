"""The memory module's store for in-process tests: its source on sys.path, three writers as the
channel would make them (memory/identity.py), and the store with its answers' structuredContent
as the tests read it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent.parent.parent / "bundles" / "memory" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from memory.config import Project  # noqa: E402
from memory.identity import writer  # noqa: E402
from memory.model import MAX_REPLY_BYTES, Writer  # noqa: E402
from memory.store import Answer, Store  # noqa: E402
from mesh_sdk.call import Caller  # noqa: E402


def _writer(account: str, user: str | None, via: str) -> Writer:
    made = writer(Caller(account=account, user=user, name=None, via=via))
    assert made is not None
    return made


ALICE = _writer("ALICE", "alice", "bus")
BOB = _writer("BOB", "bob", "mcp")
OPERATOR = _writer("MESH", None, "local")  # the mesh account: a scope admin under the default policy
BILLING = Project("billing", "Billing platform", "Invoices and payments")


def reply_bytes(answer: Answer) -> int:
    """The answer as the child writes it: one JSON-RPC line (the library's compact JSON, UTF-8)."""
    line = {
        "jsonrpc": "2.0",
        "id": 2**31,
        "result": {
            "content": [{"type": "text", "text": answer.text}],
            "structuredContent": answer.data,
            "isError": False,
        },
    }
    return len(json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()) + 1


def bounded(answer: Answer) -> Answer:
    """The answer, after checking it is within the reply bound."""
    assert reply_bytes(answer) <= MAX_REPLY_BYTES, reply_bytes(answer)
    return answer


class Memory(Store):
    """The store; `put` and `find` give the structuredContent, every answer checked against the bound."""

    def put(self, who: Writer | None, content: Any, type: Any, key: Any = None, scope: Any = None) -> dict[str, Any]:
        return bounded(self.remember(who, content, type, key, scope)).data

    def find(self, who: Writer | None, **filters: Any) -> list[dict[str, Any]]:
        return bounded(self.recall(who, **filters)).data["entries"]


def version_2_store(path: Path, entries: list[tuple[str, str]], author: str = "alice/alice") -> None:
    """A data file as release 0.1.0 of the module (schema 2) holds `entries` (type, content) in the
    global scope: written with SQL, so it holds what that release let through (control characters)."""
    import sqlite3

    from memory.schema import migrate

    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, upto=2)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO entry (scope_id, type, content, author, source, created_at, updated_at) "
        "VALUES (1, ?, ?, ?, 'bus', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')",
        [(type_, content, author) for type_, content in entries],
    )
    db.execute("COMMIT")
    db.close()
