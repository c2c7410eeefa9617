"""A background sampler while a load test runs: live sandbox containers and worker memory.

Containers are counted from the engine's own event stream (``docker events``, one long-lived CLI
process; no SDK here: only worker/sandbox talks to the engine through it), seeded by one ``docker
ps``: every start and death of a container labelled ``sandfleet.role`` and, when the fleet's owner
labels are known, owned by one of them (the engine may be shared with other fleets or test runs).
That sees every change, not a sample of them, and costs the engine next to nothing; polling ``docker
ps`` twice a second took ~1.5% of a 2-core host from the fleet it measured. Memory is the RSS of
each worker process and its children (psutil), sampled, when the worker pids are known; for a fleet
started elsewhere it is unknown.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil

from sandfleet.worker.sandbox.docker.backend import LABEL_OWNER, LABEL_ROLE

DEFAULT_INTERVAL_S = 0.5
DOCKER_PS_TIMEOUT_S = 10.0
OWNER_FORMAT = '{{.Label "' + LABEL_OWNER + '"}}'


def list_sandboxes() -> dict[str, str] | None:
    """Running sandbox containers: id -> owner label; None if the docker CLI fails."""
    try:
        proc = subprocess.run(
            [
                "docker",
                "ps",
                "--no-trunc",
                "--filter",
                f"label={LABEL_ROLE}",
                "--format",
                "{{.ID}} " + OWNER_FORMAT,
            ],
            capture_output=True,
            text=True,
            timeout=DOCKER_PS_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    running = {}
    for line in proc.stdout.splitlines():
        cid, _, owner = line.partition(" ")
        if cid:
            running[cid] = owner
    return running


class LiveContainers:
    """Running sandboxes of ``owners`` (all if None), kept current from ``docker events``."""

    def __init__(self, owners: set[str] | None) -> None:
        self.owners = owners
        self.series: list[tuple[float, int]] = []  # (epoch s, live) at each change
        self._live: set[str] = set()
        self._dead: set[str] = set()  # died before the seeding snapshot was read
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Follow the events, then seed from ``docker ps``; False when the docker CLI is missing."""
        since = f"{time.time() - 1:.3f}"  # events from just before the snapshot: none falls between
        try:
            self._proc = subprocess.Popen(
                [
                    "docker",
                    "events",
                    "--since",
                    since,
                    "--filter",
                    "type=container",
                    "--filter",
                    f"label={LABEL_ROLE}",
                    "--filter",
                    "event=start",
                    "--filter",
                    "event=die",
                    "--format",
                    '{{.Action}} {{.Actor.ID}} {{index .Actor.Attributes "' + LABEL_OWNER + '"}}',
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            return False
        self._thread = threading.Thread(target=self._follow, name="loadtest-events", daemon=True)
        self._thread.start()
        running = list_sandboxes() or {}
        with self._lock:
            self._live |= {cid for cid, owner in running.items() if self._ours(owner)} - self._dead
            self._record()
        return True

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def _ours(self, owner: str) -> bool:
        return self.owners is None or owner in self.owners

    def _follow(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            action, _, rest = line.rstrip("\n").partition(" ")
            cid, _, owner = rest.partition(" ")
            if not cid or not self._ours(owner):
                continue
            with self._lock:
                if action == "start":
                    self._live.add(cid)
                elif action == "die":
                    self._live.discard(cid)
                    self._dead.add(cid)
                self._record()

    def _record(self) -> None:  # holds _lock
        self.series.append((time.time(), len(self._live)))


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
    """Between ``start`` and ``stop``: live containers from the event stream, and worker RSS every
    ``interval_s`` in a daemon thread."""

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
        self._containers = LiveContainers(owners) if count_containers else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadtest-sampler", daemon=True)

    def start(self) -> FleetSampler:
        if self._containers is not None and not self._containers.start():
            self._containers = None  # no docker CLI: the peak stays unknown
        self._thread.start()
        return self

    def stop(self) -> Samples:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=DOCKER_PS_TIMEOUT_S + 5)
        if self._containers is not None:
            self._containers.stop()
            self.samples.containers = list(self._containers.series)
        return self.samples

    def sample_once(self) -> None:
        now = time.time()
        for pid in self.worker_pids or ():
            rss = tree_rss_bytes(pid)
            if rss is not None:
                self.samples.rss.setdefault(pid, []).append((now, rss))

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
