"""Artifacts end to end: a real ``sandfleet worker`` on a real Redis, Docker sandboxes (the data-science
image for the plot), the replay model over HTTP, and the ``sandfleet`` commands as a user runs them.

In both modes with a sandbox (a code-action job's program; a shell job's commands, scripted as
``sandbox_write_file`` and ``sandbox_exec`` calls in its session sandbox): a matplotlib plot saved under
/workspace/out/ comes back as a PNG (signature, size, dimensions) through the JobResult, the Python API
and ``sandfleet artifacts --out``; it is in the audit chain, verified (and replayed, for code-action);
bytes changed at rest are refused by ``audit --verify``, ``replay`` and ``artifacts``. Over-cap files
are skipped with ``limits_hit``; a job asking above the operator's caps is refused; a failed job keeps
the files it wrote, a cancelled one none. A batch's ``--out DIR`` receives every job's files; a warm
sandbox never shows one job's files to the next.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from sandfleet.core.config import DATA_SCIENCE_IMAGE
from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import ArtifactIntegrityError
from sandfleet.core.settings import Settings

from .helpers import JOB_TIMEOUT_S, SANDFLEET, FleetWorker, WorkerFactory

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT = """```python
import csv, json
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
revenue = {"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}
fig, ax = plt.subplots(figsize=(4, 3))
ax.bar(list(revenue), list(revenue.values()))
ax.set_title("Q3 2026 revenue per region")
fig.savefig("/workspace/out/revenue.png", dpi=100)
with open("/workspace/out/revenue.csv", "w", newline="") as f:
    csv.writer(f).writerows(revenue.items())
print("RESULT: " + json.dumps(revenue))
```"""
OVER_CAP = """```python
open("/workspace/out/small.txt", "w").write("small")
open("/workspace/out/large.bin", "wb").write(b"x" * 5000)
print("RESULT: 1")
```"""
LEAVE_A_FILE = """```python
import os
open("/workspace/out/mine.txt", "w").write("job one's file")
print("RESULT: " + str(sorted(os.listdir("/workspace/out"))))
```"""
LOOK_FOR_FILES = """```python
import json, os
print("RESULT: " + json.dumps(sorted(os.listdir("/workspace/out"))))
```"""
FAIL_AFTER_WRITING = """```python
open("/workspace/out/partial.csv", "w").write("region,total\\nEMEA,77689.0\\n")
raise SystemExit("the rest of the work failed")
```"""
WRITE_THEN_WAIT = """```python
import time
open("/workspace/out/partial.csv", "w").write("half done")
time.sleep(120)
print("RESULT: 1")
```"""
MODES = ("code-action", "shell")
CODE_ACTION_SYSTEM = "writing ONE Python program"  # regexes over the modes' system prompts
SHELL_SYSTEM = "Linux sandbox of your own"


def unfenced(reply: str) -> str:
    return reply.removeprefix("```python\n").removesuffix("```")


def shell_rule(match: str, commands: list[str], *, program: str | None = None) -> dict[str, object]:
    """A shell job's script: ``program`` written to prog.py (if given), each command run, then an answer."""

    def call(name: str, **arguments: object) -> dict[str, object]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    written = [call("sandbox_write_file", path="prog.py", content=program)] if program else []
    return {
        "match": match,
        "system": SHELL_SYSTEM,
        "responses": [
            *written,
            *(call("sandbox_exec", command=c, timeout=90) for c in commands),
            "RESULT: done",
        ],
    }


SHELL_RULES = [
    shell_rule("(?i)chart", ["python3 prog.py"], program=unfenced(PLOT)),
    shell_rule("(?i)too large", ["python3 prog.py"], program=unfenced(OVER_CAP)),
    # the last reply repeats past the script's end: it asks for the same call until max_turns
    {
        "match": "(?i)fail after writing",
        "system": SHELL_SYSTEM,
        "responses": [
            {
                "tool_calls": [
                    {
                        "name": "sandbox_exec",
                        "arguments": {"command": "printf 'region,total\\nEMEA,77689.0\\n' > out/partial.csv"},
                    }
                ]
            }
        ],
    },
    shell_rule("(?i)write then wait", ["echo 'half done' > /workspace/out/partial.csv && sleep 120"]),
]


@dataclass
class ArtifactFleet:
    worker: FleetWorker
    settings: Settings
    model: str
    raw: redis.Redis  # bytes, for tampering with stored artifacts

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.worker.client


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``sandfleet ARGS`` with the fleet's settings only (no inherited SANDFLEET_ variables)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_CLIENT_STATE_DIR": os.environ["SANDFLEET_CLIENT_STATE_DIR"],  # tests/conftest.py
        "SANDFLEET_POLICY_IMAGES": f"sandfleet/sandbox:py3.11,{DATA_SCIENCE_IMAGE}",
    }
    return subprocess.run(
        [SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S * 2
    )


@pytest.fixture(scope="module")
def fleet(
    redis_server: str, docker_engine: Any, module_fleet_worker: WorkerFactory
) -> Iterator[ArtifactFleet]:
    if DATA_SCIENCE_IMAGE not in docker_engine.images:
        pytest.fail(f"{DATA_SCIENCE_IMAGE} is missing: run deploy/bootstrap.sh with SANDFLEET_DATA_SCIENCE=1")
    script = {
        "rules": [
            *SHELL_RULES,  # each needs the shell prompt: a code-action job goes on to the rules below
            {
                "match": "(?i)fail after writing",
                "system": CODE_ACTION_SYSTEM,
                "responses": [FAIL_AFTER_WRITING],
            },
            {"match": "(?i)write then wait", "responses": [WRITE_THEN_WAIT]},
            {"match": "(?i)chart", "responses": [PLOT]},
            {"match": "(?i)too large", "responses": [OVER_CAP]},
            {"match": "(?i)leave a file", "responses": [LEAVE_A_FILE]},
            {"match": "(?i)look for files", "responses": [LOOK_FOR_FILES]},
        ],
        "default": ['```python\nprint("RESULT: 42")\n```'],
    }
    env = {
        "SANDFLEET_POLICY_IMAGES": f"sandfleet/sandbox:py3.11,{DATA_SCIENCE_IMAGE}",
        "SANDFLEET_ARTIFACT_MAX_FILE_BYTES": "16M",
        "SANDFLEET_POOL_SIZE": "1",  # warm sandboxes: one job's files must not reach the next
    }
    worker = module_fleet_worker("artifacts", concurrency=4, sandboxes=2, env=env, script=script)
    raw = redis.Redis.from_url(redis_server)
    try:
        # the script's name relative to the scripts folder (SCRIPT_NAME), as a submitter may give it
        yield ArtifactFleet(worker, worker.settings, "replay:script.json", raw)
    finally:
        raw.close()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (right after the signature)."""
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module", params=MODES)
def plot_job(fleet: ArtifactFleet, request: pytest.FixtureRequest) -> str:
    job = fleet.client.submit(
        "Draw a chart of Q3 revenue per region",
        model=fleet.model,
        mode=request.param,
        sandbox={"image": DATA_SCIENCE_IMAGE},
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    assert result.mode == request.param
    return job.job_id


def test_a_matplotlib_plot_comes_back_as_a_png(fleet: ArtifactFleet, plot_job: str, tmp_path: Path) -> None:
    job = fleet.client.get(plot_job)
    result = job.result(timeout=1)
    if result.mode == "shell":  # made by the model's command in its session sandbox, gone with the job
        assert result.session is not None and result.session.ended == "the job ended"
        assert [c.tool for t in result.turns for c in t.calls] == ["sandbox_write_file", "sandbox_exec"]
    listed = {a.name: a for a in result.artifacts}
    assert sorted(listed) == ["revenue.csv", "revenue.png"] and not result.artifacts_skipped
    png = listed["revenue.png"]
    assert png.media_type == "image/png" and listed["revenue.csv"].media_type == "text/csv"
    data = job.artifact("revenue.png")
    assert data.startswith(PNG_SIGNATURE) and len(data) == png.size > 5000
    assert png_size(data) == (400, 300)  # figsize 4 x 3 inches at 100 dpi
    assert job.artifact("revenue.csv").decode().splitlines()[0] == "North America,108664.0"
    # in the chain: one artifacts event with the digests, before the seal that commits to the record
    events = [e for e in job.audit() if e.kind == "artifacts"]
    assert len(events) == 1 and {f["sha256"] for f in events[0].data["files"]} == {
        a.sha256 for a in result.artifacts
    }
    assert job.verify().verified and job.verify_audit() == (True, None)
    # the command line: list, then write
    listing = cli(fleet.settings, "artifacts", plot_job)
    assert listing.returncode == 0, listing.stderr
    assert f"revenue.png\t{png.size}\timage/png\t{png.sha256}" in listing.stdout
    written = cli(fleet.settings, "artifacts", plot_job, "--out", str(tmp_path / "out"))
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "out" / "revenue.png").read_bytes() == data


def test_the_plot_job_replays_with_the_same_artifacts(fleet: ArtifactFleet, plot_job: str) -> None:
    replayed = cli(fleet.settings, "replay", plot_job, "--json")
    if fleet.client.get(plot_job).result(timeout=1).mode == "shell":  # no program to re-run: verified only
        assert json.loads(replayed.stdout)["state"] == "skipped", replayed.stdout + replayed.stderr
        return
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["state"] == "match"


def test_an_artifact_changed_at_rest_is_refused_everywhere(
    fleet: ArtifactFleet, plot_job: str, tmp_path: Path
) -> None:
    job = fleet.client.get(plot_job)
    png = next(a for a in job.artifacts() if a.name == "revenue.png")
    key = fleet.client.keys.artifact(plot_job, png.sha256)
    original = fleet.raw.get(key)
    assert original is not None
    forged = original[:-16] + bytes(16)  # same size, the end rewritten
    fleet.raw.set(key, forged, keepttl=True)
    try:
        verified = cli(fleet.settings, "audit", plot_job, "--verify")
        assert verified.returncode == 1
        assert (
            "artifact 'revenue.png': its stored bytes are not the ones the chain commits to"
            in verified.stderr
        )
        replayed = cli(fleet.settings, "replay", plot_job)
        assert replayed.returncode == 1 and replayed.stdout.startswith("unverified"), replayed.stdout
        fetched = cli(fleet.settings, "artifacts", plot_job, "--out", str(tmp_path / "forged"))
        assert fetched.returncode == 4 and "not the ones the chain commits to" in fetched.stderr
        assert not (tmp_path / "forged" / "revenue.png").exists()  # nothing written, not even the CSV
        assert not (tmp_path / "forged" / "revenue.csv").exists()
        with pytest.raises(ArtifactIntegrityError):
            job.artifact("revenue.png")
        fleet.raw.delete(key)
        assert any("stored bytes are missing" in p for p in job.verify().problems)
    finally:
        fleet.raw.set(key, original, ex=fleet.settings.retention_s)
    assert job.verify().verified


@pytest.mark.parametrize("mode", MODES)
def test_a_file_over_the_jobs_cap_is_skipped_and_named_in_limits_hit(fleet: ArtifactFleet, mode: str) -> None:
    job = fleet.client.submit(
        "Write a file too large", model=fleet.model, mode=mode, artifacts={"max_file_bytes": 1000}
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED and result.limits_hit == ["artifacts"]
    assert [a.name for a in result.artifacts] == ["small.txt"] and job.artifact("small.txt") == b"small"
    [skipped] = result.artifacts_skipped
    assert (skipped.name, skipped.size) == ("large.bin", 5000)
    assert skipped.reason == "larger than the cap of 1000 bytes per file"
    if mode == "code-action":
        assert "artifacts" in result.attempts[-1].limits_hit
    [event] = [e for e in job.audit() if e.kind == "artifacts"]
    assert [f["name"] for f in event.data["files"]] == ["small.txt"]
    assert [f["name"] for f in event.data["skipped"]] == ["large.bin"]
    assert job.verify().verified


@pytest.mark.parametrize("mode", MODES)
def test_a_job_asking_above_the_operators_cap_is_refused(fleet: ArtifactFleet, mode: str) -> None:
    job = fleet.client.submit("Anything", model=fleet.model, mode=mode, artifacts={"max_file_bytes": 1024**3})
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.REFUSED and result.error is not None
    assert "artifacts.max_file_bytes 1073741824 is above the operator's ceiling" in result.error.message
    assert "SANDFLEET_ARTIFACT_MAX_FILE_BYTES" in result.error.message
    kinds = [e.kind for e in job.audit()]
    assert "model_call" not in kinds and "session" not in kinds  # refused before the model or a sandbox


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_job_keeps_the_files_it_wrote(fleet: ArtifactFleet, mode: str) -> None:
    job = fleet.client.submit(
        "Fail after writing part of the answer",
        model=fleet.model,
        mode=mode,
        code_action={"max_repairs": 0},
        tool_loop={"max_turns": 2},
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.FAILED and result.error is not None, result
    assert [a.name for a in result.artifacts] == ["partial.csv"]
    assert job.artifact("partial.csv") == b"region,total\nEMEA,77689.0\n"
    [event] = [e for e in job.audit() if e.kind == "artifacts"]
    assert [f["sha256"] for f in event.data["files"]] == [result.artifacts[0].sha256]
    assert job.verify_audit() == (True, None)


def sandboxes_holding(fleet: ArtifactFleet, path: str) -> list[str]:
    """The worker's containers (by their owner label) in which ``path`` is a non-empty file (docker exec)."""
    prefix = f"{os.uname().nodename}:{fleet.worker.worker.process.pid}:"
    shown = '{{.ID}} {{.Label "sandfleet.owner"}}'
    listed = subprocess.run(
        ["docker", "ps", "--no-trunc", "--filter", "label=sandfleet.owner", "--format", shown],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.splitlines()
    ids = [line.split()[0] for line in listed if line.strip() and line.split()[-1].startswith(prefix)]
    test = ["test", "-s", path]
    return [
        c for c in ids if subprocess.run(["docker", "exec", c, *test], capture_output=True).returncode == 0
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_job_keeps_no_files(fleet: ArtifactFleet, mode: str) -> None:
    """The cancel destroys the job's sandbox at once, the files in it with it: in both modes the record
    lists none, the chain has no artifacts event, and nothing is stored."""
    job = fleet.client.submit("Write then wait for a while", model=fleet.model, mode=mode)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not sandboxes_holding(
        fleet, "/workspace/out/partial.csv"
    ):  # the file is written, not yet collected
        assert time.monotonic() < deadline, f"the job's file never appeared: {job.status()}"
        time.sleep(0.2)
    assert job.cancel().status == "running"
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.CANCELLED and result.artifacts == [] and result.artifacts_skipped == []
    kinds = [e.kind for e in job.audit()]
    assert "cancel" in kinds and "artifacts" not in kinds
    assert not fleet.raw.keys(fleet.client.keys.artifact(job.job_id, "*"))
    assert job.verify_audit() == (True, None)


def test_a_warm_sandbox_never_shows_one_jobs_files_to_the_next(fleet: ArtifactFleet) -> None:
    first = fleet.client.submit("Leave a file behind", model=fleet.model).result(timeout=JOB_TIMEOUT_S)
    assert [a.name for a in first.artifacts] == ["mine.txt"]
    for _ in range(3):  # each job takes a (warm) sandbox made before it: none was used before
        later = fleet.client.submit("Look for files", model=fleet.model).result(timeout=JOB_TIMEOUT_S)
        assert later.status == JobStatus.SUCCEEDED and later.result == [] and later.artifacts == []
        assert later.attempts[-1].container_id != first.attempts[-1].container_id


def test_batch_out_folder_receives_every_jobs_artifacts(fleet: ArtifactFleet, tmp_path: Path) -> None:
    rows = [
        {"question": "Draw a chart for EMEA", "model": fleet.model, "sandbox": {"image": DATA_SCIENCE_IMAGE}},
        {"question": "Draw a chart for APAC", "model": fleet.model, "sandbox": {"image": DATA_SCIENCE_IMAGE}},
        {"question": "No files here", "model": fleet.model},
    ]
    batch_file = tmp_path / "batch.jsonl"
    batch_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "batch-out"
    done = cli(fleet.settings, "batch", str(batch_file), "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in results] == ["succeeded"] * 3 and all(r["verified"] for r in results)
    for row in results[:2]:
        png = (out / row["job_id"] / "revenue.png").read_bytes()
        assert png.startswith(PNG_SIGNATURE) and len(png) == next(
            a["size"] for a in row["artifacts"] if a["name"] == "revenue.png"
        )
    assert not (out / results[2]["job_id"]).exists()
    assert "4 artifact file(s) written" in done.stderr
