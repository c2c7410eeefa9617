"""Redis replies as text.

Every Redis client of the fleet is made with ``decode_responses=True``, so replies are ``str`` at run
time; redis-py types them ``bytes | str``. These helpers narrow them where they enter our code, and
decode bytes for a client made without that flag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def text_or_none(value: bytes | str | None) -> str | None:
    return None if value is None else text(value)


def text_map(mapping: Mapping[Any, Any]) -> dict[str, str]:
    return {text(k): text(v) for k, v in mapping.items()}


def text_list(values: Iterable[Any]) -> list[str]:
    return [text(v) for v in values]
