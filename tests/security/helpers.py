"""Shared pieces of the security tests: runtimes, the results file, leftover checks.

Every case records ``(case, runtime, blocked, detail)``; the session writes them to
``artifacts/security-results.json`` (merged with what other modules or runs wrote there), which is
where the figures in SECURITY.md come from.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sandfleet_testing import GONE_WITHIN_S
from sandfleet_testing import container_gone as container_gone
from sandfleet_testing import program as program
from sandfleet_testing import skip_or_fail as skip_or_fail

from sandfleet.fleet.local_redis import free_port as free_port  # shared by the tests here

REPO = Path(__file__).resolve().parents[2]
RESULTS_PATH = REPO / "artifacts" / "security-results.json"
RUNTIMES = ("runc", "runsc")
BACKEND_OF = {"runc": "docker", "runsc": "gvisor"}
TEST_LABEL = "sandfleet.test"
TEST_LABELS = {TEST_LABEL: "tests/security"}

_results: list[dict[str, Any]] = []
_lock = threading.Lock()
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex  # one id for every process of a run


def record(case: str, runtime: str, blocked: bool, detail: Any, **extra: Any) -> None:
    """Note one case's outcome for the results file (the test asserts it separately)."""
    with _lock:
        _results.append(
            {
                "case": case,
                "runtime": runtime,
                "blocked": bool(blocked),
                "detail": detail,
                "module": _calling_module(),
                "run": _RUN,
                **extra,
            }
        )


def _calling_module() -> str:
    """The test module (file name) that recorded a row, from the current test's node id."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "")
    return node.split("::", 1)[0].rsplit("/", 1)[-1] or "unknown"


def write_results() -> None:
    """Merge this session's results into the results file: rows of the test modules that ran now
    replace all earlier rows of those modules (so rows of removed cases do not linger). Test processes
    running side by side (pytest-xdist) take turns under a file lock, so none overwrites another's."""
    with _lock:
        if not _results:
            return
        RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
        with open(RESULTS_PATH.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _merge_into_results_file()


def _merge_into_results_file() -> None:
    """Rows of this test run (every process of it: pytest-xdist's run id) are kept together."""
    try:
        old = json.loads(RESULTS_PATH.read_text())
    except (OSError, ValueError):
        old = []
    ran = {r.get("module") for r in _results}
    kept = [r for r in old if r.get("module") and (r.get("module") not in ran or r.get("run") == _RUN)]
    merged = kept + _results
    merged.sort(key=lambda r: (r["case"], r["runtime"]))
    RESULTS_PATH.write_text(json.dumps(merged, indent=2, default=str) + "\n")


def processes_mentioning(text: str) -> list[int]:
    """Pids of host processes whose command line holds ``text`` (a container id: runsc, shim, gofer)."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def no_process_left(container_id: str, within_s: float = GONE_WITHIN_S) -> list[int]:
    """Host processes still serving the container after ``within_s`` (empty when all are gone)."""
    deadline = time.monotonic() + within_s
    while (left := processes_mentioning(container_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def vm_hwm_kib() -> int:
    """This process's peak resident set size (VmHWM) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


class ContainerWatch:
    """``docker events`` for containers created with one owner label (None: every Sandfleet
    container, to be told apart by ``created(owner_pid=...)``), collected on a thread."""

    def __init__(self, owner_label: str | None) -> None:
        label = f"sandfleet.owner={owner_label}" if owner_label is not None else "sandfleet.role"
        cmd = [
            "docker", "events", "--format", "{{json .}}",
            "--filter", "type=container", "--filter", "event=create", "--filter", f"label={label}",
        ]  # fmt: skip
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        time.sleep(0.5)  # docker events only reports what happens after it subscribed

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.append(json.loads(line))

    def created(self, owner_pid: int | None = None) -> list[str]:
        """Ids of the containers created (by the process ``owner_pid`` of this host, if given)."""
        return [e["Actor"]["ID"] for e in self.created_events(owner_pid)]

    def created_events(self, owner_pid: int | None = None) -> list[dict[str, Any]]:
        if owner_pid is None:
            return list(self.events)
        prefix = f"{socket.gethostname()}:{owner_pid}:"
        return [
            e
            for e in list(self.events)
            if e["Actor"]["Attributes"].get("sandfleet.owner", "").startswith(prefix)
        ]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()


def assert_no_leftovers(docker_client: Any, container_id: str | None) -> None:
    assert container_id, "the run reported no container id"
    assert container_gone(docker_client, container_id), f"container {container_id[:12]} still exists"
    left = no_process_left(container_id)
    assert not left, f"host processes still serve container {container_id[:12]}: {left}"
