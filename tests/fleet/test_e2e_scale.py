"""The fleet end to end at batch scale: 50-question batches from CSV and JSONL through the CLI,
replay of a finished job from its audit record, and 200 jobs in flight on 4 sandbox slots."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobStatus
from sandfleet.core.settings import Settings
from sandfleet.worker.sandbox.docker.spec import Owner, process_start_ticks

from .helpers import JOB_TIMEOUT_S, SANDFLEET, FleetWorker, WorkerFactory

TRIVIAL = '```python\nprint("RESULT: " + str(6 * 7))\n```'


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
    }


def script(folder: Path, *, latency: float = 0.0) -> str:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_PROGRAM

    body = {
        "rules": [{"match": "(?i)revenue per region", "responses": [f"```python\n{REFERENCE_PROGRAM}```"]}],
        "default": [TRIVIAL],
    }
    path = folder / f"script-{latency}.json"
    path.write_text(json.dumps(body))
    return f"replay:{path}" + (f"?latency={latency}" if latency else "")


@pytest.fixture(scope="module")
def scale_fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """One worker for the module (its tests submit under their own batches and jobs): the example order
    tools on the reference data, 4 sandbox slots, 200 jobs at a time."""
    return module_fleet_worker(
        "scale-fleet", tools="sandfleet.worker.tools.examples.orders", sandboxes=4, concurrency=200
    )


def test_batches_of_fifty_from_csv_and_jsonl_write_their_results(
    scale_fleet: FleetWorker, tmp_path: Path
) -> None:
    model = script(scale_fleet.scripts_dir)
    questions = [f"What is six times seven? (copy {i})" for i in range(50)]
    csv_in = tmp_path / "questions.csv"
    with csv_in.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "model"])
        writer.writerows([q, model] for q in questions)
    jsonl_in = tmp_path / "questions.jsonl"
    jsonl_in.write_text("".join(json.dumps({"question": q, "model": model}) + "\n" for q in questions))
    for source, out in ((csv_in, tmp_path / "out.csv"), (jsonl_in, tmp_path / "out.jsonl")):
        done = subprocess.run(
            [SANDFLEET, "batch", str(source), "--out", str(out)],
            env=cli_env(scale_fleet.settings),
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S * 3,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        if out.suffix == ".csv":
            with out.open() as f:
                rows = list(csv.DictReader(f))
        else:
            rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 50
        assert all(row["status"] == "succeeded" for row in rows), rows[:3]
        assert all(str(row["result"]) == "42" for row in rows), rows[:3]


def test_a_finished_job_replays_to_the_same_result(scale_fleet: FleetWorker) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    model = script(scale_fleet.scripts_dir)
    job = scale_fleet.client.submit(REFERENCE_QUESTION, tools=["load_orders"], model=model)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.result == REFERENCE_ANSWER
    kinds = [e.kind for e in job.audit()]
    assert {"program", "sandbox_run", "tool_call"} <= set(kinds)
    done = subprocess.run(
        [SANDFLEET, "replay", job.job_id, "--json"],
        env=cli_env(scale_fleet.settings),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout)
    assert outcome["match"] is True and outcome["replayed"] == REFERENCE_ANSWER


def test_two_hundred_jobs_in_flight_share_four_sandbox_slots(scale_fleet: FleetWorker) -> None:
    """Jobs waiting 2 s on the model hold no container: 200 finish, never more than 4 containers live."""
    import docker

    model = script(scale_fleet.scripts_dir, latency=2.0)
    pid = scale_fleet.process.pid
    owner = Owner(Owner.current().host, pid, process_start_ticks(pid) or 0).label()
    engine = docker.from_env()
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            live = engine.api.containers(all=True, filters={"label": f"sandfleet.owner={owner}"})
            peak = max(peak, len(live))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        batch = scale_fleet.client.submit_batch(
            [{"question": f"six times seven #{i}", "model": model} for i in range(200)]
        )
        in_flight = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and in_flight < 100:
            progress = batch.progress()
            in_flight = max(in_flight, progress.counts.get("running", 0))
            time.sleep(0.2)
        results = batch.wait(timeout=600)
    finally:
        stop.set()
        sampler.join()
        engine.close()
    assert [r.status for r in results] == [JobStatus.SUCCEEDED] * 200
    assert all(r.result == 42 for r in results)
    assert in_flight >= 100, f"only {in_flight} jobs were running at once"
    assert 1 <= peak <= 4, f"{peak} containers were live at once"
