"""An MCP server's resources as a program may read them: the URIs it listed, the templates it offered.

A program names a URI; the host accepts it only when the server listed exactly that URI or when it
matches one of the server's URI templates (RFC 6570, the expressions MCP servers use: ``{var}``,
``{+var}``, ``{#var}``, ``{/var}``, ``{.var}``, ``{;var}``, ``{?a,b}``, ``{&a}``). A value standing
for a simple ``{var}`` cannot hold ``/``, ``?`` or ``#`` (raw or percent-encoded) and no value may be a
``.``/``..`` path segment, so a template ``file:///data/{name}`` reaches only the files directly in
``/data``. Everything else is refused on the host with the reason; the server never sees it.

:func:`resource_value` turns the server's ``ReadResourceResult`` into the program's value the way
tool results are (results.py): a text content ``{"type": "resource", "uri", "mime_type", "text"}``,
a blob ``... "data"}`` (base64, as sent); one content arrives as itself, several as a list. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import mcp_types as types

MAX_URI_CHARS = 2048
MAX_RESOURCES = 10_000  # URIs kept per server; more are not readable (logged by the listing)
MAX_TEMPLATES = 1_000
MAX_SHOWN = 5  # URIs and templates named in the reader's description
SHOWN_CHARS = 100  # of each
_EXPRESSION = re.compile(r"\{([+#./;?&]?)([A-Za-z0-9_.%,*:]+)\}")
_SIMPLE_VALUE = r"[^/?#&,{}\s]+"  # one simple-expansion value, not empty: no reserved delimiter
_RESERVED_VALUE = r"[^?#{}\s]+"  # {+var}: reserved characters (/) allowed
_SEGMENT_BREAK = re.compile(r"[/\\;?&=,#]")
_ENCODED_DELIMITER = re.compile(r"%(2f|3f|23|5c)", re.IGNORECASE)  # / ? # \ percent-encoded
_OPERATORS = {
    "": _SIMPLE_VALUE,
    "+": _RESERVED_VALUE,
    "#": rf"(?:#{_RESERVED_VALUE})?",
    "/": rf"(?:/{_SIMPLE_VALUE})*",
    ".": rf"(?:\.{_SIMPLE_VALUE})*",
    ";": rf"(?:;{_SIMPLE_VALUE})*",
    "?": r"(?:\?[^#{}\s]*)?",
    "&": r"(?:&[^#{}\s]*)?",
}


@dataclass(frozen=True)
class UriTemplate:
    """One RFC 6570 template as a full-match regular expression (one group per simple value)."""

    text: str
    pattern: re.Pattern[str]
    simple_groups: tuple[int, ...]  # groups whose value must not hold an encoded delimiter

    @classmethod
    def parse(cls, text: str) -> UriTemplate | None:
        """The template, or None when it is not one this module understands (it then matches nothing)."""
        if len(text) > MAX_URI_CHARS or not text:
            return None
        parts: list[str] = []
        simple: list[int] = []
        at = 0
        for group, match in enumerate(_EXPRESSION.finditer(text), start=1):
            literal = text[at : match.start()]
            if "{" in literal or "}" in literal:
                return None
            parts.append(re.escape(literal))
            if match.group(1) == "":
                simple.append(group)
            parts.append(f"({_OPERATORS[match.group(1)]})")
            at = match.end()
        rest = text[at:]
        if "{" in rest or "}" in rest:
            return None
        parts.append(re.escape(rest))
        return cls(text, re.compile("".join(parts), re.DOTALL), tuple(simple))

    def matches(self, uri: str) -> bool:
        found = self.pattern.fullmatch(uri)
        if found is None:
            return False
        for index, value in enumerate(found.groups(), start=1):
            if _is_dot_segment(value):
                return False
            if index in self.simple_groups and _ENCODED_DELIMITER.search(value):
                return False
        return True


@dataclass(frozen=True)
class ResourceIndex:
    """What one listing of a server offered (immutable: a job keeps the index it was given)."""

    uris: frozenset[str] = frozenset()
    templates: tuple[UriTemplate, ...] = ()
    listed: tuple[str, ...] = field(default=(), compare=False)  # the URIs in the server's order

    @classmethod
    def of(cls, uris: Iterable[str], templates: Iterable[str]) -> ResourceIndex:
        kept = list(dict.fromkeys(u for u in uris if 0 < len(u) <= MAX_URI_CHARS))[:MAX_RESOURCES]
        parsed = [t for t in (UriTemplate.parse(text) for text in templates) if t is not None]
        return cls(frozenset(kept), tuple(parsed[:MAX_TEMPLATES]), tuple(kept))

    def __bool__(self) -> bool:
        return bool(self.uris or self.templates)

    def check(self, server: str, uri: object) -> str:
        """``uri`` if the program may read it.

        Raises:
            TypeError: not a string.
            ValueError: too long, or neither listed nor matching a template (the program gets the
                builtin ValueError, with the reason).
        """
        if not isinstance(uri, str):
            raise TypeError(f"uri must be a string, not {type(uri).__name__}")
        if len(uri) > MAX_URI_CHARS:
            raise ValueError(f"uri is longer than {MAX_URI_CHARS} characters")
        if uri in self.uris or any(t.matches(uri) for t in self.templates):
            return uri
        raise ValueError(
            f"MCP server {server!r} did not list the resource {uri[:200]!r}"
            f"{' nor offer a template it matches' if self.templates else ''}; {self.offered()}"
        )

    def offered(self) -> str:
        """A short account of what may be read (for errors and the reader's description)."""
        parts = []
        if self.listed:
            shown = ", ".join(u[:SHOWN_CHARS] for u in self.listed[:MAX_SHOWN])
            shown += " ..." if len(self.listed) > MAX_SHOWN else ""
            parts.append(f"{len(self.listed)} listed: {shown}")
        if self.templates:
            texts = [t.text[:SHOWN_CHARS] for t in self.templates]
            shown = ", ".join(texts[:MAX_SHOWN]) + (" ..." if len(texts) > MAX_SHOWN else "")
            parts.append(f"templates: {shown}")
        return "; ".join(parts) or "none listed"


def resource_value(result: types.ReadResourceResult) -> Any:
    """The program's value for one read (see the module docstring)."""
    values = [content_value(content) for content in result.contents]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def content_value(content: types.TextResourceContents | types.BlobResourceContents) -> dict[str, Any]:
    value: dict[str, Any] = {"type": "resource", "uri": str(content.uri), "mime_type": content.mime_type}
    if isinstance(content, types.TextResourceContents):
        value["text"] = content.text
    else:
        value["data"] = content.blob
    return value


def _is_dot_segment(value: str) -> bool:
    """Whether the value (percent-decoded) holds a ``.`` or ``..`` path segment."""
    return any(part in (".", "..") for part in _SEGMENT_BREAK.split(unquote(value)))
