"""Helpers of the fleet tests (importable, unlike conftest.py). The worker harness lives in
``sandfleet_testing.workers``; its names are re-exported here for the modules that import them from
this file."""

from __future__ import annotations

from sandfleet_testing.scripts import replay_script  # noqa: F401 - re-exported
from sandfleet_testing.workers import (  # noqa: F401 - re-exported
    JOB_TIMEOUT_S,
    ORDERS,
    SANDFLEET,
    FleetWorker,
    WorkerFactory,
    fleet_settings_for,
    keys_under,
    start_worker,
    stop_worker,
)

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import AuditKind
from sandfleet.core.store import JobStore
from sandfleet.fleet.local_redis import free_port as free_port  # shared by the tests here

TEST_WORKER = "test-worker@tests"  # the worker the ``store`` fixture signs as


def start_job(store: JobStore, job_id: str) -> RedisAuditSink:
    """Mark the job running and write its ``running`` event, as a worker's delivery does; returns its
    audit sink (signed with the store's key)."""
    record = store.record(job_id)
    assert record is not None and record.spec is not None and store.signer is not None
    store.mark_running(job_id, store.signer.worker)
    sink = store.audit_sink(job_id)
    spec_digest = sha256_hex(record.spec.model_dump_json())
    sink.emit(
        AuditKind.STATE, {"status": "running", "worker": store.signer.worker, "spec_sha256": spec_digest}
    )
    return sink
