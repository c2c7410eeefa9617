"""The reference scenario: the generator as ARCHITECTURE.md specifies it, the exact answer, and the program."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
import random
import sys
import types
from pathlib import Path

import pytest

from sandfleet.worker.tools import ToolRegistry
from sandfleet.worker.tools.examples import scenario

DESIGN_ANSWER = {"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}


def design_recipe() -> list[tuple]:
    """ARCHITECTURE.md's recipe, written out literally with the global generator."""
    random.seed(15)
    products = [("Starter", 29.0), ("Team", 99.0), ("Business", 249.0), ("Enterprise", 899.0)]
    regions = ["EMEA", "North America", "APAC", "LATAM"]
    rows = []
    for n in range(1, 501):
        day = dt.date(2026, 1, 1) + dt.timedelta(days=random.randrange(273))
        product, price = random.choice(products)
        region = random.choice(regions)
        quantity = random.randint(1, 12)
        rows.append((f"O-{n:04d}", day.isoformat(), region, product, quantity, price))
    return rows


def test_generator_follows_the_design_recipe() -> None:
    state = random.getstate()
    try:
        expected = design_recipe()
    finally:
        random.setstate(state)
    assert [tuple(row.values()) for row in scenario.generate_orders()] == expected


def test_generator_shape() -> None:
    rows = scenario.generate_orders()
    assert len(rows) == 500 and rows[0]["order_id"] == "O-0001" and rows[-1]["order_id"] == "O-0500"
    assert all(tuple(row) == scenario.COLUMNS for row in rows)
    assert (
        min(row["date"] for row in rows) >= "2026-01-01" and max(row["date"] for row in rows) <= "2026-09-30"
    )
    assert scenario.generate_orders(seed=16) != rows


def test_expected_answer_is_exact_and_highest_first() -> None:
    answer = scenario.expected_q3_revenue(scenario.generate_orders())
    assert answer == DESIGN_ANSWER == scenario.REFERENCE_ANSWER
    assert list(answer) == ["North America", "LATAM", "EMEA", "APAC"]


def test_csv_round_trip_gives_the_same_answer(tmp_path: Path) -> None:
    path = scenario.write_orders_csv(tmp_path / "deep" / "orders.csv")
    assert path.read_text().splitlines()[:2] == [
        "order_id,date,region,product,quantity,unit_price",
        "O-0001,2026-04-17,EMEA,Starter,3,29.00",
    ]
    with path.open(newline="") as source:
        assert scenario.expected_q3_revenue(csv.DictReader(source)) == DESIGN_ANSWER


def test_reference_program_prints_the_answer(orders_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs REFERENCE_PROGRAM in this process against the registry (the sandboxed run is the runtime's test)."""
    registry = ToolRegistry.from_modules(["sandfleet.worker.tools.examples.orders"]).subset(["load_orders"])
    stub = types.ModuleType("sandfleet_tools")
    stub.load_orders = lambda *args, **kwargs: registry.call("load_orders", list(args), kwargs)  # type: ignore[attr-defined]
    stub.__all__ = ["load_orders"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sandfleet_tools", stub)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(scenario.REFERENCE_PROGRAM, "program.py", "exec"), {"__name__": "__main__"})
    result_lines = [line for line in out.getvalue().splitlines() if line.startswith("RESULT:")]
    payload = json.loads(result_lines[-1].removeprefix("RESULT:"))
    assert payload == DESIGN_ANSWER
    assert list(payload) == list(DESIGN_ANSWER)


def test_reference_question_names_the_quarter() -> None:
    assert "Q3 2026" in scenario.REFERENCE_QUESTION and "region" in scenario.REFERENCE_QUESTION
