"""The answer belongs to the question: rewritten queued jobs and foreign jobs in a batch, tried for real
against a ``sandfleet worker`` (Docker sandboxes, the replay model over HTTP), with the ``sandfleet``
commands run as separate processes, as a user types them.

Row 9 of issue 22 (whoever can write Redis): before any worker takes them, the test rewrites queued
jobs' specs and their entry 0 (unsigned: every link still holds), then starts the worker. The worker
answers the other question and signs it; a reader with no record of what was submitted is served that
answer, proven by the chain. Every reader that submitted the job refuses it, naming the mismatch: the
handles (``JobHandle.result``, ``BatchHandle.results``), ``sandfleet submit --wait`` (waiting in its own
process while the job was rewritten), ``sandfleet result JOB`` in a later process (the digest comes
from the user's ledger) and ``sandfleet batch --out`` (the row is written unverified, without the
other answer). The honest jobs beside them are served as usual.

Row 11 (any submitter): a second submitter (a state folder, so a token, of its own) names the first's
batch on its jobs, from Python and from the commands, while that batch runs: refused, nothing
enqueued, the batch's jobs, verification and its one webhook unchanged. And a job written straight
into a batch (as an older producer or a Redis writer would, without the creator's digest) is not one
of its jobs, and never fires nor wins the batch webhook although it ends last.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from sandfleet_testing.workers import SANDFLEET, WorkerFactory, fleet_settings_for, keys_under

from sandfleet.core.chain import GENESIS_HASH, encode_event, link_hash, spec_commitment
from sandfleet.core.contracts import AuditEvent, JobSpec, JobStatus
from sandfleet.core.errors import BatchOwnerError, SpecMismatchError
from sandfleet.core.priority import priority_lists, queue_length
from sandfleet.core.queue import queue_name
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.verify import verify_job
from sandfleet.producer.client import BatchHandle, Client, JobHandle

from .helpers import record

pytestmark = [pytest.mark.timeout(600)]

JOB_TIMEOUT_S = 240.0
ASKED = "What is six times seven?"
OTHER = "Answer the other question"
WEBHOOK_SECRET = "answer-belongs-webhook-secret"
SCRIPT = {
    "rules": [
        {"match": "(?i)other question", "responses": ["```python\nprint('RESULT: 666')\n```"]},
        {"match": "(?i)wait ten", "latency": 10, "responses": ["```python\nprint('RESULT: 10')\n```"]},
        {"match": "(?i)wait six", "latency": 6, "responses": ["```python\nprint('RESULT: 6')\n```"]},
        {"match": "(?i)wait three", "latency": 3, "responses": ["```python\nprint('RESULT: 3')\n```"]},
    ],
    "default": ["```python\nprint('RESULT: ' + str(6 * 7))\n```"],
}


@dataclass
class Attacked:
    settings: Settings
    client: Client  # the victim's, in this process
    env: dict[str, str]  # for `sandfleet` commands of the victim
    folder: Path
    receiver: Any
    worker: Any
    handle: JobHandle
    batch: BatchHandle
    cli_job: str  # submitted by `sandfleet submit`, read later by `sandfleet result`
    wait_job: str
    wait_done: subprocess.CompletedProcess[str]
    batch_rows: list[str]  # job ids of `sandfleet batch --out`, in row order
    batch_done: subprocess.CompletedProcess[str]
    batch_out: Path
    rewritten: set[str] = field(default_factory=set)

    @property
    def keys(self) -> FleetKeys:
        return self.client.keys

    @property
    def redis(self) -> redis.Redis:
        return self.client.redis

    def sandfleet(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDFLEET, *args], env={**self.env, **env}, capture_output=True, text=True, timeout=120
        )


def command_env(settings: Settings) -> dict[str, str]:
    """A user's environment: the fleet's Redis and prefix, the session's client state folder only."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_CLIENT_STATE_DIR": settings.client_state_dir,
    }


def rewrite_message(r: redis.Redis, queue: str, job_id: str, spec: JobSpec) -> None:
    """Put ``spec`` in the job's task message, where it waits in the broker's lists (the same Redis;
    a command in another process publishes it just after writing the record: waited for)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for key in priority_lists(queue):
            for index, raw in enumerate(r.lrange(key, 0, -1)):
                message = json.loads(raw)
                args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
                if args[0] == job_id:
                    args[1] = spec.model_dump(mode="json")
                    message["body"] = base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()
                    r.lset(key, index, json.dumps(message))
                    return
        time.sleep(0.05)
    pytest.fail(f"no message of job {job_id} in the broker's lists")


def rewrite_queued_spec(r: redis.Redis, settings: Settings, job_id: str, question: str) -> None:
    """The Redis writer's attack: another question in the queued job's record and in its task message,
    and an entry 0 committing to it (entry 0 is the producer's, unsigned; its link and the record's
    tip are recomputed)."""
    keys = FleetKeys(settings.key_prefix)
    assert r.hget(keys.job(job_id), "status") == JobStatus.QUEUED.value, "the worker took it first"
    spec = JobSpec.model_validate_json(r.hget(keys.job(job_id), "spec")).model_copy(
        update={"question": question}
    )
    rewrite_message(r, queue_name(settings), job_id, spec)
    spec_json, digest = spec_commitment(spec)
    [(_entry_id, fields)] = r.xrange(keys.audit(job_id))
    event = AuditEvent.model_validate_json(fields["event"])
    forged = encode_event(event.model_copy(update={"data": {**event.data, "spec_sha256": digest}}))
    head = link_hash(GENESIS_HASH, forged)
    pipe = r.pipeline(transaction=True)
    pipe.delete(keys.audit(job_id))
    pipe.xadd(keys.audit(job_id), {"event": forged, "hash": head, "sig": "", "key": ""})
    pipe.hset(keys.job(job_id), mapping={"spec": spec_json, "audit_head": head})
    pipe.execute()


def new_job_ids(r: redis.Redis, keys: FleetKeys, known: set[str], count: int) -> list[str]:
    """The ``count`` job ids a command in another process just submitted."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [j for j in r.zrange(keys.all_jobs, 0, -1) if j not in known]
        if len(found) >= count:
            known.update(found)
            return found
        time.sleep(0.05)
    pytest.fail(f"the command did not submit {count} job(s) within 60 s")


@pytest.fixture(scope="module")
def attacked(
    redis_server: str, module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Attacked]:
    from outcomes.webhook_receiver import Receiver

    folder = tmp_path_factory.mktemp("answer-belongs")
    scripts = folder / "scripts"
    scripts.mkdir()
    (scripts / "script.json").write_text(json.dumps(SCRIPT))
    settings = fleet_settings_for(
        redis_server, worker_state_dir=str(folder / "worker-state"), client_state_dir=str(folder / "victim")
    )
    env = command_env(settings)
    receiver = Receiver(redis_server, settings.key_prefix)
    client = Client(settings=settings)
    r, keys = client.redis, client.keys
    started: list[subprocess.Popen[str]] = []
    try:
        # The victim submits, in this process and from the command line; no worker runs yet.
        handle = client.submit(ASKED)
        batch = client.submit_batch([ASKED, f"{ASKED} (again)", f"{ASKED} (once more)"])
        known = {handle.job_id, *batch.job_ids}
        submitted = subprocess.run(
            [SANDFLEET, "submit", ASKED], env=env, capture_output=True, text=True, timeout=60
        )
        assert submitted.returncode == 0, submitted.stderr
        cli_job = submitted.stdout.strip()
        known.add(cli_job)
        waiting = subprocess.Popen(
            [SANDFLEET, "submit", ASKED, "--wait", "--timeout", str(JOB_TIMEOUT_S)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(waiting)
        [wait_job] = new_job_ids(r, keys, known, 1)
        rows = folder / "rows.jsonl"
        rows.write_text(
            json.dumps({"question": ASKED}) + "\n" + json.dumps({"question": f"{ASKED} (row 2)"}) + "\n"
        )
        batch_out = folder / "results.jsonl"
        batching = subprocess.Popen(
            [SANDFLEET, "batch", str(rows), "--out", str(batch_out), "--timeout", str(JOB_TIMEOUT_S)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(batching)
        cli_batch = r.hget(keys.job(new_job_ids(r, keys, known, 2)[0]), "batch_id")
        batch_rows = r.lrange(keys.batch_jobs(cli_batch), 0, -1)  # in row order

        # The attack: while they are queued, five of the jobs are made to ask another question.
        rewritten = {handle.job_id, batch.job_ids[1], cli_job, wait_job, batch_rows[0]}
        for job_id in rewritten:
            rewrite_queued_spec(r, settings, job_id, OTHER)

        worker = module_fleet_worker(
            "answer-belongs",
            settings=settings,
            folder=folder,
            concurrency=8,
            env={
                "SANDFLEET_MODEL": f"replay:{scripts / 'script.json'}",
                "SANDFLEET_REPLAY_SCRIPTS_DIR": str(scripts),
                "SANDFLEET_WEBHOOK_SECRET": WEBHOOK_SECRET,
                "SANDFLEET_POLICY_WEBHOOK_HOSTS": "127.0.0.1",
            },
        )
        out, err = waiting.communicate(timeout=JOB_TIMEOUT_S + 30)
        wait_done = subprocess.CompletedProcess(waiting.args, waiting.returncode, out, err)
        out, err = batching.communicate(timeout=JOB_TIMEOUT_S + 30)
        batch_done = subprocess.CompletedProcess(batching.args, batching.returncode, out, err)
        for job_id in known:
            client.get(job_id).result(timeout=JOB_TIMEOUT_S, verify=False)
        yield Attacked(
            settings, client, env, folder, receiver, worker, handle, batch, cli_job, wait_job, wait_done,
            batch_rows, batch_done, batch_out, rewritten,
        )  # fmt: skip
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
        receiver.close()
        # The jobs were queued before the worker started (or without one, when that failed): their
        # keys go here; the worker's own, with it (module_fleet_worker).
        if leftovers := keys_under(r, settings.key_prefix):
            r.delete(*leftovers)
        client.close()


@pytest.fixture
def stranger(attacked: Attacked, tmp_path: Path) -> Iterator[Client]:
    """Another submitter of the same fleet: a state folder, and so a submitter token, of its own."""
    with Client(
        settings=attacked.settings.model_copy(update={"client_state_dir": str(tmp_path / "stranger")})
    ) as c:
        yield c


# -- row 9: a queued job's spec and entry 0 rewritten ---------------------------------------------
def test_the_worker_answered_the_other_question_and_its_chain_holds(
    attacked: Attacked, stranger: Client
) -> None:
    """The attack is real: the chain alone proves the other answer (a reader that did not submit the
    job is served it); only the digest the submitter kept can tell."""
    ring = attacked.client.key_ring()
    for job_id in attacked.rewritten:
        evidence = attacked.client.reader.evidence(job_id)
        assert verify_job(evidence, ring).verified, job_id
        served = stranger.get(job_id).result()
        assert served.status == JobStatus.SUCCEEDED and served.result == 666
        assert stranger.get(job_id).record().spec.question == OTHER


def test_the_submitting_handles_refuse_the_other_answer(attacked: Attacked) -> None:
    with pytest.raises(
        SpecMismatchError, match=f"job {attacked.handle.job_id}: the record answers a different"
    ):
        attacked.handle.result(timeout=10)
    with pytest.raises(SpecMismatchError, match=attacked.batch.job_ids[1]):
        attacked.batch.results()
    checked = attacked.batch.checked_results()
    assert [c.verified for c in checked] == [True, False, True]
    assert [c.result.result for c in checked if c.result is not None] == [42, 42]
    assert checked[1].other_question and checked[1].result is None
    again = attacked.client.batch(attacked.batch.batch_id)  # a new handle: digests from the ledger
    with pytest.raises(SpecMismatchError):
        again.results()
    record(
        "answer: rewritten queued spec, Python handles", "redis", True, str(checked[1].verdict.problems[0])
    )


def shows_the_other_answer(text: str) -> bool:
    """Whether ``text`` holds the answer to the other question (666) as a value, not as three digits
    inside a hex digest (a record's hashes contain "666" by chance, one in about 70)."""
    return re.search(r"(?<![0-9a-f])666(?![0-9a-f])", text) is not None


def test_sandfleet_result_in_a_later_process_refuses_it(attacked: Attacked) -> None:
    shown = attacked.sandfleet("result", attacked.cli_job)
    assert shown.returncode == 4 and shown.stdout == "", shown.stderr
    assert (
        "answers a different question than the one submitted" in shown.stderr
        and not shows_the_other_answer(shown.stderr)
    )
    as_json = attacked.sandfleet("result", attacked.cli_job, "--json")
    data = json.loads(as_json.stdout)
    assert (
        as_json.returncode == 4 and data["verified"] is False and not shows_the_other_answer(as_json.stdout)
    )
    assert any("answers a different question" in p for p in data["problems"])
    audited = attacked.sandfleet("audit", attacked.cli_job, "--verify")
    assert audited.returncode == 1 and "answers a different question" in audited.stderr
    honest = attacked.sandfleet("result", attacked.batch.job_ids[0])
    assert (honest.returncode, honest.stdout) == (0, "42\n")
    # Another user (no ledger entry for the job) cannot tell: it is served what the chain proves.
    elsewhere = attacked.sandfleet(
        "result", attacked.cli_job, SANDFLEET_CLIENT_STATE_DIR=str(attacked.folder / "elsewhere")
    )
    assert (elsewhere.returncode, elsewhere.stdout) == (0, "666\n")
    record("answer: rewritten queued spec, sandfleet result", "redis", True, shown.stderr.strip()[:300])


def test_submit_wait_refuses_the_other_answer(attacked: Attacked) -> None:
    done = attacked.wait_done
    assert done.returncode == 4, done.stderr
    assert done.stdout == "" and not shows_the_other_answer(done.stderr)
    assert f"job {attacked.wait_job}: the record answers a different question" in done.stderr
    record("answer: rewritten queued spec, submit --wait", "redis", True, done.stderr.strip()[:300])


def test_batch_out_never_prints_the_question_beside_the_other_answer(attacked: Attacked) -> None:
    done = attacked.batch_done
    assert done.returncode == 4, done.stderr
    assert "1 result(s) answer a different question than the one submitted (not shown)" in done.stderr
    rows = [json.loads(line) for line in attacked.batch_out.read_text().splitlines()]
    assert [row["job_id"] for row in rows] == attacked.batch_rows
    rewritten, honest = rows
    assert rewritten["question"] == ASKED and rewritten["verified"] is False
    assert "result" not in rewritten and rewritten["status"] == "unverified"
    assert any("answers a different question" in p for p in rewritten["problems"])
    assert not shows_the_other_answer(attacked.batch_out.read_text())
    assert honest["verified"] is True and honest["result"] == 42
    record("answer: rewritten queued spec, batch --out", "redis", True, rewritten["problems"][0][:300])


# -- row 11: another submitter's batch id --------------------------------------------------------------
def batch_state(attacked: Attacked, batch_id: str) -> dict[str, Any]:
    r, keys = attacked.redis, attacked.keys
    counts = r.hgetall(keys.batch_counts(batch_id))
    return {
        "jobs": r.lrange(keys.batch_jobs(batch_id), 0, -1),
        "total": counts.get("total"),
        "creator": counts.get("creator"),
        "all_jobs": r.zcard(keys.all_jobs),
    }


def posts_to(attacked: Attacked, path: str) -> list[dict[str, Any]]:
    return [p for p in attacked.receiver.posts if p["path"] == path]


def test_another_submitter_cannot_join_a_running_batch(
    attacked: Attacked, stranger: Client, tmp_path: Path
) -> None:
    url = attacked.receiver.url
    team = f"{url}/team-batch"
    victim = attacked.client.submit_batch([f"wait ten {i}" for i in range(3)], batch_webhook=team)
    joined = attacked.sandfleet(
        "submit", "wait ten, added", "--batch-id", victim.batch_id, "--batch-webhook", team
    )
    assert joined.returncode == 0, joined.stderr  # the creator, from another process: accepted
    own = [*victim.job_ids, joined.stdout.strip()]
    before = batch_state(attacked, victim.batch_id)
    queue_before = queue_length(attacked.redis, queue_name(attacked.settings))

    # While the batch runs, another submitter names it, with a batch webhook of its own.
    evil = {"batch_webhook": f"{url}/evil", "batch_id": victim.batch_id}
    with pytest.raises(BatchOwnerError, match="was created by another submitter"):
        stranger.submit("quick", **evil)
    with pytest.raises(BatchOwnerError, match="was created by another submitter"):
        stranger.submit_batch(["quick 1", "quick 2"], **evil)
    stranger_env = {"SANDFLEET_CLIENT_STATE_DIR": str(tmp_path / "stranger")}
    typed = attacked.sandfleet(
        "submit", "quick", "--batch-id", victim.batch_id, "--batch-webhook", f"{url}/evil", **stranger_env
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "quick", "batch_webhook": f"{url}/evil"}) + "\n")
    batched = attacked.sandfleet("batch", str(rows), "--batch-id", victim.batch_id, **stranger_env)
    for done in (typed, batched):
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert "was created by another submitter" in done.stderr and "nothing was enqueued" in done.stderr
    assert batch_state(attacked, victim.batch_id) == before
    assert queue_length(attacked.redis, queue_name(attacked.settings)) <= queue_before  # none added
    ended = attacked.redis.hget(attacked.keys.batch_counts(victim.batch_id), "succeeded")
    assert int(ended or 0) < len(own), "the batch ended before the attempts: they did not race it"

    handle = attacked.client.batch(victim.batch_id)
    assert handle.job_ids == own
    assert [r.result for r in handle.wait(timeout=JOB_TIMEOUT_S)] == [10, 10, 10, 10]
    audited = attacked.sandfleet("audit", "--verify", "--batch", victim.batch_id)
    assert audited.returncode == 0 and "4 jobs: 4 verified, 0 mismatched" in audited.stdout

    deadline = time.monotonic() + 30
    while not posts_to(attacked, "/team-batch") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    [post] = posts_to(attacked, "/team-batch")
    assert json.loads(post["body"])["counts"] == {"total": 4, "succeeded": 4}
    assert posts_to(attacked, "/evil") == []
    record("batch: another submitter's batch_id", "redis", True, typed.stderr.strip()[:300])


def test_a_job_written_into_a_batch_never_fires_or_wins_its_webhook(
    attacked: Attacked, stranger: Client
) -> None:
    """As an older producer or a Redis writer would: a job (ending last) put on a batch's list, its
    record naming the batch but not the batch's creator. Without the check it would claim the batch's
    webhook for its own URL."""
    url = attacked.receiver.url
    victim = attacked.client.submit_batch(["wait three, the batch's own"], batch_webhook=f"{url}/own-batch")
    spec = JobSpec(question="wait six, the foreign one", batch_webhook=f"{url}/evil-2", priority=9)
    foreign = str(uuid.uuid4())
    stranger._record_queued([(foreign, spec)])
    r, keys = attacked.redis, attacked.keys
    r.hset(keys.job(foreign), "batch_id", victim.batch_id)
    r.rpush(keys.batch_jobs(victim.batch_id), foreign)
    r.hincrby(keys.batch_counts(victim.batch_id), "queued", 1)
    r.hincrby(keys.batch_counts(victim.batch_id), "total", 1)
    stranger._publish([(foreign, spec)])

    assert attacked.client.batch(victim.batch_id).job_ids == victim.job_ids
    assert victim.wait(timeout=JOB_TIMEOUT_S)[0].result == 3
    assert stranger.get(foreign).result(timeout=JOB_TIMEOUT_S).result == 6  # it ran, and ended last
    time.sleep(2.0)  # a POST would have been sent by now
    assert posts_to(attacked, "/evil-2") == [] and posts_to(attacked, "/own-batch") == []
    assert not r.exists(keys.batch_webhook(victim.batch_id))  # never claimed
    log = attacked.worker.log()
    assert f"job {foreign} is not one of batch {victim.batch_id}'s own jobs: no batch webhook" in log
    assert attacked.client.batch(victim.batch_id).verify().verified
    record("batch: a foreign job written into a batch, ending last", "redis", True, "no batch webhook")
