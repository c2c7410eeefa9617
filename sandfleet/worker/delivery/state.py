"""Everything one worker process owns, in one object, started in order and stopped in reverse.

A worker process holds: the job store (Redis), its signing key (every audit event and final record
it writes is signed with it), its presence in the fleet (heartbeat, held
messages, recovery sweeps, which also reap containers left by dead workers), the engine's
services (sandbox pool, tools, model clients; started on the first job) and the count of
deliveries running here. :class:`WorkerState` owns all of them, so no module keeps process state
in globals; the Celery app made by :func:`sandfleet.worker.delivery.celery_app.create_app` carries one and
calls :meth:`WorkerState.start` when the worker is ready and :meth:`WorkerState.stop` when it
shuts down (after its pool drained), like arq's ``on_startup``/``on_shutdown``.

Start order: store, signing key (loaded, or made, and registered), presence, cancel watcher. Stop
order, the reverse of what was started: cancel watcher, engine services (drain the sandbox pool),
then presence (withdraw the heartbeat: a clean exit). Every final record goes through ``job_end``
(sandfleet/worker/delivery/job_end.py), whose hooks run around it: the Flower report (from the start),
then, once started, :class:`CancelCleanup` (settle the job's cancel request), the metrics and the
completion webhooks (reporting.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.cancel import CancelRequest, CancelRequests
from sandfleet.core.contracts import ErrorKind, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import SigningKeyError
from sandfleet.core.key_registry import (
    KeyRegistry,
    acting_ring,
    start_signer,
    trust_problems,
    worker_ring,
)
from sandfleet.core.publish import JobPublisher
from sandfleet.core.queue import queue_name
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import FileSigner, KeyRing
from sandfleet.core.store import JobStore
from sandfleet.worker.cancel.scope import RunningScopes
from sandfleet.worker.cancel.watcher import CancelWatcher
from sandfleet.worker.delivery.flower_report import FlowerReport
from sandfleet.worker.delivery.job_end import JobEnd, JobEndHook, JobEnding, error_result
from sandfleet.worker.delivery.recovery import SweepReport, WorkerPresence
from sandfleet.worker.delivery.reporting import JobReporting
from sandfleet.worker.delivery.run import DeliveryServices, JobRunner

log = logging.getLogger("sandfleet.worker")

REAP_INTERVAL_S = 15.0  # at most one local reap of dead owners' containers this often

# The state of the worker running in this process, for the one caller kombu builds without any
# context (the poison-safe broker channel). Set by WorkerState.start, cleared by stop.
_current: WorkerState | None = None


def current_state() -> WorkerState | None:
    """The started WorkerState of this process, if any."""
    return _current


class CancelCleanup(JobEndHook):
    """Settles a job's cancel request when the job ends, for any reason (idempotent)."""

    def __init__(self, requests: CancelRequests) -> None:
        self.requests = requests

    def on_end(self, ending: JobEnding) -> None:
        self.requests.settle(ending.job_id)


class RunningJobs:
    """How many deliveries of each job run in this process right now (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}

    @contextmanager
    def running(self, job_id: str) -> Iterator[bool]:
        """Count one delivery of ``job_id`` while the block runs; yields whether it is the only one here
        (two deliveries of one job can both read it ``queued`` before either marks it running)."""
        with self._lock:
            self._count[job_id] = self._count.get(job_id, 0) + 1
            first = self._count[job_id] == 1
        try:
            yield first
        finally:
            with self._lock:
                self._count[job_id] -= 1
                if not self._count[job_id]:
                    del self._count[job_id]

    def count(self, job_id: str) -> int:
        with self._lock:
            return self._count.get(job_id, 0)


class WorkerState:
    """One worker process's resources. Constructing it starts nothing.

    Args:
        settings: the fleet's settings.
        app: the worker's Celery app (recovery hands messages back through its broker connection).
        max_sandboxes: live containers at most (``sandfleet worker --sandboxes``).
    """

    def __init__(self, settings: Settings, app: Any, *, max_sandboxes: int | None = None) -> None:
        self.settings = settings
        self.app = app
        self.max_sandboxes = max_sandboxes or settings.max_sandboxes
        self.running = RunningJobs()
        self.job_end = JobEnd()  # every final record this process writes, and the job-end hooks
        self.flower = self.job_end.add(FlowerReport())  # what Flower shows for each job ended here
        self.scopes = RunningScopes()  # the cancel tokens of the deliveries running here
        self._cancel_watcher: CancelWatcher | None = None
        self._lock = threading.Lock()
        self._store: JobStore | None = None
        self._presence: WorkerPresence | None = None
        self._services: Any = None  # EngineServices, imported on first use
        self._last_reap = 0.0
        self._publisher: JobPublisher | None = None
        # metrics (the sandbox pool and the MCP servers read when scraped) and completion webhooks
        self.reporting = JobReporting(settings, self.pool_stats, self.mcp_status)

    # -- start ----------------------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        """The job store (made on first use: a prefork child makes its own connection)."""
        with self._lock:
            if self._store is None:
                self._store = JobStore.from_settings(self.settings)
            return self._store

    def load_signer(self, name: str) -> FileSigner:
        """Load (or make) worker ``name``'s signing key and register its public key; the store signs
        with it from now on. ``sandfleet worker`` calls this before consuming, so a worker whose key
        is unusable (unreadable, revoked) refuses to start.

        Raises:
            SigningKeyError: the key file cannot be read or written, the key is revoked, the register
                holds another public key under its key id, or the pinned key set
                (``SANDFLEET_TRUSTED_KEYS``) cannot be read.
        """
        store = self.store
        if store.signer is None or store.signer.worker != name:
            registry = KeyRegistry(store.redis, FleetKeys(self.settings.key_prefix))
            signer = start_signer(self.settings, name, registry)
            store.signer = signer
            log.info("worker %s signs with key %s (%s)", name, signer.key.key_id, signer.path)
            log.info(
                "worker %s acts on state read back from Redis only when signed with %s",
                name,
                f"the pinned key set {self.settings.trusted_keys}"
                if self.settings.trusted_keys
                else "a key made on this host (SANDFLEET_TRUSTED_KEYS unset)",
            )
            for problem in trust_problems(self.settings, registry, signer.key_info()):
                log.warning("worker %s: %s", name, problem)
        if not isinstance(store.signer, FileSigner):  # another kind of signer was set on the store
            raise SigningKeyError(
                f"worker {name}: the store signs with a {type(store.signer).__name__}, not a key file"
            )
        return store.signer

    def key_ring(self) -> KeyRing:
        """The keys this worker verifies a job's chain with before it uses state the chain commits to:
        the pinned key set (``SANDFLEET_TRUSTED_KEYS``) or else this host's keys, and its own key
        (never a key someone added to the register: sandfleet/core/host_keys.py)."""
        store = self.store
        registry = KeyRegistry(store.redis, FleetKeys(self.settings.key_prefix))
        if store.signer is None:  # not started as a worker (a test's state): no key of its own
            return acting_ring(self.settings, registry)
        return worker_ring(self.settings, registry, store.signer.key_info())

    def start(self, name: str) -> None:
        """Announce this worker (heartbeat, recovery sweeps); called once the worker consumes."""
        from sandfleet.worker.sandbox.docker.spec import Owner

        self.load_signer(name)
        store = self.store
        publisher = JobPublisher(self.app, self.settings)
        self._publisher = publisher
        presence = WorkerPresence(
            store.redis,
            FleetKeys(self.settings.key_prefix),
            name,
            self.app,
            queue_name(self.settings),
            owner_label=Owner.current().label(),
            on_sweep=self.after_sweep,
            republish=lambda job_id: publisher.republish(store.reader, job_id),
            broker=self.broker_redis(store),
            mcp_report=self.mcp_report,
        )
        requests = CancelRequests(store.redis, store.keys, self.settings.retention_s)
        watcher = CancelWatcher(store, requests, self.scopes, end_queued=self._end_cancelled_queued)
        self.job_end.add(CancelCleanup(requests))
        global _current
        with self._lock:
            self._presence = presence
            self._cancel_watcher = watcher
        _current = self
        presence.start()
        watcher.start()
        log.info("worker %s announced (heartbeat every few seconds)", name)
        self.reporting.start(store, self.job_end, ring=self.key_ring)

    def broker_redis(self, store: JobStore) -> Any:
        """The broker's Redis for recovery's reads of kombu's keys: the store's own client unless
        SANDFLEET_RESULTS_REDIS_URL puts the records elsewhere."""
        if not self.settings.results_redis_url:
            return store.redis
        from sandfleet.core.redis_connect import connect

        return connect(self.settings.redis_url, self.settings)

    def pool_stats(self) -> dict[str, Any] | None:
        """The sandbox pool's figures (None before the first job started the engine's services)."""
        services = self._services
        return services.pool.stats() if services is not None else None

    def mcp_status(self) -> list[Any] | None:
        """The MCP servers' states (ServerStatus rows; None before the first job started them)."""
        services = self._services
        mcp = services.mcp if services is not None else None
        return mcp.status() if mcp is not None else None

    def mcp_report(self) -> dict[str, str] | None:
        """What the heartbeat publishes of the MCP servers (sandfleet/worker/mcp/status.py)."""
        statuses = self.mcp_status()
        if statuses is None:
            return None
        from sandfleet.worker.mcp.status import to_report

        return to_report(statuses)

    def add_job_end_hook(self, hook: JobEndHook) -> JobEndHook:
        """Run ``hook`` whenever this process ends a job, for any reason (sandfleet/worker/delivery/job_end.py)."""
        return self.job_end.add(hook)

    def delivery_services(self, worker: str = "") -> DeliveryServices:
        """What each delivery run by this process shares (``worker``: the Celery node's name)."""
        return DeliveryServices(
            self.store,
            run=lambda spec, job_id, audit: self.engine()(spec, job_id, audit),
            job_end=self.job_end,
            scopes=self.scopes,
            running_elsewhere=self.running_elsewhere,
            republish=self.republish,
            worker=worker,
        )

    def _end_cancelled_queued(self, job_id: str, request: CancelRequest) -> None:
        """End a queued job this worker claimed the cancel request of: it never starts."""
        result = error_result(
            job_id, JobStatus.CANCELLED, ErrorKind.CANCELLED, f"{request.describe()} before it started"
        )
        self.job_end.finish(JobEnding(self.store, job_id, result))

    def engine(self) -> JobRunner:
        """``run_job`` bound to this process's EngineServices, started on first use."""
        from sandfleet.core.artifacts import open_artifact_store
        from sandfleet.core.usage_ledger import RedisUsageLedger
        from sandfleet.worker.engine import EngineOptions, EngineServices, run_job

        store = self.store
        approvals = self.approvals()  # before the lock: it reads the store, which takes it too
        with self._lock:
            if self._services is None:
                self._services = EngineServices.start(
                    self.settings,
                    EngineOptions(
                        max_sandboxes=self.max_sandboxes,
                        artifacts=open_artifact_store(self.settings, store.redis),
                    ),
                )
                self._services.approvals = approvals
                self._services.usage_ledger = RedisUsageLedger(
                    store.redis, FleetKeys(self.settings.key_prefix)
                )
            services = self._services

        def run(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
            return run_job(spec, job_id, services=services, audit=audit)

        return run

    def approvals(self) -> Any:
        """The worker's ApprovalService (sandfleet/worker/approval/gate.py): its store, policy and webhook."""
        from sandfleet.core.approvals import ApprovalStore
        from sandfleet.worker.approval.gate import ApprovalService

        store = self.store
        worker = store.signer.worker if store.signer else ""
        return ApprovalService(
            ApprovalStore(store.redis, store.keys, self.settings.retention_s),
            self.settings,
            worker,
            ring=self.key_ring,
        )

    # -- while running --------------------------------------------------------------------------

    def republish(self, job_id: str) -> bool:
        """Publish a queued job's message again (a decision freed a suspended job); False if it ended."""
        publisher = self._publisher or JobPublisher(self.app, self.settings)
        try:
            return publisher.republish(self.store.reader, job_id)
        except Exception as e:  # the reconciliation finds a queued job without a message and publishes it
            log.warning("could not publish job %s again: %s", job_id, e)
            return False

    def after_sweep(self, report: SweepReport | None = None) -> None:
        """After each recovery sweep: time out overdue approval requests (their jobs resume with a
        denial), send the committed webhooks no live worker is sending, then reap dead owners'
        containers."""
        try:
            self.approvals().expire(self.republish)
        except Exception as e:
            log.warning("timing out approval requests failed: %s", e)
        self.reporting.sweep_outbox()
        self.reap_local_leftovers(report)

    def running_elsewhere(self, job_id: str, worker: str) -> bool:
        """Whether ``job_id`` runs right now on ``worker`` (another live worker, or another delivery here)."""
        presence = self._presence
        if presence is None:
            return False
        if worker == presence.name:
            return self.running.count(job_id) > 1  # this delivery counts itself
        return presence.holds(worker, job_id)

    def hold(self, delivery_tag: str, job_id: str) -> None:
        """Note a message this worker received, so recovery can hand it back if the worker dies."""
        presence = self._presence
        if presence is None:
            return
        try:
            presence.hold(delivery_tag, job_id)
        except Exception as e:  # never lose the message over bookkeeping; the orphan sweep covers it
            log.warning("could not record held message %s: %s", delivery_tag, e)

    def reap_local_leftovers(self, report: SweepReport | None = None) -> None:
        """Remove containers on this host whose owner process died (every REAP_INTERVAL_S at most)."""
        if time.monotonic() - self._last_reap < REAP_INTERVAL_S:
            return
        self._last_reap = time.monotonic()
        from sandfleet.worker.sandbox.docker.reaper import prune

        try:
            pruned = prune()
        except Exception as e:  # the engine may be down: the next round tries again
            log.warning("reaping leftover sandboxes failed: %s", e)
            return
        if pruned.removed:
            log.warning("removed %d sandbox container(s) left by dead workers", len(pruned.removed))

    # -- stop -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop what was started, in reverse: drain the sandbox pool, then withdraw the presence.

        Safe to call more than once, and from a prefork child (which has no presence).
        """
        global _current
        with self._lock:
            services, self._services = self._services, None
            presence, self._presence = self._presence, None
            watcher, self._cancel_watcher = self._cancel_watcher, None
        if _current is self:
            _current = None
        if watcher is not None:
            watcher.stop()
        if services is not None:
            try:
                services.close()
            except Exception:
                log.exception("closing the engine services failed")
        if presence is not None:
            presence.stop(clean=True)
        self.reporting.stop()
