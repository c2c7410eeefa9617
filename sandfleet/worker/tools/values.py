"""Turning a tool's return value into a JSON value: the only thing that may cross the bridge.

Pure and deterministic, so the same return value always crosses the same way. The rules:

- ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` and ``None`` are kept (containers are copied);
  subclasses become their base type.
- ``tuple`` -> list; ``datetime``/``date``/``time`` -> ISO 8601 string; ``Decimal`` -> str (exact, no
  float rounding); ``UUID`` and ``Path`` -> str; ``Enum`` -> its value (converted in turn); a dataclass
  instance -> dict of its fields; a pydantic model -> ``model_dump(mode="json")``, checked in turn.
- Dict keys must become strings: ``str`` keys are kept; ``int`` keys and keys of the scalar kinds above
  (date, Decimal, UUID, Path, Enum) become their string form, which is what ``json.dumps`` would send and
  what a JavaScript or JSON reader expects. ``bool``, ``float``, ``None`` and tuple keys are refused
  (their string forms are ambiguous: ``True`` or ``"true"``?), and so are two keys that end up as the
  same string (``{1: .., "1": ..}``).
- NaN and infinities are refused: JSON has neither, and a silent ``null`` would hide a bug.
- Anything else (set, bytes, generator, arbitrary object) is refused, and so is nesting deeper than
  ``max_depth`` (which also stops reference cycles): by default the fleet's one nesting cap,
  ``MAX_JSON_DEPTH`` (sandfleet/core/json_limits.py, where the reason is measured).

Refusals raise :class:`ValueConversionError` (a ``TypeError`` and a ``ValueError``) naming the type, where
it sits (``[3]['tags']``) and what to return instead.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from sandfleet.core.json_limits import MAX_JSON_DEPTH, nested_message

DEFAULT_MAX_DEPTH = MAX_JSON_DEPTH

_PLAIN_SCALARS = (str, int, bool, type(None))
_HINTS: dict[type, str] = {
    set: "return a list (sorted, for a stable order)",
    frozenset: "return a list (sorted, for a stable order)",
    bytes: "decode it to str, or encode it with base64",
    bytearray: "decode it to str, or encode it with base64",
    dt.timedelta: "return a number of seconds",
    complex: "return its real and imaginary parts as two numbers",
}
_DEFAULT_HINT = "return dicts, lists, str, int, float, bool or None"


class ValueConversionError(TypeError, ValueError):
    """A value that cannot become JSON. The message names the type, the place and what to do."""


class _Refusal(Exception):
    """Raised deep inside the conversion; each level on the way up prepends its key to ``path``."""

    def __init__(self, problem: str, hint: str, too_deep: bool = False) -> None:
        super().__init__(problem, hint, too_deep)
        self.problem = problem
        self.hint = hint
        self.too_deep = too_deep
        self.path: list[str] = []


def to_json_value(value: Any, *, what: str = "the value is", max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Convert ``value`` to plain JSON types by the rules in the module docstring.

    Args:
        value: what a tool returned.
        what: the start of an error message, e.g. ``"tool load_orders returned"``.
        max_depth: containers nested deeper than this are refused.

    Raises:
        ValueConversionError: e.g. "tool x returned a set at [3]['tags'], which cannot cross the bridge;
            return a list (sorted, for a stable order)".
    """
    try:
        return _convert(value, max_depth)
    except _Refusal as refusal:
        if refusal.too_deep:  # the path of a value that deep says nothing more than the cap does
            raise ValueConversionError(
                f"{what} a value that {nested_message(max_depth)}; {refusal.hint}"
            ) from None
        where = f" at {''.join(reversed(refusal.path))}" if refusal.path else ""
        raise ValueConversionError(
            f"{what} {refusal.problem}{where}, which cannot cross the bridge; {refusal.hint}"
        ) from None


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (how big it is on the wire). ``value`` must be JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode())


def _convert(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind in _PLAIN_SCALARS:  # the common case first, by exact type
        return value
    if kind is float:
        return _finite(value)
    scalar = _convert_scalar(value)
    if scalar is not _NOT_SCALAR:
        return scalar
    if isinstance(value, Enum):
        return _convert(value.value, depth)
    if depth <= 0:
        raise _Refusal(
            f"{_a(_type_name(value))} nested too deeply", "nest less deeply, or break the cycle", True
        )
    if isinstance(value, dict):
        return _convert_dict(value, depth - 1)
    if isinstance(value, list | tuple):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_convert(item, depth - 1))
            except _Refusal as refusal:
                refusal.path.append(f"[{index}]")
                raise
        return items
    if isinstance(value, BaseModel):
        return _convert(value.model_dump(mode="json"), depth)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        return _convert_dict(fields, depth - 1)
    hint = next((h for t, h in _HINTS.items() if isinstance(value, t)), _DEFAULT_HINT)
    raise _Refusal(_a(_type_name(value)), hint)


_NOT_SCALAR = object()


def _convert_scalar(value: Any) -> Any:
    """Values with one obvious text or number form, or _NOT_SCALAR. Shared by values and dict keys."""
    if isinstance(value, Enum):  # before str and int: a StrEnum or IntEnum crosses as its value
        return _NOT_SCALAR
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _finite(float(value))
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _Refusal(f"a Decimal {value}", "JSON has no NaN or Infinity; return None or a string")
        return str(value)
    if isinstance(value, UUID | PurePath):
        return str(value)
    return _NOT_SCALAR


def _convert_dict(value: dict[Any, Any], depth: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, item in value.items():
        text = _key_text(key)
        if text in result:
            raise _Refusal(f"two dict keys that both become {text!r}", "make the keys distinct strings")
        try:
            result[text] = _convert(item, depth)
        except _Refusal as refusal:
            refusal.path.append(f"[{text!r}]")
            raise
    return result


def _key_text(key: Any) -> str:
    if type(key) is str:
        return key
    if isinstance(key, bool | float) or key is None:
        raise _Refusal(f"a dict key {key!r} ({_type_name(key)})", "use str keys")
    if isinstance(key, Enum):
        key = key.value
    text = _convert_scalar(key)
    if isinstance(text, bool | float) or text is _NOT_SCALAR:
        raise _Refusal(f"a dict key of type {_type_name(key)}", "use str keys")
    return str(text)


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise _Refusal(f"the float {number}", "JSON has no NaN or Infinity; return None or a string")
    return number


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _type_name(value: Any) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"
