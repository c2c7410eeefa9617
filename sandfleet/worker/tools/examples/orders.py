"""Tools over the reference orders (``orders.csv`` in the data folder, see ``sandfleet.worker.tools.examples.scenario``)."""

from __future__ import annotations

import csv
from typing import Any

from sandfleet.worker.tools.examples._data import data_dir
from sandfleet.worker.tools.examples.scenario import ORDERS_FILENAME

__all__ = ["get_order", "list_products", "load_orders"]


def load_orders() -> list[dict]:
    """All orders: order_id, date (YYYY-MM-DD), region, product, quantity (int), unit_price (float).

    Raises:
        FileNotFoundError: the data folder has no orders.csv.
    """
    path = data_dir() / ORDERS_FILENAME
    try:
        with path.open(newline="", encoding="utf-8") as source:
            return [_typed(row) for row in csv.DictReader(source)]
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no orders file at {path}; write it with sandfleet.worker.tools.examples.scenario.write_reference_data() "
            "or point SANDFLEET_DATA_DIR at a folder that has one"
        ) from None


def list_products() -> list[dict]:
    """The products sold, cheapest first, each as {"product": name, "unit_price": price}."""
    prices = {order["product"]: order["unit_price"] for order in load_orders()}
    ranked = sorted(prices.items(), key=lambda item: (item[1], item[0]))
    return [{"product": product, "unit_price": price} for product, price in ranked]


def get_order(order_id: str) -> dict:
    """One order by its id (like "O-0042"); KeyError if there is no such order."""
    if not isinstance(order_id, str):  # the model-written program controls the argument: check it
        raise TypeError(f"order_id must be a str like 'O-0042', not {type(order_id).__name__}")
    for order in load_orders():
        if order["order_id"] == order_id:
            return order
    raise KeyError(f"no order with id {order_id!r}; ids run from 'O-0001' upwards")


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": row["order_id"],
        "date": row["date"],
        "region": row["region"],
        "product": row["product"],
        "quantity": int(row["quantity"]),
        "unit_price": float(row["unit_price"]),
    }
