"""The caps on JSON that crosses a trust boundary: how deep it may nest, how large a record may be.

Programs, models and MCP servers hand the fleet JSON (a RESULT line, tool arguments, tool results,
frame headers, JSON-RPC messages); workers write it into records that every reader parses again.
The parsers on the way do not agree on how deep they go (measured, Python 3.11, pydantic-core 2.50):

- pydantic-core (every ``model_validate_json`` of a record, audit event or MCP message) refuses
  JSON nested more than 200 deep ("recursion limit exceeded"), and its serialiser more than 255;
- Python's ``json`` C decoder and encoder raise ``RecursionError`` near the interpreter's recursion
  limit (1000 by default) at any depth past it (10,000 or 100,000 levels alike: no crash, but an
  exception most callers do not expect).

So a value nested ~200 deep passed every check, was signed into a record, and then broke each reader
of that record; deeper, the final write itself raised. One cap for every value, far below all of
these, makes the envelope a record wraps around a value (a tool call inside an attempt inside the
record: under 10 levels) irrelevant: :data:`MAX_JSON_DEPTH`. It is checked on the JSON text, before a
recursive parser sees it, by :func:`text_depth` (no recursion: a few passes of ``bytes`` methods).

Depth counts containers: a scalar is 0 deep, ``[]`` 1, ``{"a": [1]}`` 2.
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

from sandfleet.core.errors import JsonLimitError

MAX_JSON_DEPTH = 64
"""How deep a value from a program, a model or a tool server may nest: a RESULT payload, each tool
argument, a tool's (or MCP server's) result. Real data rarely nests past 10 (the reference scenario's
answer: 1; an MCP server's structured content: a few); 64 leaves room for any of it, and a record
wrapping such a value stays under 80 deep, far from the 200 every reader can parse."""

MAX_RECORD_DEPTH = 128
"""How deep a record's JSON (a final record, an audit event) may nest when it is written: past it a
reader (pydantic-core, 200 at most) might not read it back. With the caps on values it is never
reached; the store checks it anyway, so a record that is written can always be read."""

MAX_RECORD_BYTES = 256 * 1024**2
"""The largest record (a final record's JSON, an audit event) the store writes. Redis refuses a bulk
string over 512 MB (``proto-max-bulk-len``) and a script's arguments are copied; a reader holds a
record several times over while it parses it."""

_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_AS_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 opens, -1 (as a signed byte) closes


def text_depth(text: str | bytes | bytearray) -> int:
    """How deep the JSON ``text`` nests, read without parsing it (and without recursion).

    Brackets inside strings do not count. For text that is not JSON the answer is an upper bound of
    what any JSON reading of it could nest (it never says less than a parser would find).
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if b"\\" in data:  # escapes first: an escaped backslash, then an escaped quote, are not delimiters
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    data = data.translate(None, _NOT_STRUCTURE)  # only quotes and brackets are left
    # Two adjacent quotes are an empty string, or the end of one and the start of the next with
    # nothing between: dropping them loses no bracket outside a string (most strings hold none).
    data = data.replace(b'""', b"")
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])  # what lies between two quotes is inside a string
    steps = memoryview(data.translate(_AS_STEPS)).cast("b")
    return max(accumulate(steps), default=0)


def check_depth(
    text: str | bytes | bytearray, what: str, *, cap: int = MAX_JSON_DEPTH, envelope: int = 0
) -> None:
    """Refuse ``text`` if the values it carries nest more than ``cap`` deep.

    ``envelope``: the levels of the text around those values (a request object and its argument
    list: 2), so that the cap applies to the values themselves.

    Raises:
        JsonLimitError: ``"<what> is nested more than 64 deep (the JSON nesting cap, MAX_JSON_DEPTH)"``.
    """
    depth = text_depth(text) - envelope
    if depth > cap:
        raise JsonLimitError(f"{what} {nested_message(cap)}", "depth", cap)


def loads(text: str | bytes | bytearray, what: str, *, cap: int = MAX_JSON_DEPTH, envelope: int = 0) -> Any:
    """``json.loads`` of ``text`` once :func:`check_depth` passed: never a ``RecursionError``.

    Raises:
        JsonLimitError: nested past the cap.
        ValueError: not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    check_depth(text, what, cap=cap, envelope=envelope)
    return json.loads(text)


def check_record(text: str, what: str) -> None:
    """Refuse a record's JSON that a reader might not read back (:data:`MAX_RECORD_DEPTH`,
    :data:`MAX_RECORD_BYTES`).

    Raises:
        JsonLimitError: its ``limit`` is ``"record_bytes"`` or ``"record_depth"``.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_RECORD_BYTES:
        raise JsonLimitError(
            f"{what} would be {size} bytes, more than the {MAX_RECORD_BYTES}-byte record cap "
            "(MAX_RECORD_BYTES)",
            "record_bytes",
            MAX_RECORD_BYTES,
        )
    if text_depth(text) > MAX_RECORD_DEPTH:
        raise JsonLimitError(
            f"{what} would be nested more than {MAX_RECORD_DEPTH} deep (MAX_RECORD_DEPTH): a reader "
            "could not read it back",
            "record_depth",
            MAX_RECORD_DEPTH,
        )


def nested_message(cap: int = MAX_JSON_DEPTH) -> str:
    """``"is nested more than 64 deep (the JSON nesting cap, MAX_JSON_DEPTH)"``: one wording everywhere."""
    return f"is nested more than {cap} deep (the JSON nesting cap, MAX_JSON_DEPTH)"
