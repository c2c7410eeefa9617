"""``signed_request``: the worker stores a request a moment before it appends the signed event, so an
approval looks again while the chain holds no event yet, and only then (never on a rewritten
request) gives up. Pure logic: the reads and checks are counted."""

from __future__ import annotations

import pytest

from sandfleet.core.approvals import ApprovalRequest
from sandfleet.producer import request_check
from sandfleet.producer.request_check import NO_SIGNED_EVENT, RequestCheck, signed_request

REQUEST = ApprovalRequest.model_construct(id="apr-1", job_id="job-1")


def checks(*verdicts: RequestCheck) -> tuple[list[int], object]:
    seen: list[int] = []

    def check(_: ApprovalRequest) -> RequestCheck:
        seen.append(1)
        return verdicts[min(len(seen), len(verdicts)) - 1]

    return seen, check


def test_an_event_that_follows_the_request_is_waited_for() -> None:
    seen, check = checks(RequestCheck("unverified", NO_SIGNED_EVENT), RequestCheck("verified", "event 3"))
    request, verdict = signed_request(lambda: REQUEST, check)  # type: ignore[arg-type]
    assert (request, verdict.state, len(seen)) == (REQUEST, "verified", 2)


def test_a_rewritten_request_is_not_looked_at_again() -> None:
    seen, check = checks(RequestCheck("differs", "event 3", ["arguments"]))
    _, verdict = signed_request(lambda: REQUEST, check)  # type: ignore[arg-type]
    assert (verdict.state, len(seen)) == ("differs", 1)


def test_a_chain_that_does_not_verify_is_not_looked_at_again() -> None:
    seen, check = checks(RequestCheck("unverified", "the job's audit chain does not verify: x"))
    _, verdict = signed_request(lambda: REQUEST, check)  # type: ignore[arg-type]
    assert (verdict.state, len(seen)) == ("unverified", 1)


def test_a_request_never_signed_is_refused_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_check, "SIGNED_EVENT_WAIT_S", 0.2)
    seen, check = checks(RequestCheck("unverified", NO_SIGNED_EVENT))
    _, verdict = signed_request(lambda: REQUEST, check)  # type: ignore[arg-type]
    assert verdict.state == "unverified" and verdict.detail == NO_SIGNED_EVENT
    assert len(seen) >= 2  # looked again before giving up
