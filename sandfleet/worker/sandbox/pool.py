"""A warm pool of single-use sandboxes, under a cap on live containers.

Starting a container costs ~120 ms (runc) to ~300 ms (runsc); a job should not wait for it. For
each SandboxConfig in use the pool keeps containers started, their agents waiting; a run takes one,
uses it for exactly one program, and gives it back to be destroyed. Nothing is ever reused. When no
warm container is there, the run starts one itself (a cold start).

How many are kept follows demand: at least ``pool_size``, and up to the most containers of that
config wanted at once over the last 30 s (demand.py), counting the runs holding or waiting for one
and the jobs in flight that said they will want one (``expecting``: a job thinking with its model
now runs a program in a moment). So a burst finds them warm, and an idle pool shrinks back to
``pool_size``. Warm containers beyond ``pool_size`` are started only while the host has memory to
spare (WARM_MEMORY_RESERVE_BYTES); with ``follow_demand=False`` exactly ``pool_size`` are kept.

``max_live`` bounds every container this pool owns: warm, busy and being removed. A run that finds
no free slot waits for one, first come first served; idle containers of other configs are evicted
to make room.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError, SandboxUnavailableError
from sandfleet.worker.sandbox.backends import SandboxBackend, backend_named
from sandfleet.worker.sandbox.container import HELLO_TIMEOUT_S, SandboxContainer
from sandfleet.worker.sandbox.demand import DEMAND_WINDOW_S, DemandWindow
from sandfleet.worker.sandbox.docker.spec import Owner

log = logging.getLogger("sandfleet.pool")

MAX_WARM_CONFIGS = 8
FILL_BACKOFF_MAX_S = 30.0
REMOVERS = 4
# How long close() waits for a filler's start in progress: a start may wait for the agent's hello
# that long. A start still running after it removes its own container when it ends (_discard).
CLOSE_WAIT_S = HELLO_TIMEOUT_S + 10
FILLERS = 2  # containers started in parallel while warming (a start is mostly waiting on dockerd)
# Warm containers beyond pool_size only while the host has this much memory available: an idle
# sandbox holds ~10-40 MB (agent, shim; gVisor's sandbox and gofer), a leased one up to its limit.
WARM_MEMORY_RESERVE_BYTES = 1024**3


@dataclass(frozen=True)
class Lease:
    """A container handed to one run, and how it was obtained."""

    container: SandboxContainer
    warm: bool
    acquire_s: float


class SandboxPool:
    """Warm single-use containers per config; ``acquire`` one, ``release`` it when the run is over."""

    def __init__(
        self,
        *,
        pool_size: int = 2,
        max_live: int = 4,
        labels: dict[str, str] | None = None,
        client: Any | None = None,
        backend: SandboxBackend | None = None,
        follow_demand: bool = True,
        demand_window_s: float = DEMAND_WINDOW_S,
    ) -> None:
        if max_live < 1:
            raise ValueError("max_live must be at least 1")
        self.pool_size = pool_size
        self.max_live = max_live
        self.follow_demand = follow_demand
        self._demand_window_s = demand_window_s
        self._labels = labels or {}
        self.backend = backend or backend_named(client=client)
        self._owner = Owner.current()
        self._cond = threading.Condition()
        self._idle: dict[str, deque[SandboxContainer]] = {}
        self._configs: OrderedDict[str, SandboxConfig] = OrderedDict()
        self._starting: dict[str, int] = {}
        self._busy: dict[str, int] = {}  # leased, not yet released
        self._waiting_for: dict[str, int] = {}  # acquire calls not yet served
        self._expected: dict[str, int] = {}  # jobs in flight that will want one (``expecting``)
        self._demand: dict[str, DemandWindow] = {}
        self._live = 0
        self._waiting: deque[object] = deque()  # tickets of acquire calls, in arrival order
        self._closed = False
        self._fill_failures = 0
        self._fill_paused_until = 0.0
        self.peak_live = 0
        self.started_total = 0
        self.leases = {"warm": 0, "cold": 0}
        self.started_by_runtime: dict[str, int] = {}  # containers started, by Docker runtime
        self.failed_by_runtime: dict[str, int] = {}  # containers that failed to start, by runtime
        self._remover = ThreadPoolExecutor(REMOVERS, thread_name_prefix="sandfleet-remove")
        self._fillers = [
            threading.Thread(target=self._fill_forever, name=f"sandfleet-pool-fill-{i}", daemon=True)
            for i in range(FILLERS)
        ]
        self._filler_started = False

    # -- public ---------------------------------------------------------------------------------

    @property
    def live(self) -> int:
        with self._cond:
            return self._live

    def warm(self, config: SandboxConfig) -> None:
        """Start keeping ``pool_size`` containers of this config ready."""
        with self._cond:
            self._want(config)
            self._cond.notify_all()
        self._ensure_filler()

    @contextmanager
    def expecting(self, config: SandboxConfig) -> Iterator[None]:
        """While inside, one job in flight counts as demand for ``config``: it will want a sandbox
        soon (after its model call), so the pool warms one for it ahead."""
        key = config.fingerprint()
        with self._cond:
            self._want(config)
            self._expected[key] = self._expected.get(key, 0) + 1
            self._note_demand(key)
            self._cond.notify_all()
        self._ensure_filler()
        try:
            yield
        finally:
            with self._cond:
                self._expected[key] -= 1
                self._note_demand(key)

    def acquire(self, config: SandboxConfig, timeout: float | None = None) -> Lease:
        """A fresh container of ``config``: warm if one is ready, else started now.

        Raises:
            SandboxError: closed pool, no slot within ``timeout``, or the container cannot be made.
            SandboxUnavailableError: no engine.
        """
        began = time.monotonic()
        key = config.fingerprint()
        deadline = None if timeout is None else began + timeout
        ticket = object()
        with self._cond:
            self._want(config)
            self._waiting.append(ticket)
            self._waiting_for[key] += 1
            self._note_demand(key)
            try:
                while True:
                    if self._closed:
                        raise SandboxError("the sandbox pool is closed")
                    if self._waiting[0] is not ticket:  # first come, first served
                        if not self._wait_until(deadline, timeout):
                            raise SandboxError(f"no sandbox slot became free within {timeout:g} s")
                        continue
                    container = self._pop_idle(key)
                    if container is not None:
                        self._leased(key, warm=True)
                        self._cond.notify_all()  # the filler may top up
                        return Lease(container, True, time.monotonic() - began)
                    if self._live < self.max_live:
                        self._reserve(key)
                        self._leased(key, warm=False)
                        break
                    if not self._evict_other(key) and not self._wait_until(deadline, timeout):
                        raise SandboxError(f"no sandbox slot became free within {timeout:g} s")
            finally:
                self._waiting.remove(ticket)
                self._waiting_for[key] -= 1
                self._note_demand(key)
                self._cond.notify_all()  # the next in line may go
        self._ensure_filler()
        try:
            container = self._start(config)
        except BaseException:
            with self._cond:
                self._busy[key] -= 1
                self._note_demand(key)
            raise
        finally:
            with self._cond:
                self._starting[key] -= 1
        return Lease(container, False, time.monotonic() - began)

    def _wait_until(self, deadline: float | None, timeout: float | None) -> bool:  # holds _cond
        """Wait for a change; False once the deadline has passed."""
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        self._cond.wait(left)
        return True

    def release(self, container: SandboxContainer) -> None:
        """Destroy a used container in the background; its slot frees once it is gone."""
        key = container.config.fingerprint()
        with self._cond:
            if self._busy.get(key, 0) > 0:
                self._busy[key] -= 1
                self._note_demand(key)  # the filler looks again when the removal frees the slot
        self._discard(container)

    def close(self) -> None:
        """Stop warming, destroy idle containers and wait for every removal. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = [c for q in self._idle.values() for c in q]
            self._idle.clear()
            self._cond.notify_all()
        for container in idle:
            self._discard(container)
        if self._filler_started:
            for filler in self._fillers:
                filler.join(timeout=CLOSE_WAIT_S)
        self._remover.shutdown(wait=True)

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                "started_by_runtime": dict(self.started_by_runtime),
                "failed_by_runtime": dict(self.failed_by_runtime),
                "live": self._live,
                "idle": sum(len(q) for q in self._idle.values()),
                "peak_live": self.peak_live,
                "started_total": self.started_total,
                "waiters": len(self._waiting),
                "warm_leases": self.leases["warm"],
                "cold_leases": self.leases["cold"],
            }

    def warm_target(self, config: SandboxConfig) -> int:
        """How many idle containers of ``config`` the pool aims to keep now (before the live cap)."""
        with self._cond:
            key = config.fingerprint()
            return self._idle_target(key, time.monotonic()) if key in self._configs else 0

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (callers hold self._cond where noted) ------------------------------------------

    def _want(self, config: SandboxConfig) -> None:  # holds _cond
        key = config.fingerprint()
        self._configs[key] = config
        self._configs.move_to_end(key)
        while len(self._configs) > MAX_WARM_CONFIGS:
            old, _ = self._configs.popitem(last=False)
            for container in self._idle.pop(old, ()):
                self._discard(container)
        self._idle.setdefault(key, deque())
        self._starting.setdefault(key, 0)
        self._busy.setdefault(key, 0)
        self._waiting_for.setdefault(key, 0)
        self._demand.setdefault(key, DemandWindow(self._demand_window_s))

    def _note_demand(self, key: str) -> None:  # holds _cond
        """Record how many containers of ``key`` are wanted now: held or waited for, or, when more,
        expected by the jobs in flight (a job holding one is also one in flight)."""
        held = self._busy.get(key, 0) + self._waiting_for.get(key, 0)
        window = self._demand.get(key)
        if window is not None:
            window.set(max(held, self._expected.get(key, 0)), time.monotonic())

    def _idle_target(self, key: str, now: float) -> int:  # holds _cond
        """Idle containers to keep: ``pool_size``, or what recent demand wants beyond those held."""
        if not self.follow_demand:
            return self.pool_size
        return max(self.pool_size, self._demand[key].peak(now) - self._busy[key])

    def _leased(self, key: str, warm: bool) -> None:  # holds _cond
        self._busy[key] += 1
        self.leases["warm" if warm else "cold"] += 1

    def _reserve(self, key: str) -> None:  # holds _cond
        self._live += 1
        self._starting[key] += 1
        self.peak_live = max(self.peak_live, self._live)

    def _pop_idle(self, key: str) -> SandboxContainer | None:  # holds _cond
        queue = self._idle.get(key)
        while queue:
            container = queue.popleft()
            if container.channel.is_open():
                return container
            self._discard(container)
        return None

    def _evict_other(self, key: str) -> bool:  # holds _cond
        for other, queue in self._idle.items():
            if other != key and queue:
                self._discard(queue.popleft())
                return True
        return False

    def _start(self, config: SandboxConfig) -> SandboxContainer:
        runtime = config.docker_runtime
        try:
            container = self.backend.start(config, owner=self._owner, labels=self._labels)
        except BaseException:
            with self._cond:
                self._live -= 1
                self.failed_by_runtime[runtime] = self.failed_by_runtime.get(runtime, 0) + 1
                self._cond.notify_all()
            raise
        with self._cond:
            self.started_total += 1
            self.started_by_runtime[runtime] = self.started_by_runtime.get(runtime, 0) + 1
        return container

    def _discard(self, container: SandboxContainer) -> None:
        """Have a container removed in the background or, once close() shut the removers down (a
        run released late, a filler's start outlived close), here and now: it never stays."""
        try:
            self._remover.submit(self._destroy, container)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            self._destroy(container)

    def _destroy(self, container: SandboxContainer) -> None:
        try:
            container.destroy()
        finally:
            with self._cond:
                self._live -= 1
                self._cond.notify_all()

    def _ensure_filler(self) -> None:
        if self.pool_size > 0 and not self._filler_started:
            with self._cond:
                if not self._filler_started:
                    self._filler_started = True
                    for filler in self._fillers:
                        filler.start()

    def _next_fill(self) -> SandboxConfig | None:  # holds _cond
        now = time.monotonic()
        if self._waiting or self._live >= self.max_live or now < self._fill_paused_until:
            return None
        for key in reversed(self._configs):  # most recently used first
            ready = len(self._idle[key]) + self._starting[key]
            if ready < self._idle_target(key, now) and (ready < self.pool_size or _memory_to_spare()):
                self._reserve(key)
                return self._configs[key]
        return None

    def _trim(self) -> float | None:  # holds _cond
        """Destroy idle containers beyond what demand still wants; seconds until it may want fewer."""
        now = time.monotonic()
        wake: float | None = None
        for key, queue in self._idle.items():
            target = self._idle_target(key, now)
            while len(queue) > target:
                self._discard(queue.pop())
            change = self._demand[key].next_change(now)
            if change is not None:
                wake = change if wake is None else min(wake, change)
        return wake

    def _fill_forever(self) -> None:
        while True:
            with self._cond:
                config = None
                while not self._closed:
                    config = self._next_fill()
                    if config is not None:
                        break
                    pause = self._fill_paused_until - time.monotonic()
                    waits = [w for w in (pause if pause > 0 else None, self._trim()) if w is not None]
                    self._cond.wait(max(0.01, min(waits)) if waits else None)
                if self._closed or config is None:
                    return
            key = config.fingerprint()
            try:
                container = self._start(config)
            except (SandboxError, SandboxUnavailableError) as e:
                with self._cond:
                    self._starting[key] -= 1
                    self._fill_failures += 1
                    backoff = min(FILL_BACKOFF_MAX_S, 0.5 * 2 ** min(self._fill_failures, 6))
                    self._fill_paused_until = time.monotonic() + backoff
                log.warning("warming a sandbox failed (retrying in %.1f s): %s", backoff, e)
                continue
            except Exception:
                with self._cond:
                    self._starting[key] -= 1
                log.exception("warming a sandbox failed")
                continue
            with self._cond:
                self._starting[key] -= 1
                self._fill_failures = 0
                unwanted = self._closed or key not in self._configs
                if not unwanted:
                    self._idle[key].append(container)
                self._cond.notify_all()
            if unwanted:  # outside the lock: after close, _discard may remove it inline
                self._discard(container)


def _memory_to_spare() -> bool:
    """Whether this host has WARM_MEMORY_RESERVE_BYTES available for warm containers beyond pool_size."""
    import psutil

    return bool(psutil.virtual_memory().available >= WARM_MEMORY_RESERVE_BYTES)
