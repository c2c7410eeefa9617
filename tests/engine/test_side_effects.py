"""A tool marked @side_effects is not called again by a repaired program: its recorded result is served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandfleet.core.contracts import JobStatus
from sandfleet.worker.engine import ListAudit
from sandfleet.worker.tools.examples.side import OUTBOX_FILENAME

from .helpers import job, python_block, run

SEND = 'send_email("ana@example.com", "Q3 revenue", body="North America leads.")'


def test_a_repair_does_not_send_the_same_mail_twice(
    engine_services: Any, replay: Any, data_dir: Path
) -> None:
    crashing = (
        f"from sandfleet_tools import *\nmessage_id = {SEND}\nprint(message_id)\nraise RuntimeError('oops')"
    )
    fixed = f"from sandfleet_tools import *\nmessage_id = {SEND}\nprint('RESULT:', '\"' + message_id + '\"')"
    server = replay({"default": [python_block(crashing), python_block(fixed)]})
    audit = ListAudit()
    result = run(job("mail Ana the Q3 figure", tools=["send_email"]), engine_services, server, audit)

    assert result.status == JobStatus.SUCCEEDED, result.error
    outbox = [json.loads(line) for line in (data_dir / OUTBOX_FILENAME).read_text().splitlines()]
    assert len(outbox) == 1 and outbox[0]["to"] == "ana@example.com"
    first, second = result.attempts
    [sent] = first.tool_calls
    [again] = second.tool_calls
    assert sent.tool == again.tool == "send_email" and sent.ok and again.ok
    assert not sent.replayed and again.replayed
    assert again.result == sent.result == outbox[0]["id"] == result.result
    # The audit shows both attempts' calls, the second marked as replayed.
    calls = [(n, data["replayed"]) for kind, n, data in audit.events if kind == "tool_call"]
    assert calls == [(1, False), (2, True)]


def test_a_repair_with_other_arguments_sends_a_new_mail(
    engine_services: Any, replay: Any, data_dir: Path
) -> None:
    crashing = f"from sandfleet_tools import *\n{SEND}\nraise RuntimeError('oops')"
    fixed = 'from sandfleet_tools import *\nsend_email("bo@example.com", "Q3 revenue")\nprint(\'RESULT: 1\')'
    server = replay({"default": [python_block(crashing), python_block(fixed)]})
    result = run(job("mail the Q3 figure", tools=["send_email"]), engine_services, server)

    assert result.status == JobStatus.SUCCEEDED, result.error
    outbox = [json.loads(line) for line in (data_dir / OUTBOX_FILENAME).read_text().splitlines()]
    assert [mail["to"] for mail in outbox] == ["ana@example.com", "bo@example.com"]
    assert not result.attempts[1].tool_calls[0].replayed
