"""Tampering with finished jobs' records and audit chains in Redis, as an attacker with write access
to Redis would; every change must be refused by the check it names.

Three jobs are run for real by a ``sandfleet worker`` (Docker sandboxes, the replay model over HTTP),
so their chains hold every event kind: the reference question (model_call, program, tool_call,
sandbox_run), a program that hits its tool-call budget (limit), a reply with no program (error).
Each case snapshots the job's record and stream, tampers through plain Redis commands, verifies, and
restores (and checks that the restored job verifies again).

The attacker is as strong as a Redis writer gets: it recomputes every link (they have no key), fixes
the record's tip and count, and signs what it writes with a key of its own that it registered in
the fleet's key register as the job's worker. Verification runs twice: with the keys registered in
Redis (the default) and with the key set exported before the attack (pinned, as an auditor does).
Pinned, every case is refused; with the Redis register, every case but one is: an edit of the
chain's last entry re-signed with the attacker's registered key is accepted (SECURITY.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sandfleet_testing.scripts import replay_script
from sandfleet_testing.workers import ORDERS, SANDFLEET, WorkerFactory, fleet_settings_for

from sandfleet.core.chain import canonical_json, link_hash, record_commitment, signed_message
from sandfleet.core.errors import UnverifiedResultError
from sandfleet.core.key_registry import KeyRegistry, start_signer
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyStatus, WorkerKey
from sandfleet.core.verify import Verdict
from sandfleet.producer.client import Client

from .helpers import record

JOB_TIMEOUT_S = 120.0
TOOL_BUDGET_PROGRAM = """from sandfleet_tools import load_orders
load_orders()
try:
    load_orders()
except Exception as e:
    print("second call refused:", type(e).__name__)
print("RESULT: 1")
"""


@dataclass
class TamperFleet:
    settings: Settings
    client: Client
    pinned: Client
    redis: redis.Redis
    keys: FleetKeys
    jobs: dict[str, str]  # reference | limit | error -> job id
    attacker: WorkerKey  # registered in Redis under the jobs' worker's name
    folder: Path

    def verify(self, job_id: str) -> tuple[Verdict, Verdict]:
        """``(with the Redis register, with the pinned key set)``."""
        return self.client.get(job_id).verify(), self.pinned.get(job_id).verify()


@pytest.fixture(scope="module")
def fleet(
    module_fleet_worker: WorkerFactory, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TamperFleet]:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION

    def tamper_script(scripts_dir: Path) -> Path:
        """The reference script, and a job over its tool budget and one that writes no program."""
        path = replay_script(scripts_dir)
        script = json.loads(path.read_text())
        script["rules"] += [
            {"match": "(?i)tool budget", "responses": [f"```python\n{TOOL_BUDGET_PROGRAM}```"]},
            {"match": "(?i)no program", "responses": ["I would rather not write a program."]},
        ]
        path.write_text(json.dumps(script))
        return path

    folder = tmp_path_factory.mktemp("tamper")
    settings = fleet_settings_for(redis_server, worker_state_dir=str(folder / "worker-state"))
    worker = module_fleet_worker(
        "tamper", settings=settings, folder=folder, tools=ORDERS, script=tamper_script
    )
    model = worker.model
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    try:
        client = worker.client
        specs = {
            "reference": {"question": REFERENCE_QUESTION, "tools": ["load_orders"], "model": model},
            "limit": {
                "question": "Stay within the tool budget",
                "tools": ["load_orders"],
                "model": model,
                "code_action": {"max_tool_calls": 1},
            },
            "error": {
                "question": "Answer with no program",
                "model": model,
                "code_action": {"max_repairs": 0},
            },
        }
        jobs = {name: client.submit(spec).job_id for name, spec in specs.items()}
        for job_id in jobs.values():
            client.get(job_id).result(timeout=JOB_TIMEOUT_S)
        kinds = {name: [e.kind for e in client.get(j).audit()] for name, j in jobs.items()}
        assert "limit" in kinds["limit"] and "error" in kinds["error"], (kinds, worker.log()[-3000:])
        assert {"model_call", "program", "tool_call", "sandbox_run"} <= set(kinds["reference"])
        pinned_file = folder / "trusted-keys.json"
        pinned_file.write_text(json.dumps(client.key_ring().export(settings.key_prefix)))
        worker_name = client.get(jobs["reference"]).record().worker
        assert worker_name
        attacker = WorkerKey.generate(worker_name)
        client.registry.register(attacker.info)  # what any Redis writer can do
        pinned = Client(settings=settings.model_copy(update={"trusted_keys": str(pinned_file)}))
        yield TamperFleet(settings, client, pinned, r, FleetKeys(settings.key_prefix), jobs, attacker, folder)
        pinned.close()
    finally:
        r.close()


# -- the attacker's tools ---------------------------------------------------------------------------
@dataclass
class Stored:
    record: dict[str, str]
    entries: list[dict[str, str]]


def snapshot(fleet: TamperFleet, job_id: str) -> Stored:
    entries = [fields for _id, fields in fleet.redis.xrange(fleet.keys.audit(job_id))]
    return Stored(fleet.redis.hgetall(fleet.keys.job(job_id)), entries)


def store_back(fleet: TamperFleet, job_id: str, stored: Stored) -> None:
    """Write a record and a stream as given (what a Redis writer can do), replacing what is there."""
    pipe = fleet.redis.pipeline(transaction=True)
    pipe.delete(fleet.keys.job(job_id), fleet.keys.audit(job_id))
    pipe.hset(fleet.keys.job(job_id), mapping=stored.record)
    for fields in stored.entries:
        pipe.xadd(fleet.keys.audit(job_id), fields)
    pipe.execute()


def relink(fleet: TamperFleet, job_id: str, stored: Stored, resign: set[int]) -> Stored:
    """Recompute every link (they have no key) and the record's tip and count; entries in ``resign``
    get the attacker's signature, the others keep the ones they had."""
    prev, entries = "", []
    for index, fields in enumerate(stored.entries):
        link = link_hash(prev, fields["event"])
        fields = {**fields, "hash": link}
        if index in resign:
            sig = fleet.attacker.sign(signed_message(job_id, link))
            fields.update(sig=sig, key=fleet.attacker.key_id)
        entries.append(fields)
        prev = link
    record_ = {**stored.record, "audit_head": prev, "audit_count": str(len(entries))}
    return Stored(record_, entries)


def edited_event(event_json: str, **data: Any) -> str:
    event = json.loads(event_json)
    event["data"].update(data)
    return canonical_json(event)


KINDS = [
    ("state:queued", "reference"),
    ("state:running", "reference"),
    ("state:final", "reference"),
    ("model_call", "reference"),
    ("program", "reference"),
    ("tool_call", "reference"),
    ("sandbox_run", "reference"),
    ("limit", "limit"),
    ("error", "error"),
]
OPERATIONS = ["edit", "delete", "reorder", "insert"]


def index_of(stored: Stored, kind: str) -> int:
    events = [json.loads(f["event"]) for f in stored.entries]
    for index, event in enumerate(events):
        name, _, status = kind.partition(":")
        if event["kind"] != name:
            continue
        if (
            not status
            or event["data"].get("status") == status
            or (status == "final" and event["data"].get("status") in ("succeeded", "failed"))
        ):
            return index
    raise AssertionError(f"no {kind} event")


def tamper(fleet: TamperFleet, job_id: str, stored: Stored, kind: str, operation: str) -> tuple[Stored, int]:
    """The tampered record and stream, and the index of the entry the attack is about."""
    i = index_of(stored, kind)
    entries = list(stored.entries)
    if operation == "edit":
        entries[i] = {**entries[i], "event": edited_event(entries[i]["event"], tampered=True)}
        return relink(fleet, job_id, Stored(stored.record, entries), resign={i} - {0}), i
    if operation == "delete":
        del entries[i]
        return relink(fleet, job_id, Stored(stored.record, entries), resign=set()), i
    if operation == "reorder":
        j = i + 1 if i + 1 < len(entries) else i - 1
        entries[i], entries[j] = entries[j], entries[i]
        return relink(fleet, job_id, Stored(stored.record, entries), resign=set()), min(i, j)
    assert operation == "insert"
    entries.insert(i + 1, {**entries[i], "event": edited_event(entries[i]["event"], inserted=True)})
    return relink(fleet, job_id, Stored(stored.record, entries), resign={i + 1}), i + 1


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("kind, job", KINDS, ids=[k for k, _ in KINDS])
def test_each_event_kind_edited_deleted_reordered_or_inserted_is_refused(
    fleet: TamperFleet, kind: str, job: str, operation: str
) -> None:
    job_id = fleet.jobs[job]
    original = snapshot(fleet, job_id)
    tampered, at = tamper(fleet, job_id, original, kind, operation)
    store_back(fleet, job_id, tampered)
    try:
        unpinned, pinned = fleet.verify(job_id)
    finally:
        store_back(fleet, job_id, original)
    assert all(v.verified for v in fleet.verify(job_id)), "restoring the job must make it verify again"

    assert not pinned.verified, (kind, operation, pinned)
    last = at == len(original.entries) - 1
    if operation == "edit" and last:
        # The documented gap: the chain's last entry, re-signed with a key the attacker registered in
        # Redis under the job's worker's name, passes a check that trusts Redis's key register.
        assert unpinned.verified and "not in the key set" in pinned.problems[0]
    else:
        assert not unpinned.verified, (kind, operation, unpinned)
    record(
        f"audit: {operation} a {kind} event",
        "redis",
        not pinned.verified,
        {"pinned": pinned.problems[:1], "redis register": unpinned.problems[:1] or ["accepted"]},
    )


# -- the final record, field by field ---------------------------------------------------------------
def forged_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return "failed" if value == "succeeded" else value + " (forged)"
    if isinstance(value, list):
        return [*value, "forged"] if not value else value[:-1]
    if isinstance(value, dict):
        return {**value, "forged": 1}
    return "forged"


def result_fields(fleet: TamperFleet) -> list[str]:
    raw = fleet.redis.hget(fleet.keys.job(fleet.jobs["reference"]), "result")
    return sorted(json.loads(raw))


RESULT_FIELDS = [
    "artifacts",
    "artifacts_skipped",
    "attempts",
    "error",
    "final_program",
    "job_id",
    "limits_hit",
    "mode",
    "model",
    "network_denied",
    "refused_total",
    "refused_unlisted",
    "repairs",
    "result",
    "schema_version",
    "session",
    "status",
    "timings",
    "tool_calls",
    "turns",
    "usage",
]


def test_the_list_of_result_fields_is_complete(fleet: TamperFleet) -> None:
    assert result_fields(fleet) == RESULT_FIELDS  # a new JobResult field gets its tamper case


@pytest.mark.parametrize("field", RESULT_FIELDS)
def test_each_field_of_the_final_record_is_bound_to_the_seal(fleet: TamperFleet, field: str) -> None:
    job_id = fleet.jobs["reference"]
    original = snapshot(fleet, job_id)
    data = json.loads(original.record["result"])
    data[field] = forged_value(data[field])
    store_back(fleet, job_id, Stored({**original.record, "result": json.dumps(data)}, original.entries))
    try:
        verdicts = fleet.verify(job_id)
        with pytest.raises(UnverifiedResultError, match=f"field '{field}' differs"):
            fleet.client.get(job_id).result(timeout=1)
    finally:
        store_back(fleet, job_id, original)
    for verdict in verdicts:
        assert (
            not verdict.verified
            and f"field {field!r} differs from what the chain committed" in verdict.problems[0]
        )
    record(f"audit: final record field {field!r} changed", "redis", True, verdicts[0].problems[0])


RECORD_FIELDS = {  # a field of the record's hash -> (new value or None to delete it, the problem named)
    "status": ("failed", "the record's status 'failed' is not the sealed status"),
    "worker": ("someone-else@host", "the record says worker 'someone-else@host' finished the job"),
    "spec": (None, "the record's spec is not the one submitted"),
    "result": (None, "the record has no final result"),
    "audit_head": ("0" * 64, "the record's chain tip is not the last entry's hash"),
    "audit_count": ("3", "the record counts 3 audit events"),
}


@pytest.mark.parametrize("field", sorted(RECORD_FIELDS))
def test_each_field_of_the_record_hash_is_checked(fleet: TamperFleet, field: str) -> None:
    job_id = fleet.jobs["reference"]
    original = snapshot(fleet, job_id)
    value, problem = RECORD_FIELDS[field]
    if field == "spec":
        spec = json.loads(original.record["spec"])
        value = json.dumps({**spec, "question": "a question nobody asked"})
    changed = (
        {**original.record, field: value}
        if value is not None
        else {k: v for k, v in original.record.items() if k != field}
    )
    store_back(fleet, job_id, Stored(changed, original.entries))
    try:
        verdicts = fleet.verify(job_id)
    finally:
        store_back(fleet, job_id, original)
    for verdict in verdicts:
        assert not verdict.verified and any(problem in p for p in verdict.problems), verdict.problems
    record(f"audit: record field {field!r} changed", "redis", True, verdicts[0].problems[0])


# -- whole chains and whole records -----------------------------------------------------------------
def test_a_chain_re_signed_with_another_workers_key_is_refused(fleet: TamperFleet) -> None:
    """A thief of worker B's (registered, legitimate) key re-signs job A's whole chain with it."""
    job_id = fleet.jobs["reference"]
    original = snapshot(fleet, job_id)
    registry = KeyRegistry(fleet.redis, fleet.keys)
    thief_settings = fleet.settings.model_copy(
        update={"worker_state_dir": str(fleet.folder / f"b-{uuid.uuid4().hex[:6]}")}
    )
    other = start_signer(thief_settings, f"worker-b-{uuid.uuid4().hex[:6]}@elsewhere", registry)

    def resigned(stored: Stored) -> Stored:
        entries = [stored.entries[0]]
        for fields in stored.entries[1:]:
            sig, key_id = other.sign(signed_message(job_id, fields["hash"]))
            entries.append({**fields, "sig": sig, "key": key_id})
        return Stored(stored.record, entries)

    # 1. The same events, B's signatures: the running event names A, the key is B's.
    store_back(fleet, job_id, resigned(original))
    try:
        as_is = fleet.verify(job_id)
        # 2. Claims rewritten to B everywhere (running event, seal, record): a coherent forgery in
        #    B's own name, which only revoking B's key refuses.
        entries = [dict(f) for f in original.entries]
        for fields in entries:
            event = json.loads(fields["event"])
            if event["kind"] == "state" and event["data"].get("worker"):
                fields["event"] = edited_event(fields["event"], worker=other.worker)
        forged = Stored({**original.record, "worker": other.worker}, entries)
        forged = relink(fleet, job_id, forged, resign=set())
        store_back(fleet, job_id, resigned(forged))
        coherent = fleet.verify(job_id)
        registry.set_status(other.key.key_id, KeyStatus.REVOKED)
        after_revocation = fleet.verify(job_id)
    finally:
        store_back(fleet, job_id, original)
    for verdict in as_is:
        assert not verdict.verified
    assert (
        "says worker" in as_is[0].problems[0]
        and f"signed by the key of worker {other.worker!r}" in as_is[0].problems[0]
    )
    assert "not in the key set" in as_is[1].problems[0]  # B's key is newer than the pinned set
    assert coherent[0].verified and not coherent[1].verified
    for verdict in after_revocation:
        assert not verdict.verified
    assert "which is revoked" in after_revocation[0].problems[0]
    record("audit: whole chain re-signed with another worker's key", "redis", True, as_is[0].problems[0])
    record(
        "audit: whole chain re-signed in the key thief's own name",
        "redis",
        False,
        "accepted until the key is revoked (pinned: refused unless the key was pinned); after "
        f"`sandfleet keys revoke`: {after_revocation[0].problems[0]}",
    )


@pytest.mark.parametrize("what", ["result", "record", "record and stream"])
def test_two_jobs_records_swapped_are_refused(fleet: TamperFleet, what: str) -> None:
    a, b = fleet.jobs["reference"], fleet.jobs["limit"]
    sa, sb = snapshot(fleet, a), snapshot(fleet, b)
    if what == "result":
        ta = Stored({**sa.record, "result": sb.record["result"]}, sa.entries)
        tb = Stored({**sb.record, "result": sa.record["result"]}, sb.entries)
    elif what == "record":
        ta, tb = Stored(sb.record, sa.entries), Stored(sa.record, sb.entries)
    else:
        ta, tb = sb, sa
    store_back(fleet, a, ta)
    store_back(fleet, b, tb)
    try:
        verdicts = [*fleet.verify(a), *fleet.verify(b)]
    finally:
        store_back(fleet, a, sa)
        store_back(fleet, b, sb)
    expected = {
        "result": "field 'job_id' differs",
        "record": "the record's spec is not the one submitted",
        "record and stream": f"belongs to job {b}",
    }[what]
    for verdict in verdicts:
        assert not verdict.verified
    assert any(expected in p for p in verdicts[0].problems), verdicts[0].problems
    record(f"audit: two jobs' {what} swapped", "redis", True, verdicts[0].problems[0])


# -- the scenario, on the command line ------------------------------------------------------
def cli(fleet: TamperFleet, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": fleet.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": fleet.settings.key_prefix,
    }
    return subprocess.run([SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


def test_a_forged_result_is_refused_by_result_audit_and_replay(fleet: TamperFleet) -> None:
    """``HSET ... result <forged JSON>``: result, audit --verify and replay all refuse it."""
    job_id = fleet.jobs["reference"]
    original = snapshot(fleet, job_id)
    data = json.loads(original.record["result"])
    data["result"] = {"North America": 1.0}
    fleet.redis.hset(fleet.keys.job(job_id), "result", json.dumps(data))
    try:
        shown = cli(fleet, "result", job_id)
        as_json = cli(fleet, "result", job_id, "--json")
        audited = cli(fleet, "audit", job_id, "--verify")
        replayed = cli(fleet, "replay", job_id, "--json")
    finally:
        store_back(fleet, job_id, original)
    assert shown.returncode == 4 and shown.stdout == "" and "refused" in shown.stderr
    assert "field 'result' differs" in shown.stderr and "North America" not in shown.stdout
    assert as_json.returncode == 4 and json.loads(as_json.stdout)["verified"] is False
    assert audited.returncode == 1 and "BROKEN" in audited.stderr and "field 'result'" in audited.stderr
    assert replayed.returncode == 1 and json.loads(replayed.stdout)["state"] == "unverified"
    restored = cli(fleet, "replay", job_id, "--json")
    assert restored.returncode == 0 and json.loads(restored.stdout)["match"] is True, restored.stderr[-2000:]
    assert cli(fleet, "result", job_id).returncode == 0
    record("audit: HSET of a finished job's result (issue 18)", "redis", True, shown.stderr.strip()[:300])


def test_keys_pinned_before_an_attacker_registered_one_refuse_its_signatures(fleet: TamperFleet) -> None:
    """The attacker re-signs a whole chain, seal included, with the key it registered as the job's
    worker, after forging the result: the Redis register trusts it, the pinned key set does not."""
    job_id = fleet.jobs["reference"]
    original = snapshot(fleet, job_id)
    data = json.loads(original.record["result"])
    data["result"] = {"North America": 1.0}
    result_json = json.dumps(data)
    entries = [dict(f) for f in original.entries]
    entries[-1]["event"] = edited_event(entries[-1]["event"], record=record_commitment(result_json))
    forged = relink(
        fleet,
        job_id,
        Stored({**original.record, "result": result_json}, entries),
        resign=set(range(1, len(entries))),
    )
    store_back(fleet, job_id, forged)
    try:
        unpinned, pinned = fleet.verify(job_id)
    finally:
        store_back(fleet, job_id, original)
    assert unpinned.verified  # the register is where keys are found, not why they are trusted
    assert not pinned.verified and "not in the key set (the pinned key set" in pinned.problems[0]
    record(
        "audit: whole chain forged and re-signed with a key registered by the attacker",
        "redis",
        True,
        f"pinned keys: {pinned.problems[0]}; Redis register alone: accepted (pin the keys)",
    )
