"""JSON text parsed with the line of every value, so a config error can name where it is.

``json.loads`` gives values without positions; an operator told "args[1] must be a string" in a
40-line file wants the line too. This reader returns the same value ``json.loads`` would (strict
JSON, duplicate keys: the last wins) and a map from each value's path (keys and list indexes) to
the 1-based line where the value starts. Errors are ``json.JSONDecodeError``, with line and column.
"""

from __future__ import annotations

import json
import re
from typing import Any

Path = tuple[str | int, ...]

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_STRINGS = json.JSONDecoder()  # raw_decode at a '"' reads exactly one string, escapes and all


def load_with_lines(text: str) -> tuple[Any, dict[Path, int]]:
    """``(value, lines)``: the parsed JSON and the line of every value by path (``()`` is the root).

    Raises:
        json.JSONDecodeError: the text is not JSON (its ``lineno`` and ``colno`` say where).
    """
    reader = _Reader(text)
    value = reader.value(reader.skip(0), ())
    end = reader.skip(reader.pos)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value, reader.lines


def line_of(lines: dict[Path, int], path: Path) -> int:
    """The line of ``path``, else of its nearest enclosing value that has one (1 at worst)."""
    for cut in range(len(path), -1, -1):
        if path[:cut] in lines:
            return lines[path[:cut]]
    return 1


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.lines: dict[Path, int] = {}

    def skip(self, pos: int) -> int:
        match = _WHITESPACE.match(self.text, pos)
        return match.end() if match else pos

    def line(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def value(self, pos: int, path: Path) -> Any:
        self.lines[path] = self.line(pos)
        char = self.text[pos : pos + 1]
        if char == "{":
            return self._object(pos + 1, path)
        if char == "[":
            return self._array(pos + 1, path)
        if char == '"':
            text, self.pos = _STRINGS.raw_decode(self.text, pos)
            return text
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, pos):
                self.pos = pos + len(word)
                return literal
        match = _NUMBER.match(self.text, pos)
        if match:
            self.pos = match.end()
            number = match.group()
            return float(number) if any(c in number for c in ".eE") else int(number)
        raise json.JSONDecodeError("Expecting value", self.text, pos)

    def _object(self, pos: int, path: Path) -> dict[str, Any]:
        result: dict[str, Any] = {}
        pos = self.skip(pos)
        if self.text[pos : pos + 1] == "}":
            self.pos = pos + 1
            return result
        while True:
            if self.text[pos : pos + 1] != '"':
                raise json.JSONDecodeError(
                    "Expecting property name enclosed in double quotes", self.text, pos
                )
            key, pos = _STRINGS.raw_decode(self.text, pos)
            pos = self.skip(pos)
            if self.text[pos : pos + 1] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", self.text, pos)
            result[key] = self.value(self.skip(pos + 1), (*path, key))
            pos = self.skip(self.pos)
            char = self.text[pos : pos + 1]
            if char == "}":
                self.pos = pos + 1
                return result
            if char != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", self.text, pos)
            pos = self.skip(pos + 1)

    def _array(self, pos: int, path: Path) -> list[Any]:
        result: list[Any] = []
        pos = self.skip(pos)
        if self.text[pos : pos + 1] == "]":
            self.pos = pos + 1
            return result
        while True:
            result.append(self.value(pos, (*path, len(result))))
            pos = self.skip(self.pos)
            char = self.text[pos : pos + 1]
            if char == "]":
                self.pos = pos + 1
                return result
            if char != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", self.text, pos)
            pos = self.skip(pos + 1)
