"""An echo tool on the Python SDK: the benchmark's SDK child, next to the raw `echo_child.py`.

BENCH_SDK_ASYNC=1 registers the tool as `async def` (runs on the event loop); without it the
tool is a plain `def`, as most module authors write one (the SDK runs it in a worker thread).
"""

import os

from mesh_sdk import Server

server = Server("bench-sdk-echo", version="1")

if os.environ.get("BENCH_SDK_ASYNC") == "1":

    @server.tool()
    async def echo(text: str = "") -> str:
        """Answer with the text it was given."""
        return text

else:

    @server.tool()
    def echo(text: str = "") -> str:
        """Answer with the text it was given."""
        return text


if __name__ == "__main__":
    server.run()
