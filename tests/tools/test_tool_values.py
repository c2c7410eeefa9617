"""Every rule of converting a tool's result to JSON, and every refusal naming the type and the place."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from decimal import Decimal
from enum import Enum, IntEnum, StrEnum
from pathlib import Path, PurePosixPath
from uuid import UUID

import pytest
from pydantic import BaseModel

from sandfleet.core.json_limits import MAX_JSON_DEPTH
from sandfleet.worker.tools.values import DEFAULT_MAX_DEPTH, ValueConversionError, json_size, to_json_value


class Color(StrEnum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


class Shape(Enum):
    SQUARE = ("square", 4)


@dataclasses.dataclass
class Line:
    product: str
    quantity: int
    shipped: dt.date | None = None


@dataclasses.dataclass
class Invoice:
    number: str
    lines: list[Line]
    total: Decimal


class Customer(BaseModel):
    name: str
    since: dt.date
    tags: tuple[str, ...] = ()


class Wrapper(BaseModel):
    customer: Customer
    score: float


JSON_VALUES = [
    None,
    True,
    False,
    0,
    -7,
    2**70,
    1.5,
    -0.0,
    "",
    "héllo ✓",
    [],
    {},
    [1, [2, [3]]],
    {"a": {"b": [None]}},
]


@pytest.mark.parametrize("value", JSON_VALUES)
def test_json_values_cross_unchanged(value: object) -> None:
    converted = to_json_value(value)
    assert converted == value
    assert json.loads(json.dumps(converted)) == value


def test_containers_are_copied() -> None:
    rows = [{"a": [1]}]
    converted = to_json_value(rows)
    converted[0]["a"].append(2)
    assert rows == [{"a": [1]}]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ((1, (2, "x")), [1, [2, "x"]]),
        (dt.datetime(2026, 7, 1, 9, 30, 5), "2026-07-01T09:30:05"),
        (dt.datetime(2026, 7, 1, 9, 30, tzinfo=dt.UTC), "2026-07-01T09:30:00+00:00"),
        (dt.date(2026, 9, 30), "2026-09-30"),
        (dt.time(23, 59, 1, 500), "23:59:01.000500"),
        (Decimal("108664.00"), "108664.00"),
        (Decimal("1E-30"), "1E-30"),
        (Color.RED, "red"),
        (Level.HIGH, 3),
        (Shape.SQUARE, ["square", 4]),
        (Path("/data/orders.csv"), "/data/orders.csv"),
        (PurePosixPath("a/b"), "a/b"),
        (UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
        (
            Invoice("F-1", [Line("Team", 2, dt.date(2026, 7, 2))], Decimal("198.0")),
            {
                "number": "F-1",
                "lines": [{"product": "Team", "quantity": 2, "shipped": "2026-07-02"}],
                "total": "198.0",
            },
        ),
        (
            Wrapper(customer=Customer(name="Ana", since=dt.date(2025, 1, 2), tags=("vip",)), score=0.5),
            {"customer": {"name": "Ana", "since": "2025-01-02", "tags": ["vip"]}, "score": 0.5},
        ),
    ],
)
def test_conversions(value: object, expected: object) -> None:
    converted = to_json_value(value)
    assert converted == expected
    assert type(converted) is type(expected)


def test_subclasses_become_their_base_type() -> None:
    class Name(str):
        pass

    class Count(int):
        pass

    converted = to_json_value({"name": Name("x"), "count": Count(3), "ok": Count(1) == 1})
    assert converted == {"name": "x", "count": 3, "ok": True}
    assert type(converted["name"]) is str and type(converted["count"]) is int


def test_dict_keys_become_strings_deterministically() -> None:
    value = {
        1: "int",
        dt.date(2026, 7, 1): "date",
        Color.RED: "enum",
        Level.HIGH: "int enum",
        Decimal("1.50"): "dec",
    }
    assert to_json_value(value) == {
        "1": "int",
        "2026-07-01": "date",
        "red": "enum",
        "3": "int enum",
        "1.50": "dec",
    }
    assert list(to_json_value({"b": 1, "a": 2})) == ["b", "a"]  # insertion order kept


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({True: 1}, r"the value is a dict key True \(bool\), which cannot cross the bridge; use str keys"),
        ([{1.5: 1}], r"the value is a dict key 1\.5 \(float\) at \[0\], which cannot cross"),
        ({None: 1}, r"a dict key None \(NoneType\)"),
        ({"x": {(1, 2): 1}}, r"a dict key of type tuple at \['x'\]"),
        (
            {1: "a", "1": "b"},
            r"two dict keys that both become '1', which cannot cross the bridge; make the keys distinct",
        ),
    ],
)
def test_ambiguous_dict_keys_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValueConversionError, match=message):
        to_json_value(value)


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(number: float) -> None:
    with pytest.raises(
        ValueConversionError, match=rf"the float {number} at \[0\]\['score'\].*JSON has no NaN or Infinity"
    ):
        to_json_value([{"score": number}])


def test_nan_inside_a_pydantic_model_is_refused() -> None:
    with pytest.raises(ValueConversionError, match=r"the float nan at \['score'\]"):
        to_json_value(Wrapper(customer=Customer(name="a", since=dt.date(2026, 1, 1)), score=math.nan))


def test_decimal_nan_is_refused() -> None:
    with pytest.raises(ValueConversionError, match=r"a Decimal NaN at \[1\]"):
        to_json_value([Decimal(1), Decimal("NaN")])


def test_the_message_names_the_type_the_place_and_the_fix() -> None:
    value = [{}, {}, {}, {"tags": {"a", "b"}}]
    with pytest.raises(ValueConversionError) as info:
        to_json_value(value, what="tool load_orders returned")
    assert str(info.value) == (
        "tool load_orders returned a set at [3]['tags'], which cannot cross the bridge; "
        "return a list (sorted, for a stable order)"
    )
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1, 2}, "the value is a set, which cannot cross the bridge; return a list"),
        (frozenset(), "a frozenset, which"),
        (b"raw", "a bytes, which cannot cross the bridge; decode it to str, or encode it with base64"),
        (bytearray(b"x"), "a bytearray"),
        (
            dt.timedelta(hours=1),
            "a datetime.timedelta, which cannot cross the bridge; return a number of seconds",
        ),
        (1j, "a complex"),
        (Opaque(), "a test_tool_values.Opaque, which cannot cross the bridge; return dicts, lists, str"),
        ((n for n in range(3)), "a generator"),
        (Line, "a type"),
        ({"when": [dt.date(2026, 1, 1), object()]}, r"an object at \['when'\]\[1\]"),
    ],
)
def test_other_types_are_refused_by_name(value: object, message: str) -> None:
    with pytest.raises(ValueConversionError, match=message):
        to_json_value(value)


def test_dataclass_fields_are_part_of_the_path() -> None:
    invoice = Invoice("F-1", [Line("Team", 2), Line("Starter", 1, shipped=b"no")], Decimal(0))  # type: ignore[arg-type]
    with pytest.raises(ValueConversionError, match=r"a bytes at \['lines'\]\[1\]\['shipped'\]"):
        to_json_value(invoice)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_depth_is_bounded() -> None:
    assert to_json_value(nested(DEFAULT_MAX_DEPTH)) == nested(DEFAULT_MAX_DEPTH)
    assert DEFAULT_MAX_DEPTH == MAX_JSON_DEPTH  # the fleet's one cap
    with pytest.raises(ValueConversionError) as caught:
        to_json_value(nested(DEFAULT_MAX_DEPTH + 1), what="tool deep returned")
    assert str(caught.value) == (
        f"tool deep returned a value that is nested more than {MAX_JSON_DEPTH} deep "
        "(the JSON nesting cap, MAX_JSON_DEPTH); nest less deeply, or break the cycle"
    )
    with pytest.raises(ValueConversionError, match="nested more than 1 deep"):
        to_json_value({"a": [1, 2]}, max_depth=1)


def test_a_reference_cycle_is_refused() -> None:
    cycle: list = [1]
    cycle.append(cycle)
    with pytest.raises(ValueConversionError, match=r"nested more than 64 deep .*break the cycle"):
        to_json_value(cycle)


def test_json_size_counts_compact_utf8_bytes() -> None:
    assert json_size({"a": [1, 2]}) == len('{"a":[1,2]}')
    assert json_size("é") == 4  # two quotes and two bytes
    with pytest.raises(ValueError):
        json_size(math.nan)


def test_a_large_result_converts() -> None:
    rows = [
        {"order_id": f"O-{n:06d}", "date": dt.date(2026, 1, 1), "quantity": n, "unit_price": 29.0}
        for n in range(100_000)
    ]
    converted = to_json_value(rows)
    assert len(converted) == 100_000 and converted[-1]["date"] == "2026-01-01"
