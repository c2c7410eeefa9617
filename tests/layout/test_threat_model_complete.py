"""The threat model in SECURITY.md is complete: every JobSpec field, every SandboxConfig option and
every Redis key the fleet names (sandfleet/core/redis_keys.py, and kombu's own keys of the broker)
has a row whose first cell names it (issue 22 point 1). A field or key added later fails here until
someone wrote down who controls it, what they could gain and what stops them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import JobSpec
from sandfleet.core.redis_keys import FleetKeys

SECURITY = Path(__file__).resolve().parents[2] / "SECURITY.md"
PLACEHOLDERS = {
    "job_id": "{id}",
    "batch_id": "{id}",
    "request_id": "{id}",
    "worker": "{name}",
    "sha256": "{sha256}",
}
AGGREGATES = {"job_keys", "status_indexes", "prefix"}  # several keys at once, or not a key
SPECIAL = {"status_index": "{p}:jobs:{status}"}
# kombu's bookkeeping of the broker (not under the prefix): what recovery reads back.
BROKER_KEYS = ("unacked", "unacked_index")


def threat_model() -> str:
    text = SECURITY.read_text()
    start = text.index("## Threat model by boundary")
    return text[start : text.index("\n## ", start + 1)]


def first_cells(section: str | None = None) -> list[str]:
    """The first cell of every table row (of one ``### section`` when named)."""
    text = threat_model()
    if section is not None:
        start = text.index(f"### {section}")
        end = text.find("\n### ", start + 1)
        text = text[start : end if end != -1 else len(text)]
    cells = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells.append(line.split(" | ")[0][2:])
    return cells[1:] if section else cells  # a section's first row is its header


def names(cells: list[str]) -> set[str]:
    """Every backticked word of the cells, and the name before ``=`` in ``name=value``."""
    found = set()
    for cell in cells:
        for quoted in re.findall(r"`([^`]+)`", cell):
            found.add(quoted.split("=")[0].strip())
    return found


def fleet_keys() -> dict[str, str]:
    """Every key FleetKeys names, as SECURITY.md spells it (``{p}:job:{id}:audit``)."""
    keys = FleetKeys("{p}")
    out = dict(SPECIAL)
    for name, member in inspect.getmembers(FleetKeys):
        if name.startswith("_") or name in AGGREGATES or name in out:
            continue
        if isinstance(member, property):
            out[name] = getattr(keys, name)
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters)[1:]
            out[name] = member(keys, *(PLACEHOLDERS[p] for p in params))
    return out


@pytest.mark.parametrize(
    ("model", "section"),
    [(JobSpec, "Job spec fields"), (SandboxConfig, "Sandbox options")],
)
def test_every_field_has_a_row_in_its_section(model: type, section: str) -> None:
    rowed = names(first_cells(section))
    missing = [field for field in model.model_fields if field not in rowed]
    assert missing == [], f"SECURITY.md's {section!r} table has no row naming {missing}"


def test_every_redis_key_has_a_row() -> None:
    keys = fleet_keys()
    assert len(keys) > 30 and keys["checkpoint"] == "{p}:job:{id}:checkpoint"  # the walk found them
    rowed = "\n".join(first_cells())
    missing = sorted(name for name, key in keys.items() if f"`{key}`" not in rowed and f"{key}`" not in rowed)
    missing += [key for key in BROKER_KEYS if f"`{key}`" not in rowed]
    assert missing == [], f"no threat-model row names the Redis key(s) of {missing}"
