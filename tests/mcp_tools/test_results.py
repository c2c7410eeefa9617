"""What an MCP result becomes in the program (the SDK's own result types, as a server sends them)."""

from __future__ import annotations

import mcp_types as types
import pytest

from sandfleet.worker.mcp.errors import ToolError
from sandfleet.worker.mcp.results import result_value


def result(
    *content: types.ContentBlock, structured: object = None, error: bool = False
) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), structured_content=structured, is_error=error)


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def test_structured_content_wins_over_its_text_copy() -> None:
    value = result(text('{"n": 1}'), structured={"n": 1, "items": [1.5, None]})
    assert result_value(value, tool="t") == {"n": 1, "items": [1.5, None]}


def test_a_wrapped_result_unwraps_only_when_the_schema_says_so() -> None:
    wrapped = result(structured={"result": [1, 2]})
    assert result_value(wrapped, tool="t", unwrap=True) == [1, 2]
    assert result_value(wrapped, tool="t") == {"result": [1, 2]}


def test_text_images_audio_and_resources() -> None:
    image = types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")
    audio = types.AudioContent(type="audio", data="UklGRg==", mime_type="audio/wav")
    embedded = types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="hi"),
    )
    blob = types.EmbeddedResource(
        type="resource", resource=types.BlobResourceContents(uri="file:///b.bin", mime_type=None, blob="AAE=")
    )
    link = types.ResourceLink(type="resource_link", uri="https://x/y", name="y", mime_type="text/html")
    assert result_value(result(text("plain")), tool="t") == "plain"
    assert result_value(result(image), tool="t") == {
        "type": "image",
        "mime_type": "image/png",
        "data": "iVBORw0KGgo=",
    }
    assert result_value(result(text("a"), audio, embedded, blob, link), tool="t") == [
        "a",
        {"type": "audio", "mime_type": "audio/wav", "data": "UklGRg=="},
        {"type": "resource", "uri": "file:///a.txt", "mime_type": "text/plain", "text": "hi"},
        {"type": "resource", "uri": "file:///b.bin", "mime_type": None, "data": "AAE="},
        {
            "type": "resource_link",
            "uri": "https://x/y",
            "name": "y",
            "mime_type": "text/html",
            "description": None,
        },
    ]
    assert result_value(result(), tool="t") is None


def test_an_error_result_raises_tool_error_with_the_servers_message() -> None:
    with pytest.raises(ToolError, match=r"^lab__fail failed: failed on purpose: no$"):
        result_value(result(text("failed on purpose: no"), error=True), tool="lab__fail")
    with pytest.raises(ToolError, match="no message"):
        result_value(result(error=True), tool="t")
