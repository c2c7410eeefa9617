"""Batch-wide job options end to end: ``sandfleet batch FILE --tools ... -o ...`` and
``Client.submit_batch(specs, **defaults)`` through a real worker (Docker sandboxes, the example order
tools, the replay model); a row's own columns win; a bad row or option enqueues nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.priority import queue_length
from sandfleet.core.queue import queue_name

from .helpers import ORDERS, SANDFLEET, FleetWorker, WorkerFactory, keys_under, replay_script


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    return module_fleet_worker("batch-options", tools=ORDERS, sandboxes=2, script=replay_script)


def cli(fleet: FleetWorker, *args: str) -> subprocess.CompletedProcess[str]:
    settings = fleet.settings
    env = {
        **os.environ,
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_RETENTION_S": str(settings.retention_s),
    }
    return subprocess.run([SANDFLEET, *args], capture_output=True, text=True, env=env, timeout=300)


def job_keys(fleet: FleetWorker) -> list[str]:
    r = fleet.client.redis
    return [k for k in keys_under(r, fleet.settings.key_prefix) if ":job:" in k or ":batch:" in k]


def test_batch_options_apply_to_every_row_and_a_rows_columns_win(fleet: FleetWorker, tmp_path: Path) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    rows = tmp_path / "questions.csv"
    rows.write_text(
        "question,sandbox,priority,metadata\n"
        f'"{REFERENCE_QUESTION}",,,\n'
        f'"{REFERENCE_QUESTION} (again)","{{""timeout"": 90}}",7,"{{""row"": 2}}"\n'
    )
    out = tmp_path / "results.jsonl"
    done = cli(
        fleet, "batch", str(rows), "--tools", "load_orders", "--model", fleet.model,
        "-o", "memory_limit=256M", "--exec-timeout", "30", "--max-repairs", "0",
        "--priority", "2", "--metadata", "team=ops", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, (done.stderr, fleet.log()[-3000:])
    batch_id = done.stdout.strip()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in results] == ["succeeded", "succeeded"] and all(
        r["verified"] for r in results
    )
    assert all(r["result"] == REFERENCE_ANSWER for r in results)
    first, second = (r.spec for r in fleet.client.jobs(batch=batch_id))
    assert first is not None and second is not None
    assert first.tools == second.tools == ["load_orders"] and first.model == second.model == fleet.model
    assert first.sandbox == {"memory_limit": 256 * 1024**2}
    assert second.sandbox == {"memory_limit": 256 * 1024**2, "timeout": 90}  # merged key by key
    assert first.code_action.exec_timeout == second.code_action.exec_timeout == 30
    assert first.code_action.max_repairs == second.code_action.max_repairs == 0
    assert (first.priority, second.priority) == (2, 7)
    assert first.metadata == {"team": "ops"} and second.metadata == {"team": "ops", "row": 2}


def test_bad_rows_and_bad_batch_options_enqueue_nothing(fleet: FleetWorker, tmp_path: Path) -> None:
    before = job_keys(fleet)
    rows = tmp_path / "bad.csv"
    rows.write_text("question,tools,priority\nfine,,\ntoo urgent,,12\nbad tool,no-such-tool!,\n")
    done = cli(fleet, "batch", str(rows), "--tools", "load_orders")
    assert done.returncode == 2
    assert "invalid rows, nothing enqueued" in done.stderr
    assert "line 3: priority: Input should be less than or equal to 9" in done.stderr
    assert "line 4: tools: Value error, tool names are Python identifiers" in done.stderr or (
        "line 4: tools: tool names are Python identifiers" in done.stderr
    )
    fine = tmp_path / "fine.csv"
    fine.write_text("question\nfine\n")
    bad_option = cli(fleet, "batch", str(fine), "-o", "colour=red")
    assert bad_option.returncode == 2 and "invalid batch-wide options: sandbox" in bad_option.stderr
    assert "colour" in bad_option.stderr
    bad_priority = cli(fleet, "batch", str(fine), "--priority", "12")
    assert bad_priority.returncode == 2 and "--priority" in bad_priority.stderr
    assert queue_length(fleet.client.redis, queue_name(fleet.settings)) == 0 and job_keys(fleet) == before


def test_the_python_api_takes_the_same_defaults(fleet: FleetWorker) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    client = fleet.client
    batch = client.submit_batch(
        [REFERENCE_QUESTION, {"question": f"{REFERENCE_QUESTION}?", "code_action": {"max_repairs": 1}}],
        tools=["load_orders"],
        model=fleet.model,
        code_action={"exec_timeout": 30, "max_repairs": 0},
        priority=4,
    )
    results = batch.wait(timeout=300)
    assert [r.status for r in results] == [JobStatus.SUCCEEDED] * 2
    assert all(r.result == REFERENCE_ANSWER for r in results)
    specs = [r.spec for r in client.jobs(batch=batch.batch_id)]
    assert [(s.code_action.exec_timeout, s.code_action.max_repairs) for s in specs if s] == [(30, 0), (30, 1)]
    assert [s.priority for s in specs if s] == [4, 4]
    with pytest.raises(InvalidSpecError, match="batch-wide options question are not job options"):
        client.submit_batch(["q"], question="x")
    with pytest.raises(InvalidSpecError, match="invalid batch-wide options: priority"):
        client.submit_batch(["q"], priority=11)
