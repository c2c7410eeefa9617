"""How the Docker-bound tests are shared out over pytest-xdist's processes (``--dist loadscope``).

xdist's loadscope keeps each module in one process, so its module fixtures (a fleet, say) start once and
its tests never race each other; but it hands modules out in collection order, so the longest ones can
start last and one process runs alone at the end. Measured at stop 30 (4 processes, docker phase):
the benchmark smoke module alone was one scope of 562 s of the run's 998 s. Here:

- the modules in ``SPLIT_BY_TEST`` are split into one scope per test (each of their tests runs a
  subprocess of its own with its own Redis, ports and container owner: nothing is shared);
- the next scope handed out is always the longest one left, by the durations recorded in
  ``scope_durations.json`` (longest processing time first). A scope with no record counts ``UNRECORDED_S_PER_TEST`` per test, so new tests still run.

The record is a hint, not a contract: a stale one only orders worse. Refresh it from a run's JUnit file:
``python tests/sandfleet_testing/scheduling.py JUNIT.xml`` (deploy/test.sh writes one to
``artifacts/junit-docker.xml``).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parents[1]
DURATIONS_FILE = Path(__file__).with_name("scope_durations.json")
SPLIT_BY_TEST = frozenset({"tests/loadtest/test_benchmarks_smoke.py"})
UNRECORDED_S_PER_TEST = 3.0


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: its module (or class), or itself in a module split by test."""
    if nodeid.split("::", 1)[0] in SPLIT_BY_TEST:
        return nodeid
    return nodeid.rsplit("::", 1)[0]


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no record (or a broken one): every scope counts by its number of tests


class LongestFirstScheduling(LoadScopeScheduling):
    """loadscope with the smoke module split by test and the longest scope always handed out next."""

    def __init__(self, config: Any, log: Any = None, durations: dict[str, float] | None = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations() if durations is None else durations

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def expected_s(self, scope: str) -> float:
        return self.durations.get(scope, UNRECORDED_S_PER_TEST * len(self.workqueue[scope]))

    def _assign_work_unit(self, node: Any) -> None:
        longest = max(self.workqueue, key=self.expected_s)
        self.workqueue.move_to_end(longest, last=False)  # the parent pops the first one
        super()._assign_work_unit(node)


def durations_from_junit(junit: Path) -> dict[str, float]:
    """Seconds per scope (setup, call and teardown of its tests) from a pytest JUnit XML file."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        seconds[scope_of(_nodeid(case.get("classname", ""), case.get("name", "")))] += float(
            case.get("time") or 0
        )
    return {scope: round(s, 1) for scope, s in sorted(seconds.items())}


def _nodeid(classname: str, name: str) -> str:
    """tests.fleet.test_x.TestY + test_z -> tests/fleet/test_x.py::TestY::test_z (the module is the
    longest dotted prefix that is a file)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (TESTS.parent / module).is_file():
            return "::".join([module, *parts[cut:], name])
    return f"{classname}::{name}"


if __name__ == "__main__":
    DURATIONS_FILE.write_text(json.dumps(durations_from_junit(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {DURATIONS_FILE}")
