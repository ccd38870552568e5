"""memory's schema migration as a step bundle: run by the node once per version of the module,
before its tools bundle starts (record 0188: one module, several bundles; a step runs to
completion). It brings `memory.sqlite3` in MESH_DATA_DIR to this version's schema with the
same numbered migrations the store uses (memory/schema.py), so an upgrade's migration is done,
and named if it fails, before the new tools answer a call. The tools bundle still calls
`migrate` when it opens the file: after this step that finds nothing to do.

Exit 0: migrated (or nothing to do). Exit 2: no MESH_DATA_DIR. Exit 3: the file is newer than
this code (a downgrade), or SQLite refused a migration; the reason is the last stderr line,
which the node names when it refuses the version.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

from memory.schema import VERSION, SchemaTooNew, migrate
from memory.store import DB_FILE


def main() -> int:
    data_dir = os.environ.get("MESH_DATA_DIR")
    if not data_dir:
        print("memory migrate: MESH_DATA_DIR is not set; the mesh node sets it to the module's data folder", file=sys.stderr)
        return 2
    path = Path(data_dir) / DB_FILE
    started = time.monotonic()
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            # As the store opens it: WAL, and a wait rather than an error when a reader holds a lock.
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA busy_timeout = 5000")
            found = migrate(db)
        finally:
            db.close()
    except (SchemaTooNew, sqlite3.Error, OSError) as e:
        print(f"memory migrate: {path}: {e}", file=sys.stderr)
        return 3
    took = (time.monotonic() - started) * 1000
    if found == VERSION:
        print(f"memory migrate: {path} is at schema {VERSION} already; nothing to do", file=sys.stderr)
    else:
        print(f"memory migrate: {path}: schema {found} -> {VERSION} in {took:.1f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
