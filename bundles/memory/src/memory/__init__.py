"""The team memory's own code: the model's rules, its configuration, its SQLite store.

Nothing here imports the MCP library, so the store's logic is tested in-process; `main.py`
puts it behind the `memory` seat's tools.
"""
