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


# The worker's rooms by stage (ARCHITECTURE.md): a message is delivered (delivery/), its job runs in a
# mode (engine/), a mode runs programs (program/) in sandboxes (sandbox/). A stage never reaches back
# up to the one that drives it, and the code that runs inside the container, like the scripted model,
# stands alone. room -> worker rooms it must never import.
WORKER_STAGES_NEVER = {
    "delivery": {"cli"},
    "engine": {"delivery", "cli"},
    "program": {"delivery", "engine", "cli"},
    # the host end of the channel (sandbox/calls.py) serves whatever handler the program room gives it
    "sandbox": {"delivery", "engine", "program", "cli", "approval", "llm", "rerun"},
    "sandbox.docker": {"delivery", "engine", "program", "cli", "approval", "llm", "rerun"},
    "llm": {"delivery", "engine", "program", "sandbox", "cli"},
    "rerun": {"delivery", "engine", "cli"},
}
STANDALONE = ("sandfleet.worker.sandbox.inside", "sandfleet.worker.llm.scripted")

# The services the stages call sit below every stage and beside each other: room -> the only worker
# rooms it may import (besides its own). A new edge here is a design change: say why beside it.
SERVICES_MAY = {
    "tools": set(),
    "mcp": {"tools"},  # an MCP server's tools are registry tools
    "approval": {"webhooks"},  # an approval request is announced by webhook
    "cancel": {"llm"},  # a cancel cuts the job's model call in flight
    "egress": set(),
    "metrics": set(),
    "webhooks": set(),
    "images": set(),
}


def worker_room(module: str) -> str | None:
    """``engine``, ``sandbox.docker``, ... for a module of sandfleet.worker; None for any other."""
    parts = module.split(".")
    if parts[:2] != ["sandfleet", "worker"] or len(parts) < 3:
        return None
    if len(parts) > 3 and (parts[2], parts[3]) in {
        ("sandbox", "docker"),
        ("sandbox", "inside"),
        ("llm", "scripted"),
    }:
        return f"{parts[2]}.{parts[3]}"
    return parts[2]


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


@pytest.mark.parametrize("room", sorted(WORKER_STAGES_NEVER))
def test_no_worker_stage_reaches_back_up(graph: dict[str, set[str]], room: str) -> None:
    crossings = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if worker_room(source) == room
        for target in targets
        if worker_room(target) in WORKER_STAGES_NEVER[room]
    )
    assert crossings == []


@pytest.mark.parametrize("room", sorted(SERVICES_MAY))
def test_each_service_room_imports_only_the_services_it_may(graph: dict[str, set[str]], room: str) -> None:
    crossings = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if (worker_room(source) or "").split(".")[0] == room
        for target in targets
        if (worker_room(target) or room).split(".")[0] not in SERVICES_MAY[room] | {room}
    )
    assert crossings == []


def test_every_worker_room_has_a_rule(graph: dict[str, set[str]]) -> None:
    """A new room gets a place among the stages or the services (cli, the commands, may use any)."""
    ruled = {*WORKER_STAGES_NEVER, *SERVICES_MAY, "cli"} | {
        p.removeprefix("sandfleet.worker.") for p in STANDALONE
    }
    rooms = {worker_room(m) for m in graph} - {None}
    assert sorted(rooms - ruled) == []


@pytest.mark.parametrize("package", STANDALONE)
def test_the_in_container_code_and_the_scripted_model_stand_alone(
    graph: dict[str, set[str]], package: str
) -> None:
    """Nothing of the worker outside their own package (the agent runs in the sandbox with no imports of
    ours; the scripted model is a server the tests and the demo start on their own)."""
    crossings = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source.startswith(package)
        for target in targets
        if target.startswith("sandfleet.worker") and not target.startswith(package)
    )
    assert crossings == []


def test_the_stage_rule_sees_a_reach_back() -> None:
    assert worker_room("sandfleet.worker.sandbox.docker.spec") == "sandbox.docker"
    assert worker_room("sandfleet.worker.delivery.task") in WORKER_STAGES_NEVER["engine"]


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
