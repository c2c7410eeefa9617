"""Shared test harness: real Redis servers, the Docker engine, gVisor, and a leftover-container check.

Integration tests run against the real thing. A test that needs something this host lacks is skipped
locally, but in CI (the ``CI`` environment variable is set) a missing engine, runtime or redis-server is
a failure: CI must run every test.

Fixtures:
    redis_server     session: a throwaway ``redis-server`` (no persistence), its URL
    redis_factory    function: start more servers with options (AOF, ...); stopped after the test
    docker_engine    session: ``EngineInfo`` of the engine, or skip ("no Docker engine reachable")
    gvisor           function: the same, when ``runsc`` is registered, or skip ("runsc is not registered")
    owned_targets    session: addresses this run owns, counted and listened on (owned_targets.py): the
                     only targets of hostile network tests, so a failed refusal arrives here, never out
    skip_or_fail     function: skip (locally) or fail (in CI) with a reason
    fleet_worker     function: ``start(name, **options) -> FleetWorker``, real ``sandfleet worker``s on
                     ``redis_server`` (sandfleet_testing.workers.WorkerFactory: model, tools, folder,
                     env, approvers, metrics); after the test each is stopped, its containers removed,
                     its keys deleted and its folder (under tmp_path) removed
    module_fleet_worker  module: the same, for the module fixtures that share workers between tests

At the end of the session, any container labelled ``sandfleet.role`` that still exists fails the run
(listed at the end, exit status 1; under pytest-xdist checked once, after every worker has finished). On an engine shared with other people's
test runs their containers count too; CI's engine is private.

Markers (docker, gvisor, redis, slow) are declared in pyproject.toml. ``docker``, ``gvisor`` and
``redis`` are derived from the fixtures a test uses (directly or through other fixtures), so
``pytest -m "not docker"`` runs exactly the tests that need no engine: a test that needs one must
say so by using ``docker_engine`` (or a fixture built on it).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sandfleet_testing import skip_or_fail
from sandfleet_testing.workers import WorkerFactory

from sandfleet.fleet.local_redis import NO_PERSISTENCE, RedisServer, free_port  # noqa: F401 - shared with tests

IN_CI = bool(os.environ.get("CI"))
LEFTOVER_GRACE_S = 5.0  # containers being removed by a background thread get this long to go
LABEL_ROLE = (
    "sandfleet.role"  # as in sandfleet.worker.sandbox.docker.backend; repeated so this file imports no SDK
)


# fixture -> the markers a test using it gets
FIXTURE_MARKERS = {
    "docker_engine": ("docker",),
    "gvisor": ("docker", "gvisor"),
    "redis_server": ("redis",),
    "redis_factory": ("redis",),
    "redis_binary": ("redis",),
}


# A ``backend`` or ``runtime`` parameter naming gVisor: such a test (or its fixture) takes the gvisor
# fixture only for that parameter, with request.getfixturevalue, which collection cannot see.
GVISOR_PARAMETERS = {("backend", "gvisor"), ("runtime", "runsc")}


def derived_markers(item: pytest.Item) -> set[str]:
    """The markers a test's fixtures (the closure: fixtures of fixtures count) and parameters imply."""
    used = set(getattr(item, "fixturenames", ()))
    found = {m for f in used & FIXTURE_MARKERS.keys() for m in FIXTURE_MARKERS[f]}
    callspec = getattr(item, "callspec", None)
    params = getattr(callspec, "params", {})
    if any(isinstance(v, str) and (k, v) in GVISOR_PARAMETERS for k, v in params.items()):
        found.update(FIXTURE_MARKERS["gvisor"])
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what its fixtures and parameters imply (derived_markers)."""
    for item in items:
        for name in sorted(derived_markers(item)):
            item.add_marker(name)


@pytest.fixture(name="skip_or_fail")
def skip_or_fail_fixture() -> Callable[[str], None]:
    """``skip_or_fail(reason)`` for tests that find a prerequisite missing themselves."""
    return skip_or_fail


# ---- Redis ------------------------------------------------------------------------------------------


def _require_redis_server() -> None:
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is not installed")


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The redis-server program, for a test that starts its own (with a password, TLS, Sentinels, a
    whole fleet): skipped locally, failed in CI, without it; taking it marks the test ``redis``."""
    _require_redis_server()
    return str(shutil.which("redis-server"))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a session-wide throwaway Redis (no RDB, no AOF). Tests use their own key prefixes."""
    _require_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"), NO_PERSISTENCE).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start extra Redis servers: ``redis_factory("--appendonly", "yes", "--appendfsync", "always")``.

    Arguments are added to ``--bind/--port/--dir``; with none, persistence is off. Each server gets its
    own folder under the test's tmp_path; all are stopped when the test ends.
    """
    _require_redis_server()
    servers: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}", args or NO_PERSISTENCE)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


# ---- Docker and gVisor ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_engine():  # -> sandfleet.worker.sandbox.docker.backend.EngineInfo
    """What the engine offers (version, runtimes, images). Skips locally when none answers."""
    from sandfleet.core.errors import SandfleetError

    # A failed first connection can leave the SDK's socket unclosed; it is freed with the exception.
    # Its ResourceWarning is not the test's business (warnings are errors), so it is muted here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            from sandfleet.worker.sandbox.docker.backend import engine_info

            return engine_info()
        except (SandfleetError, ImportError) as e:
            reason = f"no Docker engine reachable: {e}"
        gc.collect()
    skip_or_fail(reason)


@pytest.fixture
def gvisor(docker_engine):  # -> EngineInfo
    """The engine, when gVisor's ``runsc`` runtime is registered."""
    if "runsc" not in docker_engine.runtimes:
        skip_or_fail("runsc is not registered")
    return docker_engine


# ---- workers ------------------------------------------------------------------------------------------


@pytest.fixture
def fleet_worker(redis_server: str, docker_engine: object, tmp_path: Path) -> Iterator[WorkerFactory]:
    """Start workers for one test: ``fleet_worker("name", tools=..., script=..., env=...)``."""

    def new_folder(name: str) -> Path:
        folder = tmp_path / f"{name}-{len(start.folders)}"
        folder.mkdir()
        return folder

    start = WorkerFactory(redis_server, new_folder)
    try:
        yield start
    finally:
        start.close()


@pytest.fixture(scope="module")
def module_fleet_worker(
    redis_server: str, docker_engine: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerFactory]:
    """Start workers shared by a module's tests (stopped and cleaned after its last test)."""
    start = WorkerFactory(redis_server, tmp_path_factory.mktemp)
    try:
        yield start
    finally:
        start.close()


@pytest.fixture(scope="session")
def owned_targets():  # -> owned_targets.OwnedTargets
    """Stand-ins for the Internet, a metadata service and a private network, on this machine only."""
    from owned_targets import OwnedTargets

    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None:
        skip_or_fail("the owned test targets need root, iproute2 and iptables (an interface, INPUT counters)")
    targets = OwnedTargets.start()
    try:
        yield targets
    finally:
        targets.stop()


def _sandfleet_containers() -> list[str] | None:
    """``name (image, status, role)`` of every container labelled sandfleet.role; None without an engine.

    Asks the docker CLI, so the check works whatever state the tests left the SDK's clients in.
    """
    fmt = '{{.Names}} ({{.Image}}, {{.Status}}, role={{.Label "' + LABEL_ROLE + '"}})'
    try:
        proc = subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label={LABEL_ROLE}", "--format", fmt],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.splitlines() if proc.returncode == 0 else None


@pytest.fixture(scope="session", autouse=True)
def client_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The clients' state folder (submission ledger, submitter token) of this session, never the user's
    ~/.sandfleet/client; commands the tests start inherit it. Tests that play a second submitter give
    their client a folder of its own."""
    folder = tmp_path_factory.mktemp("client-state")
    previous = os.environ.get("SANDFLEET_CLIENT_STATE_DIR")
    os.environ["SANDFLEET_CLIENT_STATE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("SANDFLEET_CLIENT_STATE_DIR", None)
    else:
        os.environ["SANDFLEET_CLIENT_STATE_DIR"] = previous


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when Sandfleet containers outlive the tests that made them.

    Checked once, by the process that ran the whole session: under pytest-xdist that is the controller,
    after every worker has finished (a worker that ends early would see the others' live containers).
    """
    if hasattr(session.config, "workerinput"):
        return
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := _sandfleet_containers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            f"{len(left)} Sandfleet container(s) left after the tests (label {LABEL_ROLE}):\n  "
            + "\n  ".join(left)
            + "\nremove them with: sandfleet sandbox prune"
        )
        if reporter is not None:
            reporter.write_line(message, red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
