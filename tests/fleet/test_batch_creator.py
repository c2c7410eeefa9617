"""Batches and their creators, and results checked against the spec submitted, against a real Redis:
the Python client and the ``sandfleet`` commands (in-process; the ``store`` fixture plays the worker).

The same attacks through a real ``sandfleet worker`` and commands run as separate processes are in
tests/security/test_answer_belongs.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from sandfleet.cli import main
from sandfleet.core.chain import GENESIS_HASH, encode_event, link_hash, spec_commitment
from sandfleet.core.contracts import AuditEvent, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import BatchOwnerError, SpecMismatchError
from sandfleet.core.priority import queue_length
from sandfleet.core.queue import queue_name
from sandfleet.core.settings import Settings, get_settings
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client

from .helpers import start_job


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def other(settings: Settings, raw_redis: redis.Redis, tmp_path: Path) -> Any:
    """A client of another submitter: the same fleet, a state folder (and so a token) of its own."""
    with Client(settings=settings.model_copy(update={"client_state_dir": str(tmp_path / "other")})) as c:
        yield c


def batch_state(r: redis.Redis, client: Client, batch_id: str) -> dict[str, Any]:
    """Everything a refused join must leave as it was."""
    keys = client.keys
    return {
        "jobs": r.lrange(keys.batch_jobs(batch_id), 0, -1),
        "counts": r.hgetall(keys.batch_counts(batch_id)),
        "all_jobs": r.zcard(keys.all_jobs),
        "queue": queue_length(r, queue_name(client.settings)),
        "records": sorted(r.scan_iter(match=f"{client.settings.key_prefix}:job:*", count=1000)),
    }


# -- batches and their creators -----------------------------------------------------------------------
def test_another_submitter_cannot_join_a_batch_and_nothing_is_written(
    client: Client, other: Client, raw_redis: redis.Redis
) -> None:
    batch = client.submit_batch(["a?", "b?"], batch_id="team-a-nightly")
    before = batch_state(raw_redis, client, "team-a-nightly")
    assert before["counts"]["creator"] and before["counts"]["total"] == "2"

    with pytest.raises(BatchOwnerError, match="'team-a-nightly' was created by another submitter"):
        other.submit("mine now?", batch_id="team-a-nightly")
    with pytest.raises(BatchOwnerError, match="choose another batch id"):
        other.submit_batch(["c?", "d?"], batch_id="team-a-nightly")
    assert batch_state(raw_redis, client, "team-a-nightly") == before
    assert client.batch("team-a-nightly").job_ids == batch.job_ids

    joined = client.submit("e?", batch_id="team-a-nightly")  # its creator may add to it
    assert client.batch("team-a-nightly").job_ids == [*batch.job_ids, joined.job_id]
    assert client.batch("team-a-nightly").progress().total == 3


def test_the_creator_joins_from_another_process_by_its_token_file(
    client: Client, settings: Settings, other: Client
) -> None:
    batch = client.submit_batch(["a?"])
    with Client(settings=settings) as later:  # another process of the same user: the same state folder
        later.submit("b?", batch_id=batch.batch_id)
    with Client(settings=settings.model_copy(update={"submitter_token": client.submitter_token()})) as team:
        team.submit("c?", batch_id=batch.batch_id)  # a teammate with the shared token
    assert client.batch(batch.batch_id).progress().total == 3
    with pytest.raises(BatchOwnerError):
        other.submit("d?", batch_id=batch.batch_id)


def test_two_submitters_racing_for_a_new_batch_id_get_one_creator(
    settings: Settings, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    clients = [
        Client(settings=settings.model_copy(update={"client_state_dir": str(tmp_path / f"s{i}")}))
        for i in range(6)
    ]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(clients))

    def race(c: Client) -> None:
        barrier.wait()
        try:
            c.submit_batch([f"q{n}" for n in range(20)], batch_id="contested")
            outcomes.append("created")
        except BatchOwnerError:
            outcomes.append("refused")

    threads = [threading.Thread(target=race, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert sorted(outcomes) == ["created"] + ["refused"] * 5
    assert raw_redis.llen(clients[0].keys.batch_jobs("contested")) == 20  # one batch's jobs, whole
    assert raw_redis.hget(clients[0].keys.batch_counts("contested"), "total") == "20"


def test_a_batch_without_a_creator_takes_no_more_jobs(client: Client, raw_redis: redis.Redis) -> None:
    raw_redis.hset(client.keys.batch_counts("legacy"), mapping={"total": 1, "queued": 1})
    raw_redis.rpush(client.keys.batch_jobs("legacy"), "old-job")
    with pytest.raises(BatchOwnerError, match="'legacy' records no creator"):
        client.submit("q", batch_id="legacy")
    assert raw_redis.llen(client.keys.batch_jobs("legacy")) == 1


def test_readers_take_only_a_batchs_own_jobs(client: Client, other: Client, raw_redis: redis.Redis) -> None:
    """A job pushed onto a batch's list (by an older producer, or a Redis writer that did not forge the
    record's creator) is not one of the batch's jobs: not listed, verified, counted in results."""
    batch = client.submit_batch(["a?", "b?"])
    stranger = other.submit("not yours", batch_id="elsewhere")
    plain = other.submit("no batch at all")
    keys = client.keys
    raw_redis.rpush(keys.batch_jobs(batch.batch_id), stranger.job_id, plain.job_id, "../../x", "gone-job")
    raw_redis.hset(keys.job(plain.job_id), "batch_id", batch.batch_id)  # claims the batch, no creator
    handle = client.batch(batch.batch_id)
    assert handle.job_ids == [*batch.job_ids, "gone-job"]  # a job with no record shows as missing
    assert [r.job_id for r in client.jobs(batch=batch.batch_id)] == batch.job_ids
    report = handle.verify()
    assert [v.job_id for v in report.verdicts] == handle.job_ids and report.count("missing") == 1


def test_the_batch_commands_refuse_another_submitters_batch(
    cli_env: dict, client: Client, raw_redis: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = client.submit_batch(["a?"])
    code, out, _ = run("submit", "joined by the creator", "--batch-id", batch.batch_id)
    assert code == 0  # the command reads the same token file as the client that made the batch
    before = batch_state(raw_redis, client, batch.batch_id)

    monkeypatch.setenv("SANDFLEET_CLIENT_STATE_DIR", str(tmp_path / "another-user"))
    get_settings.cache_clear()
    code, _, err = run("submit", "let me in", "--batch-id", batch.batch_id)
    assert code == 2 and "was created by another submitter" in err and "nothing was enqueued" in err
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "one"}\n{"question": "two"}\n')
    code, _, err = run("batch", str(rows), "--batch-id", batch.batch_id)
    assert code == 2 and "was created by another submitter" in err and "nothing was enqueued" in err
    assert batch_state(raw_redis, client, batch.batch_id) == before
    code, out, _ = run("jobs", "--batch", batch.batch_id, "--json")
    assert [json.loads(line)["question"] for line in out.splitlines()] == ["a?", "joined by the creator"]


# -- results checked against the spec submitted ---------------------------------------------------------
def rewrite_queued_spec(r: redis.Redis, client: Client, job_id: str, question: str) -> None:
    """What a Redis writer does to a queued job: a new spec, and an entry 0 that commits to it (entry 0
    is unsigned, so every link still holds)."""
    keys = client.keys
    spec = JobSpec.model_validate_json(r.hget(keys.job(job_id), "spec")).model_copy(
        update={"question": question}
    )
    spec_json, digest = spec_commitment(spec)
    [(_entry_id, fields)] = r.xrange(keys.audit(job_id))
    event = AuditEvent.model_validate_json(fields["event"])
    forged = encode_event(event.model_copy(update={"data": {**event.data, "spec_sha256": digest}}))
    head = link_hash(GENESIS_HASH, forged)
    r.delete(keys.audit(job_id))
    r.xadd(keys.audit(job_id), {"event": forged, "hash": head, "sig": "", "key": ""})
    r.hset(keys.job(job_id), mapping={"spec": spec_json, "audit_head": head})


def answer(store: JobStore, job_id: str) -> None:
    """The worker's part: run the job as its record now says, and seal its answer to that question."""
    record = store.record(job_id)
    assert record is not None and record.spec is not None
    start_job(store, job_id)
    store.finish(job_id, JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result=record.spec.question))


def test_a_proven_answer_to_a_rewritten_spec_is_refused_by_every_reader(
    cli_env: dict, client: Client, store: JobStore, raw_redis: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    job = client.submit("What is six times seven?")
    batch = client.submit_batch(["honest row", "rewritten row"])
    for job_id in (job.job_id, batch.job_ids[1]):
        rewrite_queued_spec(raw_redis, client, job_id, "Answer the other question")
    for job_id in (job.job_id, *batch.job_ids):
        answer(store, job_id)

    other_reader = Client(settings=settings.model_copy(update={"client_state_dir": str(tmp_path / "x")}))
    assert other_reader.get(job.job_id).result().result == "Answer the other question"  # the chain holds
    other_reader.close()

    with pytest.raises(SpecMismatchError, match=f"job {job.job_id}: the record answers a different question"):
        job.result(timeout=5)
    with pytest.raises(SpecMismatchError, match=batch.job_ids[1]):
        batch.results()
    with pytest.raises(SpecMismatchError):
        client.get(job.job_id).result()  # a new handle: the digest comes from the ledger
    assert client.get(job.job_id).verify().state == "mismatched"
    assert [c.verified for c in client.batch(batch.batch_id).checked_results()] == [True, False]

    code, out, err = run("result", job.job_id)
    assert code == 4 and out == "" and "answers a different question than the one submitted" in err
    code, out, _ = run("result", job.job_id, "--json")
    data = json.loads(out)
    assert code == 4 and data["verified"] is False and "Answer the other question" not in out
    assert "answers a different question" in data["problems"][0]
    code, _, err = run("audit", job.job_id, "--verify")
    assert code == 1 and "answers a different question" in err
    code, out, _ = run("audit", "--verify", "--batch", batch.batch_id)
    assert code == 1 and "2 jobs: 1 verified, 1 mismatched" in out
