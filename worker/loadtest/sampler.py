"""A background sampler while a load test runs: live sandbox containers and worker memory.

Containers are counted with the ``docker ps`` CLI (no SDK here: only worker/sandbox talks to the
engine through it): those labelled ``sandfleet.role`` and, when the fleet's owner labels are known,
owned by one of them (the engine may be shared with other fleets or test runs). Memory is the RSS of
each worker process and its children (psutil), when the worker pids are known; for a fleet started
elsewhere it is unknown.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil

from worker.sandbox.engine import LABEL_OWNER, LABEL_ROLE

DEFAULT_INTERVAL_S = 0.5
DOCKER_PS_TIMEOUT_S = 10.0


def count_sandboxes(owners: set[str] | None) -> int | None:
    """Running sandbox containers (of ``owners`` if given); None if the docker CLI fails."""
    fmt = '{{.Label "' + LABEL_OWNER + '"}}'
    try:
        proc = subprocess.run(
            ["docker", "ps", "--filter", f"label={LABEL_ROLE}", "--format", fmt],
            capture_output=True,
            text=True,
            timeout=DOCKER_PS_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    labels = proc.stdout.split()
    return len(labels) if owners is None else sum(1 for label in labels if label in owners)


def tree_rss_bytes(pid: int) -> int | None:
    """RSS of a process and its children, in bytes; None when it is gone."""
    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


@dataclass
class Samples:
    """What the sampler saw; ``None`` figures were not measurable."""

    containers: list[tuple[float, int]] = field(default_factory=list)  # (epoch s, live)
    rss: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # pid -> (epoch s, bytes)

    def peak_containers(self) -> int | None:
        return max((n for _, n in self.containers), default=None)

    def peak_rss_by_pid(self) -> dict[int, int]:
        return {pid: max(b for _, b in series) for pid, series in self.rss.items() if series}

    def peak_total_rss(self) -> int | None:
        """The highest sum over workers of RSS sampled at the same moment."""
        if not self.rss:
            return None
        moments: dict[float, int] = {}
        for series in self.rss.values():
            for ts, value in series:
                moments[ts] = moments.get(ts, 0) + value
        return max(moments.values(), default=None)


class FleetSampler:
    """Samples every ``interval_s`` in a daemon thread between ``start`` and ``stop``."""

    def __init__(
        self,
        *,
        owners: set[str] | None,
        worker_pids: list[int] | None,
        interval_s: float = DEFAULT_INTERVAL_S,
        count_containers: bool = True,
    ) -> None:
        self.owners = owners
        self.worker_pids = worker_pids
        self.interval_s = interval_s
        self.count_containers = count_containers
        self.samples = Samples()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadtest-sampler", daemon=True)

    def start(self) -> FleetSampler:
        self._thread.start()
        return self

    def stop(self) -> Samples:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=DOCKER_PS_TIMEOUT_S + 5)
        return self.samples

    def sample_once(self) -> None:
        now = time.time()
        if self.count_containers:
            live = count_sandboxes(self.owners)
            if live is not None:
                self.samples.containers.append((now, live))
        for pid in self.worker_pids or ():
            rss = tree_rss_bytes(pid)
            if rss is not None:
                self.samples.rss.setdefault(pid, []).append((now, rss))

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
