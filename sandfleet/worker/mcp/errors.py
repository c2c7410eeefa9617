"""What an MCP call raises on the host, to be raised again in the program under the same type name.

The bridge sends an exception's type name and message to the program, where ``ToolError`` is the
stub's own class and ``ToolServerError`` becomes a subclass of it: ``except ToolError`` catches both.
A call that takes too long raises the builtin ``TimeoutError`` instead.
"""

from __future__ import annotations


class ToolError(Exception):
    """The tool failed: it answered ``isError`` with its message, or the server refused the call."""


class ToolServerError(ToolError):
    """The server itself failed the call: it is down, crashed mid-call, or answered with garbage or
    more bytes than allowed. The message names the server and what happened."""
