"""Cancel requests: how a producer asks for a job to stop, and how workers find the requests.

A producer cannot end a job itself: only a worker signs final records. So cancelling is a request
(:meth:`CancelRequests.request`, one Lua script: :data:`~sandfleet.core.lua.REQUEST_CANCEL`) that
every worker hears at once over pub/sub and also finds in the fleet's set of pending requests
(pub/sub is at most once: a worker that reconnects sweeps the set). Then:

- the worker running the job kills its sandboxes, abandons its model call and records it
  ``cancelled`` (sandfleet/worker/cancel/);
- a queued job is recorded ``cancelled`` by the first worker that claims the request (``SREM``), and
  its message, when it comes, finds the job ended; a delivery that sees a request never starts the job;
- a job that already ended is left as it was (:attr:`CancelOutcome.ENDED`).

The request outlives a killed worker: a redelivered job with a request ends ``cancelled`` unrun.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis

from sandfleet.core import json_limits
from sandfleet.core.lua import REQUEST_CANCEL
from sandfleet.core.redis_keys import FleetKeys, check_id
from sandfleet.core.replies import text_list, text_or_none


class CancelOutcome(StrEnum):
    """What a cancel request found."""

    REQUESTED = "requested"  # recorded; a worker stops the job (or never starts it)
    AGAIN = "again"  # a request was already pending: nothing new
    ENDED = "final"  # the job had already ended: nothing was changed
    MISSING = "missing"  # no record (never submitted, or past retention)


@dataclass(frozen=True)
class CancelRequest:
    """A pending request: when (epoch seconds) and by whom (``user@host``, or what the caller said)."""

    requested_at: float
    by: str

    @classmethod
    def from_json(cls, raw: str) -> CancelRequest:
        data: dict[str, Any] = json_limits.loads(raw, "a cancel request", cap=json_limits.MAX_RECORD_DEPTH)
        return cls(float(data.get("requested_at", 0.0)), str(data.get("by", "")))

    def to_json(self) -> str:
        return json.dumps({"requested_at": self.requested_at, "by": self.by})

    def describe(self) -> str:
        """``cancelled by NAME`` for the final record's error message."""
        return f"cancelled by {self.by}" if self.by else "cancelled"


class CancelRequests:
    """Cancel requests of one fleet (its key prefix). Raises redis errors as they come."""

    def __init__(self, client: redis.Redis, keys: FleetKeys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.retention_s = retention_s
        self._request = client.register_script(REQUEST_CANCEL)

    def request(self, job_id: str, by: str) -> tuple[CancelOutcome, str]:
        """Ask for ``job_id`` to stop; ``(outcome, the job's status when asked)``."""
        check_id(job_id)
        now = time.time()
        keys = [
            self.keys.job(job_id),
            self.keys.final_guard(job_id),
            self.keys.cancel(job_id),
            self.keys.cancels,
        ]
        args: list[str | float] = [
            job_id,
            CancelRequest(now, by).to_json(),
            self.retention_s,
            self.keys.cancel_channel,
            repr(now),
        ]
        outcome, status = text_list(self._request(keys=keys, args=args))
        return CancelOutcome(outcome), status

    def requested(self, job_id: str) -> CancelRequest | None:
        """The job's cancel request, if there is one."""
        raw = text_or_none(self.redis.get(self.keys.cancel(job_id)))
        if not raw:
            return None
        try:
            return CancelRequest.from_json(raw)
        except ValueError:  # planted past the caps, or not JSON: the key says a cancel was asked for
            return CancelRequest(0.0, "an unreadable request")

    def pending(self) -> list[str]:
        """Ids of jobs whose request is not yet settled."""
        return sorted(text_list(self.redis.smembers(self.keys.cancels)))

    def claim(self, job_id: str) -> bool:
        """Take the pending request of a queued job (True for exactly one caller)."""
        return bool(self.redis.srem(self.keys.cancels, job_id))

    def settle(self, job_id: str) -> None:
        """The job ended: its request is no longer pending (the request itself stays, as evidence)."""
        self.redis.srem(self.keys.cancels, job_id)
