"""The reference scenario (ARCHITECTURE.md): 500 software orders for Jan-Sep 2026 and one question about them.

Tests, benchmarks and ``sandfleet demo`` share it: the generator is deterministic, the expected answer is
computed here in plain Python, and ``REFERENCE_PROGRAM`` is a correct program to run under the runtime.
"""

from __future__ import annotations

import csv
import datetime as dt
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REFERENCE_SEED = 15
ORDER_COUNT = 500
FIRST_DAY = dt.date(2026, 1, 1)
DAY_SPAN = 273  # 2026-01-01 .. 2026-09-30
PRODUCT_PRICES = {"Starter": 29.0, "Team": 99.0, "Business": 249.0, "Enterprise": 899.0}
REGIONS = ("EMEA", "North America", "APAC", "LATAM")
COLUMNS = ("order_id", "date", "region", "product", "quantity", "unit_price")
ORDERS_FILENAME = "orders.csv"
Q3_FIRST_DAY = dt.date(2026, 7, 1)
Q3_LAST_DAY = dt.date(2026, 9, 30)

REFERENCE_QUESTION = (
    "What was our revenue per region in Q3 2026 (July to September; revenue is quantity times unit price)? "
    "List the regions highest first."
)
# What expected_q3_revenue(generate_orders()) returns; a test keeps the two in step.
REFERENCE_ANSWER = {"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}

REFERENCE_PROGRAM = """\
import json
from collections import defaultdict

from sandfleet_tools import *

totals = defaultdict(float)
for order in load_orders():
    if "2026-07-01" <= order["date"] <= "2026-09-30":
        totals[order["region"]] += order["quantity"] * order["unit_price"]

ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)
print("RESULT: " + json.dumps({region: round(total, 2) for region, total in ranked}))
"""


def generate_orders(seed: int = REFERENCE_SEED) -> list[dict[str, Any]]:
    """The orders, as ARCHITECTURE.md specifies them: same seed, same rows, on every Python 3.

    The random calls per order are, in this order: ``randrange(273)`` for the day, ``choice`` of product,
    ``choice`` of region, ``randint(1, 12)`` for the quantity. A private ``random.Random(seed)`` gives the
    same sequence as ``random.seed(seed)`` without touching the global generator.

    Returns:
        Rows with keys ``COLUMNS``: order_id ``O-0001``.., date ``YYYY-MM-DD`` (str), region, product,
        quantity (int), unit_price (float).
    """
    rng = random.Random(seed)
    products = list(PRODUCT_PRICES)
    rows = []
    for n in range(1, ORDER_COUNT + 1):
        day = FIRST_DAY + dt.timedelta(days=rng.randrange(DAY_SPAN))
        product = rng.choice(products)
        region = rng.choice(REGIONS)
        quantity = rng.randint(1, 12)
        rows.append(
            {
                "order_id": f"O-{n:04d}",
                "date": day.isoformat(),
                "region": region,
                "product": product,
                "quantity": quantity,
                "unit_price": PRODUCT_PRICES[product],
            }
        )
    return rows


def write_orders_csv(path: str | Path, rows: Iterable[Mapping[str, Any]] | None = None) -> Path:
    """Write the orders (the reference ones by default) as CSV with a header row; creates parent folders.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        for row in generate_orders() if rows is None else rows:
            writer.writerow({**row, "unit_price": f"{float(row['unit_price']):.2f}"})
    return path


def write_reference_data(folder: str | Path) -> Path:
    """Write the reference orders as ``folder/orders.csv``, where the example tools look. Returns the file."""
    return write_orders_csv(Path(folder) / ORDERS_FILENAME)


def expected_q3_revenue(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Revenue (quantity times unit price) per region, July-September 2026, highest first, rounded to 0.01.

    Accepts rows as generated or as read back from the CSV (dates as ``date`` or ISO strings).
    """
    totals: dict[str, float] = {}
    for row in rows:
        day = row["date"] if isinstance(row["date"], dt.date) else dt.date.fromisoformat(row["date"])
        if Q3_FIRST_DAY <= day <= Q3_LAST_DAY:
            revenue = int(row["quantity"]) * float(row["unit_price"])
            totals[row["region"]] = totals.get(row["region"], 0.0) + revenue
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return {region: round(total, 2) for region, total in ranked}
