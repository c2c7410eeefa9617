"""A submitter's ``--model replay:FILE`` against a real ``sandfleet worker``, typed as a submitter types it.

Attacks (issue 22, row 2): a worker-host file by absolute path (``/etc/shadow``), ``..``, a link in the
scripts folder pointing out, a malformed file whose parser error would quote it, existence probing
(missing and forbidden must read the same), and many ``?latency=`` values to grow the worker's threads
and ports. Each is refused by the mechanism named in sandfleet/worker/llm/scripted/access.py (a regular file inside
SANDFLEET_REPLAY_SCRIPTS_DIR, walked with O_NOFOLLOW, one message for every name that does not reach
one) or sandfleet/worker/llm/scripted/registry.py (one server per script, the latency per request). Accepted: a
script inside the folder, and ``sandfleet ask`` naming any file (its user is the operator).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sandfleet_testing.workers import SANDFLEET, FleetWorker, WorkerFactory

JOB_TIMEOUT_S = 90.0
SECRET = "SECRET-MARKER-d41c8e"
NOT_IN_FOLDER = (
    "no replay script of that name in this worker's SANDFLEET_REPLAY_SCRIPTS_DIR (a job's replay:FILE "
    "names a regular file inside that folder, relative to it; links and '..' are refused)"
)
NOT_VALID = "the file is not a valid replay script (the worker's log says why)"
SIX_TIMES_SEVEN = {"default": ["```python\nprint('RESULT: ' + str(6 * 7))\n```"]}


@dataclass
class ReplayFleet:
    worker: FleetWorker
    outside: Path  # a folder beside the scripts folder, holding the secret

    @property
    def scripts(self) -> Path:
        return self.worker.scripts_dir


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory) -> ReplayFleet:
    folder = tmp_path_factory.mktemp("replay-model")
    outside = folder / "outside"
    outside.mkdir()
    # Invalid YAML: the parser's error quotes the line, which a worker used to put in the job's error.
    (outside / "secret.yaml").write_text(f"password: {SECRET}\n{SECRET}: [unclosed\n")
    (outside / "six.json").write_text(json.dumps(SIX_TIMES_SEVEN))  # a valid script, out of reach
    worker = module_fleet_worker("replay-model", sandboxes=1, concurrency=2)
    scripts = worker.scripts_dir
    (scripts / "six.json").write_text(json.dumps(SIX_TIMES_SEVEN))
    (scripts / "answer.json").write_text(json.dumps({"default": ["RESULT: 42"]}))
    (scripts / "broken.yaml").write_text(f"{SECRET}: [unclosed\n")
    (scripts / "link.yaml").symlink_to(outside / "secret.yaml")
    (scripts / "link-six.json").symlink_to(outside / "six.json")
    return ReplayFleet(worker, outside)


def submit(fleet: ReplayFleet, model: str | None) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``sandfleet submit --wait --json [--model MODEL] QUESTION`` with the fleet's settings only."""
    settings = fleet.worker.settings
    more = ["--model", model] if model is not None else []
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
    }
    done = subprocess.run(
        [SANDFLEET, "submit", "--wait", "--json", "--timeout", str(JOB_TIMEOUT_S), *more, "What is six times seven?"],
        env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S + 30,
    )  # fmt: skip
    assert done.stdout, done.stderr
    return done, json.loads(done.stdout)


def stored(fleet: ReplayFleet, job_id: str) -> str:
    """Everything Redis holds for the fleet that names the job (record, audit stream, ...), as text."""
    settings = fleet.worker.settings
    r = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        parts = []
        for key in r.scan_iter(match=f"{settings.key_prefix}*{job_id}*", count=1000):
            kind = r.type(key)
            value: Any = {
                "string": lambda k: r.get(k),
                "hash": lambda k: r.hgetall(k),
                "list": lambda k: r.lrange(k, 0, -1),
                "set": lambda k: sorted(r.smembers(k)),
                "zset": lambda k: r.zrange(k, 0, -1),
                "stream": lambda k: r.xrange(k),
            }[kind](key)
            parts.append(f"{key}: {value}")
        assert parts, f"nothing stored for {job_id}"
        return "\n".join(parts)
    finally:
        r.close()


def refused_with(fleet: ReplayFleet, model: str) -> str:
    """Submit ``model``; assert the job was refused; return its error message with the name masked."""
    done, result = submit(fleet, model)
    assert done.returncode == 1 and result["status"] == "refused", result
    assert result["error"]["kind"] == "refused"
    message: str = result["error"]["message"]
    assert SECRET not in done.stdout + done.stderr and SECRET not in stored(fleet, result["job_id"])
    return message.replace(repr(model), "MODEL")


def test_a_worker_host_file_by_absolute_path_is_refused_unread(fleet: ReplayFleet) -> None:
    """Before: the YAML parser's error, quoting /etc/shadow, became the job's error."""
    message = refused_with(fleet, "replay:/etc/shadow")
    assert message == f"model MODEL: {NOT_IN_FOLDER}"
    assert "root:" not in message


@pytest.mark.parametrize(
    "name",
    [
        "outside/secret.yaml",  # relative to the fleet folder, not to the scripts folder
        "../outside/secret.yaml",  # .. from the scripts folder
        "../../outside/secret.yaml",
        "link.yaml",  # a link inside the folder, to the secret outside
        "link-six.json",  # a link to a valid script outside: it would succeed if links were followed
    ],
)
def test_names_that_leave_the_folder_are_refused_like_a_missing_file(fleet: ReplayFleet, name: str) -> None:
    outside_name = refused_with(fleet, f"replay:{name}")
    missing = refused_with(fleet, "replay:no-such-script.json")
    assert outside_name == missing == f"model MODEL: {NOT_IN_FOLDER}"


def test_existence_outside_the_folder_is_not_answered(fleet: ReplayFleet) -> None:
    """An existing file, a valid script, and a path that does not exist, all outside: one message."""
    messages = {
        refused_with(fleet, f"replay:{fleet.outside / 'secret.yaml'}"),
        refused_with(fleet, f"replay:{fleet.outside / 'six.json'}"),
        refused_with(fleet, f"replay:{fleet.outside / 'absent.yaml'}"),
        refused_with(fleet, "replay:/nonexistent-dir/x.yaml"),
        refused_with(fleet, f"replay:{fleet.scripts}/../outside/six.json"),
    }
    assert messages == {f"model MODEL: {NOT_IN_FOLDER}"}


def test_a_malformed_file_in_the_folder_is_refused_without_its_content(fleet: ReplayFleet) -> None:
    for model in ("replay:broken.yaml", f"replay:{fleet.scripts / 'broken.yaml'}"):
        assert refused_with(fleet, model) == f"model MODEL: {NOT_VALID}"
    # The operator's log says which file and why; the parser's words stay there.
    log = fleet.worker.log()
    assert str(fleet.scripts / "broken.yaml") in log and "is not valid" in log


def test_a_script_inside_the_folder_answers(fleet: ReplayFleet) -> None:
    for model in ("replay:six.json", f"replay:{fleet.scripts / 'six.json'}?latency=0.05"):
        done, result = submit(fleet, model)
        assert done.returncode == 0 and result["status"] == "succeeded", result
        assert result["result"] == 42 and result["model"] == model


def test_distinct_latencies_grow_neither_threads_nor_ports(fleet: ReplayFleet) -> None:
    """Before: every distinct ``?latency=`` started a replay server, a thread and a port each."""
    client = fleet.worker.client
    pid = fleet.worker.process.pid

    def chat(latency: str) -> None:
        model = f"replay:{fleet.scripts / 'answer.json'}?latency={latency}"
        job = client.submit("What is the answer?", mode="chat", model=model)
        result = job.result(timeout=JOB_TIMEOUT_S)
        assert result.status.value == "succeeded" and result.result == 42, result.error

    for _ in range(3):  # warm: the server, its connection, the worker's pool threads
        chat("0")
    threads, ports = thread_count(pid), listening_ports(pid)
    for i in range(1, 21):
        chat(f"0.00{i:02d}")
    assert listening_ports(pid) == ports
    assert thread_count(pid) <= threads + 2  # slack for the worker's own threads; it was +2 a job


def test_a_workers_broken_default_script_is_not_quoted_to_its_jobs(
    fleet: ReplayFleet, fleet_worker: WorkerFactory
) -> None:
    """The operator's SANDFLEET_MODEL may name any file, but its parser's words are the operator's."""
    env = {"SANDFLEET_MODEL": f"replay:{fleet.outside / 'secret.yaml'}"}
    worker = fleet_worker("fleet", sandboxes=1, concurrency=1, env=env)
    broken = ReplayFleet(worker, fleet.outside)
    done, result = submit(broken, None)
    assert done.returncode == 1 and result["status"] == "refused", result
    message = "this worker's default model (SANDFLEET_MODEL) is unusable; the worker's log says why"
    assert result["error"]["message"] == message
    assert SECRET not in done.stdout + done.stderr and SECRET not in stored(broken, result["job_id"])
    assert SECRET in worker.log()  # the operator reads why


def test_sandfleet_ask_names_any_file_its_user_can_read(fleet: ReplayFleet, tmp_path: Path) -> None:
    """``ask`` runs one job in its own process for its own user: the folder rule is a worker's."""
    script = tmp_path / "any.json"  # outside every scripts folder
    script.write_text(json.dumps(SIX_TIMES_SEVEN))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REPLAY_SCRIPTS_DIR": str(fleet.scripts),  # set, and the file is not in it
    }
    done = subprocess.run(
        [SANDFLEET, "ask", "What is six times seven?", "--tools", "", "--model", f"replay:{script}"],
        env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"


# ---- what the worker process holds -----------------------------------------------------------------


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on: its socket inodes matched against its net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
