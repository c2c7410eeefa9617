"""The loop through a real replay server, the real openai client and real sandboxes: answers, repairs
and the failures that end a job (a failing program is a result, never an exception)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.contracts import ErrorKind, JobStatus
from sandfleet.worker.engine import ListAudit
from sandfleet.worker.sandbox.container import AGENT_KILLED
from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_PROGRAM, REFERENCE_QUESTION

from .helpers import job, model_requests, python_block, run

KEYERROR_PROGRAM = """
from sandfleet_tools import *

orders = load_orders()
print(sum(order["revenue"] for order in orders))  # no such column
print("RESULT: never")
"""
ENDLESS_PROGRAM = """
while True:
    pass
"""


def test_keyerror_then_a_right_program_is_one_repair(
    engine_services: Any, replay: Any, orders_dir: Path
) -> None:
    server = replay(
        {"rules": [{"match": "revenue per region", "responses": [
            python_block(KEYERROR_PROGRAM), python_block(REFERENCE_PROGRAM)
        ]}]}
    )  # fmt: skip
    audit = ListAudit()
    result = run(job(REFERENCE_QUESTION, tools=["load_orders"]), engine_services, server, audit)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == REFERENCE_ANSWER
    assert result.repairs == 1 and len(result.attempts) == 2
    first, second = result.attempts
    assert first.number == 1 and first.exit_code == 1 and not first.result_found
    assert "KeyError: 'revenue'" in first.stderr_tail
    assert first.failure == "the program exited with code 1"
    assert len(first.tool_calls) == 1 and first.tool_calls[0].tool == "load_orders"
    assert second.number == 2 and second.exit_code == 0 and second.result == REFERENCE_ANSWER
    assert first.container_id and second.container_id and first.container_id != second.container_id
    assert result.final_program == REFERENCE_PROGRAM
    assert result.tool_calls == 2
    assert result.usage.model_calls == 2 and result.usage.prompt_tokens > 0
    assert server.stats().requests == 2
    # The repair request the model received names the exit code and shows the traceback.
    repair_request = model_requests(audit)[1][-1]
    assert repair_request["role"] == "user"
    assert "Exit code: 1." in repair_request["content"] and "KeyError: 'revenue'" in repair_request["content"]
    for phase in ("model_s", "sandbox_s", "total_s"):
        assert result.timings[phase] > 0
    assert result.timings["total_s"] >= result.timings["model_s"] + result.timings["sandbox_s"]


def test_two_broken_programs_fail_and_name_the_last_failure(engine_services: Any, replay: Any) -> None:
    server = replay(
        {"default": [python_block("raise ValueError('first try')"), python_block("import sys; sys.exit(3)")]}
    )
    result = run(job("anything", code_action={"max_repairs": 1}), engine_services, server)

    assert result.status == JobStatus.FAILED
    assert result.error is not None and result.error.kind == "program"
    assert result.error.message == "no answer after 2 attempts: the program exited with code 3"
    assert [a.exit_code for a in result.attempts] == [1, 3]
    assert "ValueError: first try" in result.attempts[0].stderr_tail
    assert result.repairs == 1 and result.result is None
    assert result.final_program == "import sys; sys.exit(3)\n"


def test_an_endless_loop_that_never_recovers_times_out(engine_services: Any, replay: Any) -> None:
    server = replay({"default": [python_block(ENDLESS_PROGRAM)]})
    audit = ListAudit()
    spec = job("loop forever", code_action={"exec_timeout": 2, "max_repairs": 1})
    result = run(spec, engine_services, server, audit)

    assert result.status == JobStatus.TIMED_OUT
    assert result.error is not None and result.error.kind == "timeout"
    assert "timed out (killed at 2 s)" in result.error.message
    assert [a.timed_out for a in result.attempts] == [True, True]
    assert all(a.timings["run_s"] < 10 for a in result.attempts)
    assert "killed at its time limit" in model_requests(audit)[1][-1]["content"]


KILL_EVERY_PROCESS_PROGRAM = """
import os, signal

for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    os.kill(pid, signal.SIGKILL)  # the agent (pid 1) first, the program itself last
"""


def test_a_program_that_kills_its_sandboxs_agent_fails_the_job_as_agent_killed(
    engine_services: Any, replay: Any, gvisor: Any
) -> None:
    """Under gVisor the program's SIGKILL reaches the agent: no limit was hit, and the job says what
    happened (under runc the agent is out of reach; the next test)."""
    server = replay({"default": [python_block(KILL_EVERY_PROCESS_PROGRAM)]})
    spec = job("kill them all", sandbox={"backend": "gvisor"}, code_action={"max_repairs": 0})
    result = run(spec, engine_services, server)

    assert result.status == JobStatus.FAILED
    assert result.error is not None and result.error.kind == ErrorKind.AGENT_KILLED
    assert result.error.message == f"no answer after 1 attempt: {AGENT_KILLED}"
    (attempt,) = result.attempts
    assert attempt.limits_hit == [] and attempt.failure == AGENT_KILLED and attempt.runtime == "runsc"


def test_under_runc_the_agent_outlives_a_program_that_kills_every_process(
    engine_services: Any, replay: Any
) -> None:
    server = replay({"default": [python_block(KILL_EVERY_PROCESS_PROGRAM)]})
    result = run(job("kill them all", code_action={"max_repairs": 0}), engine_services, server)

    assert result.error is not None and result.error.kind == ErrorKind.PROGRAM
    assert result.error.message == "no answer after 1 attempt: the program exited with code 137"
    (attempt,) = result.attempts
    assert attempt.limits_hit == [] and attempt.exit_code == 137 and attempt.runtime == "runc"


def test_a_timeout_then_a_fast_program_is_repaired(engine_services: Any, replay: Any) -> None:
    server = replay({"default": [python_block(ENDLESS_PROGRAM), python_block("print('RESULT: 7')")]})
    result = run(job("loop once", code_action={"exec_timeout": 2}), engine_services, server)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == 7 and result.repairs == 1
    assert result.attempts[0].timed_out and not result.attempts[1].timed_out


def test_the_tool_budget_reaches_the_model_in_the_repair_request(
    engine_services: Any, replay: Any, orders_dir: Path
) -> None:
    greedy = """
    from sandfleet_tools import *

    total = 0
    for _ in range(10):
        total += len(load_orders())
    print("RESULT:", total)
    """
    frugal = """
    from sandfleet_tools import *

    print("RESULT:", len(load_orders()))
    """
    # Only a request whose user messages mention the budget gets the frugal program: if the job
    # succeeds, the model was told.
    server = replay(
        {
            "rules": [
                {"match": "tool-call budget", "responses": [python_block(frugal)]},
                {"match": "how many orders", "responses": [python_block(greedy)]},
            ]
        }
    )
    spec = job("how many orders are there?", tools=["load_orders"], code_action={"max_tool_calls": 3})
    result = run(spec, engine_services, server)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == 500 and result.repairs == 1
    first = result.attempts[0]
    assert "tool_calls" in first.limits_hit and first.exit_code != 0
    assert first.failure is not None and "tool-call budget" in first.failure
    assert [c.ok for c in first.tool_calls] == [True, True, True, False]
    assert "budget" in (first.tool_calls[-1].error or "")
    assert len(result.attempts[1].tool_calls) == 1


def test_a_program_without_a_result_line_is_repaired(engine_services: Any, replay: Any) -> None:
    server = replay(
        {"default": [python_block("print('the answer is', 6 * 7)"), python_block("print('RESULT:', 6 * 7)")]}
    )
    audit = ListAudit()
    result = run(job("six times seven"), engine_services, server, audit)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == 42 and result.repairs == 1
    first = result.attempts[0]
    assert first.exit_code == 0 and not first.result_found
    assert first.failure == "the program printed no line starting with 'RESULT:'"
    assert "the answer is 42" in model_requests(audit)[1][-1]["content"]  # its stdout is shown


def test_a_reply_without_code_is_a_failed_attempt_then_repaired(engine_services: Any, replay: Any) -> None:
    server = replay(
        {"default": ["I believe the answer is about 42.", python_block("print('RESULT:', 6 * 7)")]}
    )
    audit = ListAudit()
    result = run(job("six times seven"), engine_services, server, audit)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == 42 and result.repairs == 1
    first = result.attempts[0]
    assert first.program is None and first.exit_code is None and first.container_id is None
    assert first.reply == "I believe the answer is about 42."
    assert first.failure == "the reply contained no Python program"
    assert "```python" in model_requests(audit)[1][-1]["content"]


def test_replies_without_code_until_the_end_fail_as_no_program(engine_services: Any, replay: Any) -> None:
    server = replay({"default": ["No."]})
    audit = ListAudit()
    result = run(job("six times seven", code_action={"max_repairs": 1}), engine_services, server, audit)

    assert result.status == JobStatus.FAILED
    assert result.error is not None and result.error.kind == "no_program"
    assert result.error.message == "no answer after 2 attempts: the reply contained no Python program"
    assert [a.program for a in result.attempts] == [None, None]
    assert not [kind for kind, _n, _data in audit.events if kind == "sandbox_run"]  # nothing ran


def test_the_history_reaches_the_model(engine_services: Any, replay: Any) -> None:
    server = replay(
        {
            "rules": [
                {"match": "PELICAN", "responses": [python_block("print('RESULT: \"history-seen\"')")]},
            ],
            "default": [python_block("print('RESULT: \"history-missing\"')")],
        }
    )
    history = [
        {"role": "user", "content": "my codeword is PELICAN"},
        {"role": "assistant", "content": "noted"},
    ]
    result = run(job("What is my codeword?", history=history), engine_services, server)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == "history-seen"


def test_the_engine_logs_each_program_and_each_run(
    engine_services: Any, replay: Any, caplog: pytest.LogCaptureFixture
) -> None:
    program = "print('working on it')\nprint('RESULT: 5')"
    server = replay({"default": [python_block("import sys; sys.exit('bad luck')"), python_block(program)]})
    caplog.set_level(logging.DEBUG, logger="sandfleet.engine")
    result = run(job("five"), engine_services, server)

    assert result.status == JobStatus.SUCCEEDED, result.error
    engine_records = [r for r in caplog.records if r.name == "sandfleet.engine"]
    assert all(r.levelno == logging.DEBUG for r in engine_records)
    text = "\n".join(r.getMessage() for r in engine_records)
    assert "attempt 1 program:\nimport sys; sys.exit('bad luck')" in text
    assert "attempt 1 exit 1" in text and "bad luck" in text  # its stderr
    assert f"attempt 2 program:\n{program}" in text
    assert "attempt 2 exit 0" in text and "working on it" in text and "RESULT: 5" in text
