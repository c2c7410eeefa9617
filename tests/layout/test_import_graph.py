"""The rooms of the ``sandfleet`` namespace and what each may import (ARCHITECTURE.md).

core imports no other room; the producer and the worker import only the core; only the fleet room
(local fleets, load test, demo) imports both. No circles anywhere, lazy imports included.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from .imports import ROOMS, cycles, import_graph, room_of

# room -> rooms it may import (besides itself). The root package (sandfleet/__init__.py, cli.py) may
# name any room: it only re-exports lazily and maps command names to modules.
ALLOWED = {
    "core": set(),
    "producer": {"core"},
    "worker": {"core"},
    "fleet": {"core", "producer", "worker"},
}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_is_read_from_every_room(graph: dict[str, set[str]]) -> None:
    assert {room_of(m) for m in graph} == {*ROOMS, "root"}
    assert (
        "sandfleet.worker.delivery.task" in graph["sandfleet.worker.delivery.celery_app"]
    )  # edges are really read


def test_the_import_graph_has_no_circles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_imports_only_what_it_may(graph: dict[str, set[str]], room: str) -> None:
    crossings = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if room_of(source) == room
        for target in targets
        if room_of(target) not in ALLOWED[room] | {room}
    )
    assert crossings == []


def test_importing_the_producer_pulls_in_no_worker_code_docker_or_openai() -> None:
    code = (
        "import sys, sandfleet, sandfleet.producer.client, sandfleet.producer.cli.jobs, sandfleet.cli; "
        "import sandfleet.producer.cli.audit, sandfleet.producer.cli.keys; "
        "from sandfleet import Client, JobSpec, JobResult, SandboxConfig, CodeActionSettings; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('docker', 'openai', 'worker', 'producer') "
        "or m.startswith(('sandfleet.worker', 'sandfleet.fleet'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
