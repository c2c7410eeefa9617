"""Tools of the approval tests. Every real execution appends one line to ``ledger.jsonl`` in the data
folder, so a test counts what really ran (and proves what never did)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from sandfleet.worker.tools.tool import side_effects

__all__ = ["connect_crm", "issue_refund", "lookup_order"]
LEDGER = "ledger.jsonl"
_lock = threading.Lock()


def _note(tool: str, **arguments: object) -> None:
    folder = Path(os.environ.get("SANDFLEET_DATA_DIR", "."))
    with _lock, (folder / LEDGER).open("a", encoding="utf-8") as ledger:
        ledger.write(json.dumps({"tool": tool, **arguments}) + "\n")


def lookup_order(order_id: str) -> dict:
    """Read an order (not gated: it runs at once)."""
    _note("lookup_order", order_id=order_id)
    return {"order_id": order_id, "paid": 25.0}


@side_effects
def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order: money leaves the company, so a person approves it."""
    _note("issue_refund", order_id=order_id, amount=amount)
    return f"refund-{order_id}-{amount:g}"


def connect_crm(user: str, password: str) -> str:
    """Log in to the CRM; returns a digest of the credentials it was given."""
    _note("connect_crm", user=user)
    return hashlib.sha256(f"{user}:{password}".encode()).hexdigest()[:12]
