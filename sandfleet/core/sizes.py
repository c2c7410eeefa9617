"""Byte sizes as users write them: ``512M``, ``1G``, ``1.5g``, ``4GiB`` or a plain number of bytes."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string with an optional K/M/G/T suffix (powers of 1024, as Docker).

    Raises:
        ValueError: the value is not a size; the message shows the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int | float):
        if value != int(value):
            raise ValueError(f"a size in bytes must be whole: {value!r}")
        return int(value)
    match = _SIZE.match(value)
    if not match:
        raise ValueError(f"not a size: {value!r} (use bytes or a number with K, M, G or T, e.g. 512M, 1G)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(n: int, *, rounded: bool = False) -> str:
    """The shortest exact spelling of a byte count (``4G``, ``1536M``) or plain bytes.

    ``rounded`` is for sizes that are measured rather than configured (an image's ``423 MB``): decimal
    megabytes, since no exact spelling of a measured size is short.
    """
    if rounded:
        return f"{n / 1e6:.0f} MB"
    for suffix, factor in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)
