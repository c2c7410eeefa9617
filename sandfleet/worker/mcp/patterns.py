"""JSON Schema checks of MCP tools in time linear in what they check: patterns by RE2, uniqueness by hash.

A tool's schemas come from its MCP server, and what they are checked against from the program (the
arguments, on a bridge thread) or the server (its structured output, checked by the SDK on the MCP
loop thread). jsonschema matches ``pattern`` and ``patternProperties`` with Python's ``re``, which
backtracks: measured here, ``^(a+)+$`` against 26 ``a`` and a ``b`` held the GIL 1.9 s, doubling with
each further character, and every thread of the worker (heartbeats, cancels, other jobs) stood still.
RE2 (the ``google-re2`` package) runs in time linear in the text and the pattern: the same check
takes ~10 µs, and 1,000,000 characters 2 ms. Its syntax is nearer to JSON Schema's (ECMA-262) than
``re``'s is: ``\\d`` is ASCII, ``$`` is the end of the text.

jsonschema's ``uniqueItems`` compares every pair when the items do not sort (objects): 1,000 objects
took 1 s, 4,000 took 15 s, and a 1 MiB argument holds 100,000 of them. Here it is one pass with a
set of hashable keys, with jsonschema's own equality (``1 == 1.0``, ``true != 1``).

jsonschema calls ``re.search(pattern, text)`` and ``uniq(items)`` through module globals of its
keyword modules; :func:`install` points those at the functions here, once per process, before any
schema is checked (the sessions and the signatures call it). It checks that jsonschema still looks
them up where it did, so an upgrade that moved them fails loudly rather than silently backtracking.

A pattern RE2 cannot compile (lookaround, backreferences) cannot be checked safely: the tool is not
offered (:func:`check_patterns` raises when its schemas are read; the log and ``doctor`` say why).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import re2

MAX_COMPILED_PATTERNS = 1024  # compiled RE2 patterns kept per process (least recently used dropped)
_PATCHED_MODULES = ("jsonschema._keywords", "jsonschema._utils", "jsonschema._legacy_keywords")
_install_lock = threading.Lock()
_installed = False


class PatternError(ValueError):
    """A schema pattern RE2 cannot compile; the message names the pattern and RE2's reason."""


@functools.lru_cache(maxsize=MAX_COMPILED_PATTERNS)
def compiled(pattern: str) -> Any:
    """The RE2 program of ``pattern``.

    Raises:
        PatternError: RE2 refuses it (its syntax has no lookaround or backreferences; a pattern
            needing more than RE2's memory budget is refused too).
    """
    options = re2.Options()
    options.log_errors = False  # RE2 would write each refusal to stderr
    options.never_capture = True  # only whether it matches counts
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise PatternError(
            f"pattern {pattern[:200]!r} cannot be checked safely: RE2 refuses it ({reason})"
        ) from None


def search(pattern: str, text: str, flags: int = 0) -> Any:
    """``re.search`` as jsonschema calls it, matched by RE2 (a match object, or None)."""
    if flags:
        raise PatternError("flags are not supported by the RE2 pattern check")
    return compiled(pattern).search(text)


def unique(items: Iterable[Any]) -> bool:
    """Whether the items are distinct by JSON Schema's equality, in one pass."""
    seen: set[Any] = set()
    for item in items:
        key = _key(item)
        if key in seen:
            return False
        seen.add(key)
    return True


def _key(value: Any) -> Any:
    """A hashable key equal for JSON-equal values (recursion bounded by the nesting cap)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)  # 1 and 1.0 are equal and hash alike
    if isinstance(value, str):
        return ("string", value)
    if value is None:
        return ("null",)
    if isinstance(value, dict):
        return ("object", frozenset((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_key(v) for v in value))
    return ("other", repr(value))


class _SafeRe:
    """What jsonschema's modules see as ``re``: RE2's ``search``, the rest of ``re`` unchanged."""

    search = staticmethod(search)

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


SAFE_RE = _SafeRe()


def install() -> None:
    """Make jsonschema match patterns with RE2 and check uniqueness in one pass (idempotent).

    Raises:
        RuntimeError: jsonschema no longer looks ``re`` (or ``uniq``) up where it did.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        import importlib

        modules = [importlib.import_module(name) for name in _PATCHED_MODULES]
        for module in modules:
            if getattr(module, "re", None) is not re:
                raise RuntimeError(
                    f"{module.__name__} no longer uses re: update sandfleet.worker.mcp.patterns"
                )
        keywords = modules[0]
        if not callable(getattr(keywords, "uniq", None)):
            raise RuntimeError(
                "jsonschema._keywords no longer uses uniq: update sandfleet.worker.mcp.patterns"
            )
        for module in modules:
            module.re = SAFE_RE  # type: ignore[attr-defined]
        keywords.uniq = unique  # type: ignore[attr-defined]
        _installed = True


def check_patterns(schema: Any, where: str) -> None:
    """Refuse a schema with a pattern RE2 cannot compile (``pattern`` values, ``patternProperties``
    keys, anywhere in it), so that no check of it ever needs one.

    Raises:
        PatternError: naming ``where`` (e.g. ``its inputSchema``) and the pattern.
    """
    for pattern in _patterns(schema):
        try:
            compiled(pattern)
        except PatternError as e:
            raise PatternError(f"{where} has a {e}") from None


def _patterns(schema: Any) -> Iterator[str]:
    """Every pattern in a schema, found without recursion."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                yield node["pattern"]
            properties = node.get("patternProperties")
            if isinstance(properties, dict):
                yield from (key for key in properties if isinstance(key, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
