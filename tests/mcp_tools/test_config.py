"""The mcpServers config file: the ecosystem's shape accepted, anything else refused with line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandfleet.core.errors import McpConfigError, ToolLoadError
from sandfleet.worker.mcp.config import DEFAULT_CALL_TIMEOUT_S, load_mcp_config, parse_mcp_config

GOOD = """{
  "globalShortcut": "Ctrl+Space",
  "mcpServers": {
    "time": {
      "command": "mcp-server-time",
      "args": ["--local-timezone", "UTC"],
      "env": {"TZ_TOKEN": "secret-1"}
    },
    "docs": {
      "type": "http",
      "url": "https://docs.example.com/mcp",
      "headers": {"Authorization": "Bearer secret-2"},
      "timeout": 5,
      "sideEffects": ["publish"]
    },
    "old": {"command": "old-server", "disabled": true}
  }
}
"""


def test_the_common_shape_is_read_with_sandfleets_own_fields() -> None:
    config = parse_mcp_config(GOOD, "mcp.json")

    time, docs, old = config.servers
    assert (time.name, time.transport, time.command, time.args) == (
        "time",
        "stdio",
        "mcp-server-time",
        ["--local-timezone", "UTC"],
    )
    assert time.env == {"TZ_TOKEN": "secret-1"} and time.timeout == DEFAULT_CALL_TIMEOUT_S
    assert (docs.transport, docs.url, docs.timeout) == ("http", "https://docs.example.com/mcp", 5)
    assert docs.marks_side_effects("publish") and not docs.marks_side_effects("search")
    assert [s.name for s in config.enabled] == ["time", "docs"] and old.disabled


def test_secrets_are_not_in_the_repr_or_the_description() -> None:
    config = parse_mcp_config(GOOD)
    shown = repr(config) + "".join(s.describe() for s in config.servers)
    assert "secret-1" not in shown and "secret-2" not in shown


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '{"mcpServers": {\n "t": {\n  "command": "x",\n  "args": ["a", 5]\n }}}',
            "line 4, mcpServers.t.args[1]: input should be a valid string, got 5",
        ),
        (
            '{"mcpServers": {\n "t": {\n  "command": "x",\n  "autoApprove": []\n }}}',
            "line 4, mcpServers.t.autoApprove: unknown field; valid fields are: type, command, args, env, cwd, url, headers, timeout, sideEffects, disabled, maxMessageBytes",
        ),
        (
            '{"mcpServers": {\n "t": {\n  "url": "ftp://x"\n }}}',
            "line 3, mcpServers.t.url: url must start with http:// or https://, got 'ftp://x'",
        ),
        (
            '{"mcpServers": {\n "t": {\n  "url": "http://x",\n  "sideEffects": [1]\n }}}',
            "line 4, mcpServers.t.sideEffects[0]: input should be a valid string, got 1",
        ),
        (
            '{"mcpServers": {\n "t": {\n  "url": "http://x",\n  "timeout": 0\n }}}',
            "line 4, mcpServers.t.timeout: input should be greater than 0, got 0",
        ),
        (
            '{"mcpServers": {\n "t": {\n  "type": "sse",\n  "url": "http://x"\n }}}',
            "line 3, mcpServers.t.type: the SSE transport is not supported",
        ),
        (
            '{"mcpServers": {\n "t": {"command": "x", "url": "http://a"}\n}}',
            "line 2, mcpServers.t: give either command (stdio) or url (streamable HTTP), not both",
        ),
        ('{"mcpServers": {\n "t": {}\n}}', "line 2, mcpServers.t: needs command (a stdio server) or url"),
        (
            '{"mcpServers": {\n "t": {"command": "x", "headers": {"a": "b"}}\n}}',
            "line 2, mcpServers.t: headers are for streamable HTTP servers",
        ),
        (
            '{"mcpServers": {\n "t": {"command": "x", "env": {"A": 1}}\n}}',
            "line 2, mcpServers.t.env.A: input should be a valid string, got 1",
        ),
        (
            '{"mcpServers": {\n "t": {"command": "x",}\n}}',
            "line 2 column 23: not valid JSON: Expecting property name",
        ),
        ('{"mcpServers": []}', "line 1, mcpServers: must be an object"),
        ('{"servers": {}}', 'line 1, (the whole file): has no "mcpServers" object'),
        ("[]", "line 1, (the whole file): must be a JSON object"),
    ],
)
def test_a_malformed_config_is_refused_naming_the_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(McpConfigError) as refused:
        parse_mcp_config(text, "mcp.json")
    assert str(refused.value).startswith(f"mcp.json {expected}"), str(refused.value)
    assert isinstance(refused.value, ToolLoadError)  # what a worker refuses to start with


def test_a_missing_or_unreadable_file_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match=r"cannot read the MCP config .*nope\.json: No such file"):
        load_mcp_config(tmp_path / "nope.json")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(McpConfigError, match="not UTF-8"):
        load_mcp_config(binary)


def test_a_file_on_disk_is_read(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"a": {"url": "http://127.0.0.1:1/mcp"}}}))
    config = load_mcp_config(path)
    assert config.source == str(path) and config.server("a").transport == "http"
