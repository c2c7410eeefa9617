"""A real tools module for the bridge tests, loaded by file path as a worker would load any module.

Each tool exercises one property of the bridge: exact values, conversions, errors, sizes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

__all__ = [
    "add",
    "big_text",
    "converted",
    "echo",
    "fail_with",
    "rows",
    "unconvertible",
]


class InventoryError(Exception):
    """A tool's own exception class: its name must reach the program."""


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Customer(BaseModel):
    name: str
    since: dt.date


def echo(value: Any) -> Any:
    """Return the value as received."""
    return value


def add(a: int, b: int = 1, *, scale: int = 1) -> dict:
    """(a + b) * scale, as {"sum": ...}."""
    return {"sum": (a + b) * scale}


def converted() -> dict:
    """One value of each kind the bridge converts."""
    return {
        "datetime": dt.datetime(2026, 7, 1, 12, 30, 5),
        "date": dt.date(2026, 9, 30),
        "decimal": Decimal("12.30"),
        "tuple": (1, "two", (3,)),
        "dataclass": Point(1, 2),
        "model": Customer(name="Ada", since=dt.date(2020, 1, 2)),
    }


def unconvertible(kind: str) -> Any:
    """A value the bridge must refuse: "set" or "object"."""
    return {"set": {1, 2}, "object": object()}[kind]


def fail_with(kind: str, message: str) -> None:
    """Raise KeyError, ValueError or InventoryError with the message, or a real UnicodeDecodeError."""
    if kind == "UnicodeDecodeError":
        (message.encode() + b"\xff").decode("utf-8")
    raise {"KeyError": KeyError, "ValueError": ValueError, "InventoryError": InventoryError}[kind](message)


def big_text(n_bytes: int) -> str:
    """A string of n_bytes ASCII characters."""
    return "x" * n_bytes


def rows(n: int) -> list[dict]:
    """n order-like rows (about 110 bytes each as JSON)."""
    return [
        {
            "order_id": f"O-{i:06d}",
            "date": "2026-07-01",
            "region": "EMEA",
            "product": "Enterprise",
            "quantity": i % 12,
            "unit_price": 899.0,
        }
        for i in range(n)
    ]
