"""``ToolBridge`` keeps few fields of its own (issue 23, "state with a home").

It had 25: caps, hooks, counters, locks and per-call maps side by side. Its caps are one frozen
``BridgeLimits``, what its calls came to one ``BridgeTally`` (read when the run ends), the numbering and
the running calls one ``_InFlight``, and a call's own notes travel with the call. A new piece of state
joins one of those homes (or makes a new one) rather than growing the bridge back: every field counts,
private and ``init=False`` ones too.
"""

from __future__ import annotations

import dataclasses

from sandfleet.worker.program.bridge import ToolBridge
from sandfleet.worker.tools.registry import ToolRegistry

MAX_BRIDGE_FIELDS = 12


def test_the_bridge_keeps_few_fields_of_its_own() -> None:
    names = [f.name for f in dataclasses.fields(ToolBridge)]
    assert len(names) <= MAX_BRIDGE_FIELDS, (
        f"ToolBridge has {len(names)} fields (at most {MAX_BRIDGE_FIELDS}): {names}; give the new state a "
        "home (BridgeLimits, BridgeTally, the call itself) instead"
    )


def test_each_bridge_has_its_own_tally() -> None:
    """A tally shared between two bridges would mix two runs' records and budgets (the limits need no
    such test: they are frozen, and mypy refuses an assignment to them)."""
    first, second = ToolBridge(ToolRegistry()), ToolBridge(ToolRegistry())
    assert first.tally is not second.tally and first.tally.records is not second.tally.records
