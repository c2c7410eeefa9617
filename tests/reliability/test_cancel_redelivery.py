"""A cancel request outlives the worker running the job: kill -9 it, and the redelivered job ends
``cancelled`` without running again, with one signed final record, its dead worker's sandbox reaped."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from sandfleet.core.cancel import CancelOutcome
from sandfleet.fleet.local import LocalFleet

from .harness import containers_of, final_state_events, running_on, sleeper_script, wait_for

pytestmark = [pytest.mark.slow]

LIMIT_S = 90.0


def test_a_cancelled_job_redelivered_after_a_kill_stays_cancelled(
    redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    server = redis_factory()
    fleet = make_fleet(server.url)
    first = fleet.start_worker(concurrency=1, sandboxes=1)
    model = f"replay:{sleeper_script(fleet.scripts_dir, 60)}"
    with fleet.client() as client:
        job = client.submit("Sleep, then answer.", model=model)
        assert wait_for(lambda: running_on(client, job.job_id) == first.name, 60)
        assert wait_for(lambda: containers_of(first.process.pid), 30)
        first.process.send_signal(signal.SIGSTOP)  # frozen: it cannot act on the request
        report = job.cancel()
        assert report.outcome == CancelOutcome.REQUESTED and report.status == "running"
        fleet.kill(first)  # kill -9 before it ever saw the request
        first.process.wait()
        fleet.start_worker(concurrency=1, sandboxes=1)  # takes the message back when the heartbeat lapses
        result = job.result(timeout=LIMIT_S)
        assert result.status.value == "cancelled" and result.error is not None
        assert "before it started" in result.error.message
        record = job.record()
        assert record.deliveries >= 2 and record.attempts == 1  # redelivered, never run again
        assert final_state_events(client, job.job_id) == 1 and job.verify().holds
        assert [e.data["status"] for e in job.audit() if e.kind == "state"] == [
            "queued",
            "running",
            "cancelled",
        ]
        assert not client.redis.sismember(client.keys.cancels, job.job_id)  # settled
    assert wait_for(lambda: not containers_of(first.process.pid), LIMIT_S, 0.5)
