"""The conformance suite's tools (@modelcontextprotocol/conformance, server scenarios), on the
Python SDK. The face names module `test`'s tool `simple_text` `test_simple_text`, which is the
name the suite calls."""

import base64

import anyio
from mcp.types import (
    AudioContent,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from mesh_sdk import CallToolResult, Context, Server, progress

server = Server("test")

# A 1x1 red pixel PNG and a tiny WAV header: what the suite asks for, nothing more.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c63f8cfc0f01f0005000201e221bc330000000049454e44ae426082"
    )
).decode()
WAV = base64.b64encode(
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00"
).decode()
RESOURCE = EmbeddedResource(
    type="resource",
    resource=TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
    ),
)


@server.tool()
def simple_text() -> CallToolResult:
    """Returns simple text content."""
    return CallToolResult(content=[TextContent(type="text", text="This is a simple text response for testing.")])


@server.tool()
def image_content() -> CallToolResult:
    """Returns image content."""
    return CallToolResult(content=[ImageContent(type="image", data=PNG, mime_type="image/png")])


@server.tool()
def audio_content() -> CallToolResult:
    """Returns audio content."""
    return CallToolResult(content=[AudioContent(type="audio", data=WAV, mime_type="audio/wav")])


@server.tool()
def embedded_resource() -> CallToolResult:
    """Returns an embedded resource."""
    return CallToolResult(content=[RESOURCE])


@server.tool()
def multiple_content_types() -> CallToolResult:
    """Returns text, image and resource content."""
    return CallToolResult(
        content=[
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG, mime_type="image/png"),
            RESOURCE,
        ]
    )


@server.tool()
def error_handling() -> CallToolResult:
    """Always fails, as a tool result with isError."""
    return CallToolResult(
        content=[TextContent(type="text", text="This tool intentionally returns an error for testing")], is_error=True
    )


@server.tool()
async def tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50, 100 of 100."""
    for step in (0, 50, 100):
        await progress(ctx, step, 100, f"at {step}")
        await anyio.sleep(0.05)
    return "progress done"


if __name__ == "__main__":
    server.run()
