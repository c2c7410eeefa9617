"""The tools a worker offers right now: its Python tools, plus the tools of MCP servers that are up.

MCP servers come and go (a crash, a restart), so the combined registry is rebuilt whenever the
sessions' generation changes, and is otherwise the same object. A job that names a tool of a server
that is down is not refused (the tool exists, its server is restarting): :meth:`ToolCatalog.require`
raises the transient :class:`~sandfleet.core.errors.ToolServerUnavailableError`, naming the
server, and the job is retried like one whose sandbox engine was unavailable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sandfleet.core.errors import ToolServerUnavailableError
from sandfleet.worker.mcp.names import server_of, server_prefixes
from sandfleet.worker.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the MCP SDK loads only with sessions: ~1 s of imports `sandfleet run` needs not
    from sandfleet.worker.mcp.sessions import McpSessions


class ToolCatalog:
    """Python tools and MCP sessions (optional), as one registry."""

    def __init__(self, python_tools: ToolRegistry, sessions: McpSessions | None = None) -> None:
        self.python_tools = python_tools
        self.sessions = sessions
        self._lock = threading.Lock()
        self._generation = -1
        self._registry = python_tools

    def registry(self) -> ToolRegistry:
        """Every tool offered now, Python tools first."""
        if self.sessions is None:
            return self.python_tools
        from sandfleet.worker.mcp.tools import mcp_tools

        with self._lock:
            generation = self.sessions.generation
            if generation != self._generation:
                taken = self.python_tools.names()
                self._registry = ToolRegistry([*self.python_tools, *mcp_tools(self.sessions, taken)])
                self._generation = generation
            return self._registry

    def require(self, names: Iterable[str]) -> None:
        """Check that the MCP servers of the tools ``names`` are up.

        Raises:
            ToolServerUnavailableError: a named tool belongs to a configured server that is down
                (or is named like its tools while it has never come up).
        """
        if self.sessions is None:
            return
        from sandfleet.worker.mcp.tools import McpTool

        registry = self.registry()
        prefixes = server_prefixes(self.sessions.server_names())
        enabled = {s.name for s in self.sessions.config.enabled}
        for name in names:
            tool = registry.get(name) if name in registry else None
            server = tool.server if isinstance(tool, McpTool) else None
            if tool is None:
                server = server_of(name, prefixes)
            if server in enabled and not self.sessions.is_up(server):
                raise ToolServerUnavailableError(
                    f"MCP server {server!r} (tool {name}) is down: {self.sessions.down_reason(server)}"
                )
