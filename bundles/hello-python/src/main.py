"""hello-python: greets, and implements the `echo` seat's `say` verb."""

from typing import Annotated, TypedDict

from mesh_sdk import CallToolResult, Server, facts, logger, result

server = Server("hello-python", version="0.1.0")
log = logger("hello-python")


class Greeting(TypedDict):
    greeting: str
    module: str  # from the node's facts, so a caller can see which module answered
    node: str


@server.tool()
def greet(name: str) -> Annotated[CallToolResult, Greeting]:
    """Greet someone by name."""
    f = facts()
    text = f"Hello, {name}!"
    log.info("greeted %s", name)
    return result(text, {"greeting": text, "module": f.module, "node": f.node})


@server.seat_tool("echo", "say")
def say(text: str) -> str:
    """Say the text back."""
    return text


if __name__ == "__main__":
    server.run()
