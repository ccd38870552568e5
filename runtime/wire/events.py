"""`mesh.events.tools`: a node says what it serves changed (runtime/node/changes.py publishes it).

The body says which node and why, for logs; a watcher never trusts it for more than "look again".
"""

from __future__ import annotations

import msgspec


class ChangeEvent(msgspec.Struct):
    node: str
    service_id: str  # the node's Service API id, as in its $SRV.INFO answer
    reasons: list[str]
    leaving: bool = False  # the node stops serving: its INFO answers are no longer the truth
