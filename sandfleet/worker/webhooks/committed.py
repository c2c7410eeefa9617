"""Whether a job's verified audit chain commits to an outbox entry's POST: pure, no Redis.

The outbox (sandfleet/core/webhook_outbox.py) is a Redis value a worker reads back, so whoever can
write Redis could plant an entry to make a worker POST a body of theirs, or to a URL of theirs. An
entry is sent only when all of these hold:

- the job's record and chain verify with the worker's key set and the chain is sealed
  (:func:`~sandfleet.core.verify.verify_job`: the seal is last, signed by the worker the record names);
- the last ``webhook`` event of the entry's kind signed with the seal's key (the worker that wrote the
  final record committed it, not a delivery that died or lost the race before the seal) says
  ``sent: true`` and names the entry's URL, delivery id, timestamp and the SHA-256 of its body;
- the URL is the job's own, from the spec entry 0 commits to (``webhook``, or ``batch_webhook`` for
  ``batch.ended``), and the delivery id is the job's id (or ``batch:`` its batch's id).

So a planted entry can at most repeat a POST the fleet committed, with the same ``Idempotency-Key``.
"""

from __future__ import annotations

from sandfleet.core.contracts import AuditEvent, AuditKind, JobSpec
from sandfleet.core.verify import JobEvidence, Verdict
from sandfleet.core.webhook_outbox import OutboxEntry
from sandfleet.worker.webhooks.payloads import BATCH_EVENT, JOB_EVENT


def committed_problem(entry: OutboxEntry, evidence: JobEvidence, verdict: Verdict) -> str | None:
    """Why the job's chain does not commit exactly ``entry``'s POST; None when it does."""
    if not verdict.verified:
        return f"the job's audit chain does not prove a final record: {verdict.describe()}"
    committed = sealer_commit(evidence, entry.event)
    if committed is None:
        return f"the worker that sealed the job committed no {entry.event} webhook in its chain"
    data = committed.data
    if data.get("sent") is not True:
        return f"the chain's {entry.event} webhook was not to be sent ({data.get('reason')})"
    wanted = {
        "url": entry.url,
        "delivery": entry.delivery_id,
        "body_sha256": entry.body_sha256,
        "timestamp": entry.timestamp,
    }
    for name, value in wanted.items():
        if data.get(name) != value:
            return f"its {name} is not the one the job's chain committed"
    return spec_problem(entry, evidence)


def sealer_commit(evidence: JobEvidence, event: str) -> AuditEvent | None:
    """The last ``webhook`` event of kind ``event`` before the seal, signed with the seal's key."""
    entries = evidence.entries
    if len(entries) < 2:
        return None
    seal_key = entries[-1].key
    for stored in reversed(entries[1:-1]):
        if stored.key != seal_key:
            continue
        parsed = AuditEvent.model_validate_json(stored.event)
        if parsed.kind == AuditKind.WEBHOOK and parsed.data.get("event") == event:
            return parsed
    return None


def spec_problem(entry: OutboxEntry, evidence: JobEvidence) -> str | None:
    """Why the entry is not the job's own webhook by its spec (the chain's entry 0 commits to it)."""
    raw = evidence.record.get("spec")
    if not raw:
        return "the job's record has no spec"
    spec = JobSpec.model_validate_json(raw)
    if entry.event == JOB_EVENT:
        url, delivery = spec.webhook, evidence.job_id
    elif entry.event == BATCH_EVENT:
        url, delivery = spec.batch_webhook, f"batch:{evidence.record.get('batch_id', '')}"
    else:
        return f"{entry.event} is not a webhook event"
    if entry.url != url:
        return "its URL is not the one the job's spec names"
    if entry.delivery_id != delivery:
        return "its delivery id is not the job's (or its batch's)"
    return None
