"""A tool loop's checkpoint carries what a suspended shell job's destroyed session sandboxes refused
(pure: no Redis, no worker). Through a real worker: tests/egress/test_e2e_refusal_counts.py."""

from __future__ import annotations

import json
import time

import pytest

from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import AuditEvent, AuditKind, Limit, NetworkDenial, SessionRecord
from sandfleet.worker.approval.checkpoint import (
    Checkpoint,
    CheckpointMismatchError,
    LoopState,
    PendingCall,
    carry_refusals,
    load_checkpoint,
)

DIRECT = "a direct connection, not through the proxy (packet filter)"


def loop_checkpoint(**refusals: object) -> Checkpoint:
    pending = [PendingCall(call_id="c1", name="issue_refund", arguments="{}")]
    loop = LoopState(mode="shell", turn=2, pending=pending, **refusals)  # type: ignore[arg-type]
    return Checkpoint(number=2, program="", reply="", messages=[], loop=loop)


def committed(raw: str) -> list[AuditEvent]:
    """Entry 0 (the producer's) and the awaiting_approval event committing to ``raw``."""

    def state(status: str, digest: str) -> AuditEvent:
        data = {"status": status, "checkpoint_sha256": digest}
        return AuditEvent(ts=time.time(), job_id="j", attempt=2, kind=AuditKind.STATE, data=data)

    return [state("queued", ""), state("awaiting_approval", sha256_hex(raw))]


def test_a_checkpoint_without_refusal_fields_still_loads_and_carries_none() -> None:
    """A checkpoint written before the fields existed (a job suspended across an upgrade) resumes."""
    fields = json.loads(loop_checkpoint().model_dump_json())
    for name in ("network_denied", "refused_total", "refused_unlisted"):
        del fields["loop"][name]
    raw = json.dumps(fields)
    loop = load_checkpoint(raw, committed(raw)).loop
    assert loop is not None and (loop.network_denied, loop.refused_total, loop.refused_unlisted) == ([], 0, 0)
    record = SessionRecord(refused_total=1, network_denied=[NetworkDenial(host="h", port=1, reason=DIRECT)])
    assert carry_refusals(loop, record) == record


def test_the_carried_refusals_are_added_to_the_last_sessions() -> None:
    earlier = NetworkDenial(host="198.51.100.1", port=443, reason=DIRECT, protocol="tcp")
    later = NetworkDenial(host="203.0.113.1", port=80, reason=DIRECT, protocol="tcp")
    loop = loop_checkpoint(network_denied=[earlier], refused_total=5, refused_unlisted=4).loop
    carried = carry_refusals(loop, SessionRecord(network_denied=[later], refused_total=1))
    assert (carried.network_denied, carried.refused_total, carried.refused_unlisted) == (
        [earlier, later],
        6,
        4,
    )
    assert carried.limits_hit == [Limit.NETWORK]  # the earlier session's refusal is a limit hit too


def test_a_lowered_refusal_count_in_the_stored_checkpoint_is_refused() -> None:
    """Whoever can write Redis cannot hide the earlier session's refusals: the chain commits to them."""
    raw = loop_checkpoint(refused_total=3, refused_unlisted=2).model_dump_json()
    events = committed(raw)
    hidden = raw.replace('"refused_total":3', '"refused_total":0')
    assert hidden != raw
    with pytest.raises(CheckpointMismatchError, match="was changed"):
        load_checkpoint(hidden, events)
