"""Shell and chat jobs end to end: a real ``sandfleet worker`` process on a real Redis, the replay model
over HTTP through the real openai client, submitted with the Client and read back from the records,
the audit chain and ``sandfleet jobs``."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sandfleet.core.contracts import AuditKind, JobStatus
from sandfleet.core.webhook_signing import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify_signature,
)
from sandfleet.fleet.demo import REFERENCE_CHAT_TOTALS, demo_replay_script
from sandfleet.producer.client import Client
from sandfleet.worker.tools.examples.scenario import (
    REFERENCE_ANSWER,
    REFERENCE_QUESTION,
    generate_orders,
)

from .helpers import JOB_TIMEOUT_S, ORDERS, SANDFLEET, FleetWorker, WorkerFactory

pytestmark = [pytest.mark.slow]
COMPUTE = """\
import csv, json
from collections import defaultdict
totals = defaultdict(float)
for row in csv.DictReader(open("orders.csv")):
    if "2026-07-01" <= row["date"] <= "2026-09-30":
        totals[row["region"]] += int(row["quantity"]) * float(row["unit_price"])
print(json.dumps(dict(sorted(totals.items(), key=lambda kv: -kv[1]))))
"""


def orders_csv() -> str:
    out = io.StringIO()
    rows = generate_orders()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def shell_rule() -> dict[str, Any]:
    """A shell job's script: the data into the sandbox, a program computing the totals, run, answer."""

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    return {
        "match": "(?i)revenue per region in Q3 2026",
        "system": "Linux sandbox of your own",
        "responses": [
            call("sandbox_write_file", path="data/orders.csv", content=orders_csv()),
            call("sandbox_write_file", path="data/q3.py", content=COMPUTE),
            call("sandbox_exec", command="cd data && python3 q3.py"),
            f"RESULT: {json.dumps(REFERENCE_ANSWER)}",
        ],
    }


WEBHOOK_SECRET = "modes-webhook-secret"


class Receiver:
    """A real HTTP server on 127.0.0.1 keeping each POST's path, headers and body."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        posts, lock = self.posts, threading.Lock()
        self._lock = lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    posts.append((self.path, dict(self.headers), body))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, name="webhooks", daemon=True).start()

    def post_to(self, path: str, timeout_s: float = 30.0) -> tuple[dict[str, str], bytes]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                found = [(headers, body) for where, headers, body in self.posts if where == path]
            if found:
                assert len(found) == 1, f"{len(found)} POSTs to {path}"
                return found[0]
            time.sleep(0.1)
        pytest.fail(f"no webhook POST to {path} within {timeout_s:g} s")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class ModesFleet:
    worker: FleetWorker
    model: str  # replay:FILE, the script the worker's replay model answers from
    receiver: Receiver

    @property
    def client(self) -> Client:
        return self.worker.client


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory) -> Iterator[ModesFleet]:
    script = demo_replay_script()
    script["rules"].insert(0, shell_rule())
    receiver = Receiver()
    env = {"SANDFLEET_WEBHOOK_SECRET": WEBHOOK_SECRET, "SANDFLEET_POLICY_WEBHOOK_HOSTS": "127.0.0.1"}
    try:
        worker = module_fleet_worker("modes", tools=ORDERS, env=env, script=script)
        yield ModesFleet(worker, worker.model, receiver)
    finally:
        receiver.close()


def submit(fleet: ModesFleet, mode: str, **more: Any) -> Any:
    return fleet.client.submit(
        REFERENCE_QUESTION, tools=["load_orders"], model=fleet.model, mode=mode, **more
    )


def test_a_chat_job_through_the_fleet(fleet: ModesFleet) -> None:
    job = submit(fleet, "chat")
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    assert result.mode == "chat" and job.record().spec.mode == "chat"
    assert result.result == REFERENCE_CHAT_TOTALS  # what the scripted chat agent answered
    assert result.usage.model_calls == 2 and result.tool_calls == 1 and not result.attempts
    (call,) = result.turns[0].calls
    assert call.tool == "load_orders" and call.ok and call.result_size > 40_000
    events = job.audit()
    kinds = [e.kind for e in events]
    assert kinds[:2] == [AuditKind.STATE, AuditKind.STATE]  # queued, running
    assert kinds[2:6] == [
        AuditKind.MODEL_CALL,
        AuditKind.FUNCTION_CALL,
        AuditKind.FUNCTION_RESULT,
        AuditKind.MODEL_CALL,
    ]
    result_event = next(e for e in events if e.kind == AuditKind.FUNCTION_RESULT)
    assert result_event.data["tool"] == "load_orders" and len(json.loads(result_event.data["shown"])) == 500
    assert job.verify_audit() == (True, None)


def test_a_shell_job_through_the_fleet(fleet: ModesFleet) -> None:
    job = submit(fleet, "shell")
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    assert result.mode == "shell" and result.result == REFERENCE_ANSWER
    exec_result = next(
        e for e in job.audit() if e.kind == AuditKind.FUNCTION_RESULT and e.data["tool"] == "sandbox_exec"
    )
    assert (
        json.loads(json.loads(exec_result.data["shown"])["stdout"]) == REFERENCE_ANSWER
    )  # computed in there
    sessions = [e.data for e in job.audit() if e.kind == AuditKind.SESSION]
    assert [s["event"] for s in sessions] == ["started", "destroyed"]
    assert result.session is not None and result.session.ended == "the job ended"
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandfleet.job={job.job_id}"],
        capture_output=True,
        text=True,
    )
    assert left.stdout.strip() == ""  # the session sandbox went with its job
    assert job.verify_audit() == (True, None)


def test_sandfleet_jobs_shows_each_jobs_mode(fleet: ModesFleet) -> None:
    job = submit(fleet, "code-action")
    others = [submit(fleet, "chat"), submit(fleet, "shell")]  # so the listing holds each mode
    assert job.result(timeout=JOB_TIMEOUT_S).result == REFERENCE_ANSWER  # the script's program, sandboxed
    assert all(other.result(timeout=JOB_TIMEOUT_S).status == JobStatus.SUCCEEDED for other in others)
    settings = fleet.worker.settings
    env = {
        **os.environ,
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
    }
    done = subprocess.run([SANDFLEET, "jobs", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    modes = {line["job_id"]: line["mode"] for line in map(json.loads, done.stdout.splitlines())}
    assert modes[job.job_id] == "code-action" and {"chat", "shell"} <= set(modes.values())
    table = subprocess.run([SANDFLEET, "jobs"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert f"{job.job_id}  succeeded  code-action" in table


def test_a_bad_mode_is_refused_before_anything_is_enqueued(fleet: ModesFleet) -> None:
    from sandfleet.core.errors import InvalidSpecError

    before = fleet.client.jobs(limit=1000)
    with pytest.raises(InvalidSpecError, match="mode: Input should be 'code-action', 'shell' or 'chat'"):
        fleet.client.submit("q", mode="agent")
    assert len(fleet.client.jobs(limit=1000)) == len(before)


@pytest.mark.parametrize("mode", ["code-action", "shell", "chat"])
def test_a_completion_webhook_in_every_mode(fleet: ModesFleet, mode: str) -> None:
    """One signed POST per job whatever its mode, its body the job's own outcome, committed in the chain."""
    job = submit(fleet, mode, webhook=f"{fleet.receiver.url}/{mode}")
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    headers, body = fleet.receiver.post_to(f"/{mode}")
    verify_signature(
        WEBHOOK_SECRET, headers[SIGNATURE_HEADER], headers[TIMESTAMP_HEADER], body, now=time.time()
    )
    sent = json.loads(body)
    assert headers[DELIVERY_HEADER] == job.job_id and sent["job_id"] == job.job_id
    assert sent["status"] == "succeeded" and sent["result"] == result.result
    committed = {e.data["body_sha256"] for e in job.audit() if e.kind == AuditKind.WEBHOOK}
    assert hashlib.sha256(body).hexdigest() in committed
    assert job.verify_audit() == (True, None)
