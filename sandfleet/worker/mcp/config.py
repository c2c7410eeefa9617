"""The MCP servers a worker connects to, read from a config file in the ecosystem's ``mcpServers`` shape.

    {"mcpServers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "docs": {"url": "https://docs.example.com/mcp", "headers": {"Authorization": "Bearer ..."},
                 "timeout": 20, "sideEffects": ["publish"]}}}

A server with ``command`` runs over stdio (``args``, ``env``, ``cwd``); one with ``url`` speaks
streamable HTTP (``headers``). Sandfleet adds a few optional fields: ``timeout`` (seconds one call may
take, at most; the job's own ``tool_timeout`` bounds it too), ``sideEffects`` (``true`` or a list of the
server's tool names: calls a repaired program must not repeat), ``disabled`` and ``maxMessageBytes``
(the largest message read from the server). ``env`` and ``headers`` hold the servers' secrets: they
stay on the worker host and are never shown (not in ``repr``, not by ``sandfleet tools``/``doctor``).

Anything else is refused when the file is read, naming the file, the line and the field.
Other top-level keys are left alone: the file may be shared with other MCP clients.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sandfleet.core.errors import McpConfigError
from sandfleet.worker.mcp.jsonmap import line_of, load_with_lines

DEFAULT_CALL_TIMEOUT_S = 60.0
MAX_CALL_TIMEOUT_S = 3600.0
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024**2  # the bridge's default reply limit; images arrive as base64
MAX_SERVER_NAME_CHARS = 64
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}


class McpServerConfig(BaseModel):
    """One server of the file. ``name`` is its key under ``mcpServers``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)

    name: StrictStr
    type: Literal["stdio", "http"] | None = None
    command: StrictStr | None = None
    args: list[StrictStr] = Field(default_factory=list)
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict, repr=False)
    cwd: StrictStr | None = None
    url: StrictStr | None = None
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict, repr=False)
    timeout: float = Field(DEFAULT_CALL_TIMEOUT_S, gt=0, le=MAX_CALL_TIMEOUT_S, strict=False)
    side_effects: StrictBool | list[StrictStr] = Field(False, alias="sideEffects")
    disabled: StrictBool = False
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=1024, alias="maxMessageBytes")

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, kind: Any) -> Any:
        if kind == "sse":
            raise ValueError("the SSE transport is not supported: use streamable HTTP (type http, a url)")
        if isinstance(kind, str) and kind not in _TYPES:
            raise ValueError(f"type must be stdio or http (streamable HTTP), got {kind!r}")
        return _TYPES.get(kind, kind) if isinstance(kind, str) else kind

    @field_validator("command")
    @classmethod
    def _command_given(cls, command: str | None) -> str | None:
        if command is not None and not command.strip():
            raise ValueError("command is empty")
        return command

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.command is not None and self.url is not None:
            raise ValueError("give either command (stdio) or url (streamable HTTP), not both")
        if self.command is None and self.url is None:
            raise ValueError("needs command (a stdio server) or url (a streamable HTTP server)")
        if self.type is not None and self.type != self.transport:
            raise ValueError(f"type {self.type} does not match the {'url' if self.url else 'command'} given")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for stdio servers (command), not for a url")
        if self.command is not None and self.headers:
            raise ValueError("headers are for streamable HTTP servers (url), not for a command")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def marks_side_effects(self, tool: str) -> bool:
        """Whether the operator marked the server's tool ``tool`` (its own name) as side-effecting."""
        if isinstance(self.side_effects, bool):
            return self.side_effects
        return tool in self.side_effects

    def describe(self) -> str:
        """Where the server is, without its secrets: ``stdio: cmd args...`` or ``http: URL``."""
        if self.command is not None:
            return "stdio: " + " ".join([self.command, *self.args])
        return f"http: {self.url}"


@dataclass(frozen=True)
class McpConfig:
    """Every server of one file (disabled ones included, so tools and doctor can say so)."""

    servers: tuple[McpServerConfig, ...] = ()
    source: str = ""

    @property
    def enabled(self) -> tuple[McpServerConfig, ...]:
        return tuple(s for s in self.servers if not s.disabled)

    def server(self, name: str) -> McpServerConfig:
        return next(s for s in self.servers if s.name == name)


def load_mcp_config(path: str | Path) -> McpConfig:
    """Read and check an ``mcpServers`` file.

    Raises:
        McpConfigError: unreadable, not JSON, or a field that is wrong, e.g.
            ``mcp.json line 5, mcpServers.time.args[1]: expected a string, got 5``.
    """
    where = str(path)
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise McpConfigError(f"cannot read the MCP config {where}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise McpConfigError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_mcp_config(text, where)


def parse_mcp_config(text: str, source: str = "MCP config") -> McpConfig:
    """Check the text of an ``mcpServers`` file (see :func:`load_mcp_config`)."""
    try:
        document, lines = load_with_lines(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"{source} line {e.lineno} column {e.colno}: not valid JSON: {e.msg}") from None

    def fail(path: tuple[str | int, ...], message: str) -> McpConfigError:
        field = _dotted(path) or "(the whole file)"
        return McpConfigError(f"{source} line {line_of(lines, path)}, {field}: {message}")

    if not isinstance(document, dict):
        raise fail((), 'must be a JSON object: {"mcpServers": {name: {...}}}')
    if "mcpServers" not in document:
        raise fail((), 'has no "mcpServers" object: {"mcpServers": {name: {command | url, ...}}}')
    entries = document["mcpServers"]
    if not isinstance(entries, dict):
        raise fail(("mcpServers",), "must be an object of server name -> {command | url, ...}")
    servers = []
    for name, entry in entries.items():
        path: tuple[str | int, ...] = ("mcpServers", name)
        if not name.strip() or len(name) > MAX_SERVER_NAME_CHARS:
            raise fail(path, f"a server name must be 1-{MAX_SERVER_NAME_CHARS} characters, got {name!r}")
        if not isinstance(entry, dict):
            raise fail(path, "must be an object: {command, args, env} or {url, headers}")
        if "name" in entry:
            raise fail((*path, "name"), "unknown field (the server's name is its key)")
        try:
            servers.append(McpServerConfig.model_validate({**entry, "name": name}))
        except ValidationError as e:
            # A union (sideEffects: bool or list) fails once per branch: the deepest error is the telling one.
            error = max(e.errors(include_url=False), key=lambda item: len(item["loc"]))
            loc = tuple(p for p in error["loc"] if not _is_union_branch(p))
            raise fail((*path, *loc), _problem(error)) from None
    return McpConfig(tuple(servers), source)


def _problem(error: Any) -> str:
    kind, message = error["type"], error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        valid = ", ".join(
            field.alias or name for name, field in McpServerConfig.model_fields.items() if name != "name"
        )
        return f"unknown field; valid fields are: {valid}"
    if kind == "missing":
        return "missing"
    given = error.get("input")
    message = message[:1].lower() + message[1:]
    if kind != "value_error" and (not isinstance(given, dict | list) or kind.endswith("_type")):
        return f"{message}, got {json.dumps(given)}"
    return message


def _is_union_branch(part: Any) -> bool:
    """pydantic names the branch of a union in the error's location (``bool``, ``list[str]``)."""
    return isinstance(part, str) and ("[" in part or part in ("bool", "str", "int", "float"))


def _dotted(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
