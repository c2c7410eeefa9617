"""Job records in Redis, write side: state transitions, the one final record, the audit chain.

Key names are in :mod:`producer.keys`; reads are in :mod:`producer.records` (producers read
records without importing worker code).
"""

from worker.store.audit import RedisAuditSink, verify_chain
from worker.store.jobs import JobStore, Transition

__all__ = ["JobStore", "RedisAuditSink", "Transition", "verify_chain"]
