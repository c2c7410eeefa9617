"""The names a program calls MCP tools by: Python identifiers, unique across servers and Python tools.

A server's tool ``get-time`` on server ``clock`` becomes ``clock__get_time``: the server's name, two
underscores, the tool's name, each with every character that cannot be in an ASCII identifier
replaced by ``_``. Two servers offering the same tool are both reachable (``a__search``,
``b__search``). Whatever still clashes (servers ``my-db`` and ``my_db``, tools ``a-b`` and ``a_b`` on one
server, a Python tool that is already called ``clock__get_time``) gets ``_2``, ``_3`` ... in the order
the config and the server list them, so the names are the same on every worker with the same
config. A server that lists resources also gets ``server__read_resource`` (after its own tools, so
a tool of its own by that name keeps it). Pure functions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

from sandfleet.worker.tools.tool import MAX_TOOL_NAME_CHARS

SEPARATOR = "__"
READER = "read_resource"  # the tool a server that lists resources gets: server__read_resource(uri)
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


def identifier_part(text: str, fallback: str = "tool") -> str:
    """``text`` with every character outside ``[A-Za-z0-9_]`` replaced by ``_``; never empty, never
    starting with a digit or an underscore (those names hide from ``import *`` and look private)."""
    part = _NOT_IDENTIFIER.sub("_", text).lstrip("_")
    if not part:
        return fallback
    return f"t{part}" if part[0].isdigit() else part


def server_prefixes(servers: Sequence[str]) -> dict[str, str]:
    """A distinct identifier prefix per server name, in config order (``my-db``, ``my_db`` ->
    ``my_db``, ``my_db_2``)."""
    prefixes: dict[str, str] = {}
    used: set[str] = set()
    for server in servers:
        prefix = _unique(identifier_part(server, "server"), used)
        used.add(prefix)
        prefixes[server] = prefix
    return prefixes


def tool_names(
    listed: Mapping[str, Sequence[str]], prefixes: Mapping[str, str], taken: Iterable[str] = ()
) -> dict[tuple[str, str], str]:
    """``(server, tool) -> name`` for every listed tool, none equal to another or to ``taken``.

    Args:
        listed: each server's tool names as it lists them, servers in config order.
        prefixes: from :func:`server_prefixes` (over every configured server, up or not).
        taken: names already in use (the Python tools').
    """
    used = set(taken)
    names: dict[tuple[str, str], str] = {}
    for server, tools in listed.items():
        for tool in tools:
            name = _unique(f"{prefixes[server]}{SEPARATOR}{identifier_part(tool)}", used)
            used.add(name)
            names[(server, tool)] = name
    return names


def reader_names(servers: Sequence[str], prefixes: Mapping[str, str], taken: Iterable[str]) -> dict[str, str]:
    """``server -> name`` of each server's resource reader, ``server__read_resource`` unless that is
    taken (by one of its own tools, say: the server's tools keep their names)."""
    used = set(taken)
    names: dict[str, str] = {}
    for server in servers:
        name = _unique(f"{prefixes[server]}{SEPARATOR}{READER}", used)
        used.add(name)
        names[server] = name
    return names


def server_of(name: str, prefixes: Mapping[str, str]) -> str | None:
    """The configured server whose tools are named like ``name`` (the longest matching prefix)."""
    matches = [(len(p), s) for s, p in prefixes.items() if name.startswith(p + SEPARATOR)]
    return max(matches)[1] if matches else None


def _unique(base: str, used: set[str]) -> str:
    candidate, n = _fit(base), 1
    while candidate in used:
        n += 1
        candidate = _fit(base, f"_{n}")
    return candidate


def _fit(base: str, suffix: str = "") -> str:
    """``base + suffix`` within the tool-name limit; a cut name keeps a hash of the whole one."""
    if len(base) + len(suffix) <= MAX_TOOL_NAME_CHARS:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    return f"{base[: MAX_TOOL_NAME_CHARS - len(suffix) - 9]}_{digest}{suffix}"
