"""An MCP ``CallToolResult`` as the JSON value the program receives.

- ``isError``: raises :class:`ToolError` with the text the tool gave (the program sees ``ToolError``).
- ``structuredContent`` present: that JSON value, as is (dicts, lists, numbers); a non-object that the
  server wrapped as ``{"result": value}`` (its output schema says so) arrives unwrapped.
- otherwise the content blocks, each as: text -> ``str``; image and audio -> ``{"type", "mime_type",
  "data"}`` (``data`` base64, as sent); an embedded resource -> ``{"type": "resource", "uri",
  "mime_type", "text"}`` or ``... "data"}`` for a blob; a resource link -> ``{"type": "resource_link",
  "uri", "name", "mime_type", "description"}``. One block arrives as itself, several as a list, none
  as ``None``.

Sizes are the bridge's business: it refuses a reply larger than the job's limit. Pure.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from sandfleet.worker.mcp.errors import ToolError

MAX_ERROR_CHARS = 4000


def result_value(result: types.CallToolResult, *, tool: str, unwrap: bool = False) -> Any:
    """The program's value for ``result`` of the call to ``tool`` (the name the program used).

    Raises:
        ToolError: the result is an error; the message is the tool's text.
    """
    if result.is_error:
        text = "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
        raise ToolError(f"{tool} failed: {text.strip()[:MAX_ERROR_CHARS] or 'no message'}")
    if result.structured_content is not None:
        value = result.structured_content
        if unwrap and isinstance(value, dict) and list(value) == ["result"]:
            return value["result"]
        return value
    blocks = [content_value(block) for block in result.content]
    if not blocks:
        return None
    return blocks[0] if len(blocks) == 1 else blocks


def content_value(block: types.ContentBlock) -> Any:
    """One content block as a JSON value (see the module docstring)."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "data": block.data}
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        value: dict[str, Any] = {"type": "resource", "uri": resource.uri, "mime_type": resource.mime_type}
        if isinstance(resource, types.TextResourceContents):
            value["text"] = resource.text
        else:
            value["data"] = resource.blob
        return value
    return {
        "type": "resource_link",
        "uri": block.uri,
        "name": block.name,
        "mime_type": block.mime_type,
        "description": block.description,
    }
