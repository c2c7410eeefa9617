"""Whoever can write Redis, with no key, against what a worker reads back: it acts only on state its
fleet signed (issue 22, rows 3-5).

A real ``sandfleet worker`` (gated ``issue_refund``, grace 1 s, the replay model over HTTP, Docker
sandboxes under runc and gVisor) on a throwaway redis-server. The test is the attacker: it writes Redis
with plain commands, as anyone holding the Redis password can. The test tools write every real
execution to a ledger, so a test proves what never ran; ``docker events`` (filtered by the worker's
owner label) proves that no container was made for a refused resume.

- An approval request set to ``executed`` with an invented ``outcome``: the resumed worker finds no
  signed ``executed`` event committing to it, ends the job ``untrusted_state``; the lie is in no event.
- A planted checkpoint and an unsigned ``awaiting_approval`` event committing to it: the chain does not
  verify, the job ends ``untrusted_state`` before any container or tool.
- The same event signed with a key the attacker registered in Redis (the register can be written):
  a worker pinning its key set (``SANDFLEET_TRUSTED_KEYS``) refuses it, and so does one that does
  not pin: unpinned, a worker acts only on state signed with a key made on its own host
  (sandfleet/core/host_keys.py). The price, shown too: a job suspended on another host is refused
  by an unpinned worker, saying to pin the fleet's key set.
- The attacker's public key stored under a genuine worker's key id: ``keys list`` flags it,
  ``keys export`` refuses, ``result`` and ``audit --verify`` refuse the forged result, and a worker
  whose registered key was swapped refuses to start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest
import redis
from approvals.helpers import approval_env, gated_worker, ledger, wait_for
from sandfleet_testing.workers import SANDFLEET, FleetWorker, WorkerFactory

from sandfleet.core.approvals import ApprovalStatus
from sandfleet.core.chain import canonical_json, link_hash, record_commitment, sha256_hex, signed_message
from sandfleet.core.contracts import AuditEvent, AuditKind, JobStatus
from sandfleet.core.errors import ApprovalUnverifiedError
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.signing import KeyInfo, WorkerKey

from .helpers import BACKEND_OF, ContainerWatch, record

pytestmark = [pytest.mark.slow]

JOB_TIMEOUT_S = 120.0
INVENTED = "refund-INVENTED-by-the-attacker"
PLANTED_ORDER = "PLANTED-by-the-attacker"
PLANTED_PROGRAM = (
    "import json\nfrom sandfleet_tools import *\n"
    f'lookup_order("{PLANTED_ORDER}")\n'
    'print("RESULT:", json.dumps("planted"))\n'
)


@pytest.fixture(scope="module")
def gated(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """A worker gating issue_refund (grace 1 s), verifying with the fleet's register (not pinned)."""
    return gated_worker(module_fleet_worker, "trusted-state", approval_env())


@pytest.fixture(scope="module")
def patient(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """A worker whose programs wait up to 60 s for a decision (grace), in their running sandbox."""
    env = approval_env(SANDFLEET_APPROVAL_GRACE_S="60", SANDFLEET_APPROVAL_TIMEOUT_S="90")
    return gated_worker(module_fleet_worker, "trusted-state-patient", env)


@pytest.fixture(scope="module")
def pinned(module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory) -> FleetWorker:
    """The same, started with ``SANDFLEET_TRUSTED_KEYS``: the key set exported once it registered."""
    keys_file = tmp_path_factory.mktemp("trusted-state-pinned-keys") / "fleet-keys.json"
    keys_file.write_text(json.dumps({"format": "sandfleet-keys/1", "fleet": "-", "keys": []}))
    env = approval_env(SANDFLEET_TRUSTED_KEYS=str(keys_file))
    worker = gated_worker(module_fleet_worker, "trusted-state-pinned", env)
    exported = cli(worker, "keys", "export", "--out", str(keys_file))  # as the operator does
    assert exported.returncode == 0, exported.stderr
    assert [k["worker"] for k in json.loads(keys_file.read_text())["keys"]] == [worker.worker.name]
    return worker


def cli(worker: FleetWorker, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    base |= {
        "SANDFLEET_REDIS_URL": worker.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": worker.settings.key_prefix,
    }
    return subprocess.run(
        [SANDFLEET, *args], env=base | env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S
    )


def attacker_redis(worker: FleetWorker) -> tuple[redis.Redis, FleetKeys]:
    return redis.Redis.from_url(worker.settings.redis_url, decode_responses=True), FleetKeys(
        worker.settings.key_prefix
    )


def suspended_refund(worker: FleetWorker, runtime: str) -> tuple[Any, str]:
    """Submit "Refund order one" and wait until it is suspended on its issue_refund request."""
    job = worker.client.submit(
        "Refund order one",
        tools=["lookup_order", "issue_refund"],
        model=worker.model,
        sandbox={"backend": BACKEND_OF[runtime]},
    )
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, JOB_TIMEOUT_S, "the job to be suspended")
    [request] = [r for r in worker.client.approvals(job_id=job.job_id) if r.status == ApprovalStatus.PENDING]
    return job, request.id


def append_event(
    r: redis.Redis, keys: FleetKeys, job_id: str, kind: str, data: dict[str, Any], key: WorkerKey | None
) -> None:
    """Append an event as the strongest keyless attacker can: linked to the tip (links have no key), the
    record's tip and count updated; signed with ``key`` when given (one the attacker registered)."""
    head = r.hget(keys.job(job_id), "audit_head") or ""
    event = AuditEvent(ts=time.time(), job_id=job_id, attempt=1, kind=AuditKind(kind), data=data)
    event_json = canonical_json(event.model_dump(mode="json"))
    link = link_hash(head, event_json)
    sig = key.sign(signed_message(job_id, link)) if key is not None else ""
    r.xadd(
        keys.audit(job_id), {"event": event_json, "hash": link, "sig": sig, "key": key.key_id if key else ""}
    )
    r.hset(keys.job(job_id), "audit_head", link)
    r.hincrby(keys.job(job_id), "audit_count", 1)


def plant_checkpoint(r: redis.Redis, keys: FleetKeys, job_id: str) -> str:
    """Replace the suspended job's checkpoint with one that runs the attacker's program; its digest."""
    checkpoint = json.loads(r.get(keys.checkpoint(job_id)) or "{}")
    assert "issue_refund(" in checkpoint["program"]  # the genuine program, about to be replaced
    checkpoint.update(program=PLANTED_PROGRAM, calls=[])
    planted = json.dumps(checkpoint, separators=(",", ":"))
    r.set(keys.checkpoint(job_id), planted, keepttl=True)
    return sha256_hex(planted)


def texts_of(job: Any) -> str:
    return "\n".join(json.dumps(e.model_dump(mode="json")) for e in job.audit())


# -- row 3: an invented outcome -----------------------------------------------------------------------
def test_an_approval_set_to_executed_with_an_invented_outcome_is_not_served(
    gated: FleetWorker, runtime: str
) -> None:
    client, data = gated.client, gated.fleet.data_dir
    before = len(ledger(data))
    job, rid = suspended_refund(gated, runtime)
    r, keys = attacker_redis(gated)
    try:
        # The attacker claims the approved call ran and returned its own value, and queues the job
        # again as a decision would (status and message: plain writes to Redis).
        r.hset(
            keys.approval(rid),
            mapping={
                "status": "executed",
                "outcome": json.dumps({"ok": True, "value": INVENTED}),
                "decided_by": "ana",
                "decided_at": repr(time.time()),
            },
        )
        r.hset(keys.job(job.job_id), "status", "queued")
        assert client.publisher.republish(client.reader, job.job_id)
        result = job.result(timeout=JOB_TIMEOUT_S)  # the worker's own final record: it verifies
    finally:
        r.close()
    assert result.status == JobStatus.FAILED, result
    assert result.error is not None and result.error.kind == "untrusted_state", result.error
    assert rid in result.error.message and "not served" in result.error.message
    assert "no signed 'executed' event" in result.error.message, result.error.message
    assert INVENTED not in texts_of(job)  # the signed chain never holds the lie
    assert INVENTED not in json.dumps(result.model_dump(mode="json"))
    assert [e["tool"] for e in ledger(data)[before:]] == ["lookup_order"]  # the refund never ran
    assert client.get(job.job_id).verify().verified
    record(
        "state: approval set to executed with an invented outcome", runtime, True, result.error.message[:300]
    )


def test_an_invented_outcome_written_while_the_call_waits_in_its_program_is_not_served(
    patient: FleetWorker, runtime: str
) -> None:
    """The same lie while the gated call waits in its running program (no suspension): the gate sees
    ``executed``, finds no signed event for it, stops the program; the job ends untrusted_state."""
    client, data = patient.client, patient.fleet.data_dir
    before = len(ledger(data))
    job = client.submit(
        "Refund order one",
        tools=["lookup_order", "issue_refund"],
        model=patient.model,
        sandbox={"backend": BACKEND_OF[runtime]},
    )
    [request] = wait_for(lambda: client.approvals(job_id=job.job_id), JOB_TIMEOUT_S, "the request")
    r, keys = attacker_redis(patient)
    try:
        r.hset(
            keys.approval(request.id),
            mapping={"status": "executed", "outcome": json.dumps({"ok": True, "value": INVENTED})},
        )
        result = job.result(timeout=JOB_TIMEOUT_S)
    finally:
        r.close()
    assert result.status == JobStatus.FAILED and result.error is not None, result
    assert result.error.kind == "untrusted_state" and "no signed 'executed' event" in result.error.message
    assert job.record().status == JobStatus.FAILED and JobStatus.AWAITING_APPROVAL.value not in [
        e.data.get("status") for e in job.audit()
    ]  # stopped in its grace, never suspended
    assert INVENTED not in texts_of(job) and INVENTED not in json.dumps(result.model_dump(mode="json"))
    approvals = [e.data["event"] for e in job.audit() if e.kind == "approval"]
    assert approvals == ["requested"]  # nor a decision nobody made: nothing of the forged request is used
    assert [e["tool"] for e in ledger(data)[before:]] == ["lookup_order"]
    record(
        "state: invented outcome while the call waits in its program",
        runtime,
        True,
        result.error.message[:300],
    )


# -- row 4: a planted checkpoint ----------------------------------------------------------------------
def test_a_planted_checkpoint_with_an_unsigned_awaiting_approval_event_is_not_run(
    gated: FleetWorker, runtime: str
) -> None:
    client, data = gated.client, gated.fleet.data_dir
    before = len(ledger(data))
    job, rid = suspended_refund(gated, runtime)
    r, keys = attacker_redis(gated)
    watch = ContainerWatch(gated.worker.owner_label)
    try:
        digest = plant_checkpoint(r, keys, job.job_id)
        append_event(
            r,
            keys,
            job.job_id,
            "state",
            {"status": "awaiting_approval", "waiting_for": [rid], "checkpoint_sha256": digest},
            key=None,
        )
        # anyone who can write Redis may approve (bypassing the client's check of the request, which
        # refuses here: the chain no longer verifies): the job resumes, and the worker must refuse
        client.approve(rid, by="ana", trust_unverified_request=True)
        result = job.result(timeout=JOB_TIMEOUT_S, verify=False)  # its chain holds the attacker's entry
        time.sleep(1.0)  # events reach the watch within moments
        created = watch.created()
    finally:
        watch.close()
        r.close()
    assert result.status == JobStatus.FAILED, result
    assert result.error is not None and result.error.kind == "untrusted_state", result.error
    assert "checkpoint" in result.error.message and "not signed" in result.error.message, result.error
    assert created == [], "a container was made for the refused resume"
    assert PLANTED_ORDER not in json.dumps(ledger(data)[before:])  # the planted program never ran
    assert "issue_refund" not in [e["tool"] for e in ledger(data)[before:]]
    record(
        "state: planted checkpoint + unsigned awaiting_approval event",
        runtime,
        True,
        f"{result.error.message[:300]}; containers made for the resume: {len(created)}",
    )


def attacker_key(worker: FleetWorker) -> WorkerKey:
    """A key pair of the attacker's, registered in Redis under the worker's name (no key needed)."""
    key = WorkerKey.generate(worker.worker.name)
    worker.client.registry.register(key.info)
    return key


def test_a_worker_pinning_its_keys_refuses_a_planted_event_signed_with_a_registered_key(
    pinned: FleetWorker, runtime: str
) -> None:
    client, data = pinned.client, pinned.fleet.data_dir
    before = len(ledger(data))
    job, rid = suspended_refund(pinned, runtime)
    r, keys = attacker_redis(pinned)
    watch = ContainerWatch(pinned.worker.owner_label)
    try:
        digest = plant_checkpoint(r, keys, job.job_id)
        event = {"status": "awaiting_approval", "waiting_for": [rid], "checkpoint_sha256": digest}
        append_event(r, keys, job.job_id, "state", event, key=attacker_key(pinned))
        client.approve(rid, by="ana")
        result = job.result(timeout=JOB_TIMEOUT_S, verify=False)
        time.sleep(1.0)
        created = watch.created()
    finally:
        watch.close()
        r.close()
    assert result.status == JobStatus.FAILED and result.error is not None, result
    assert result.error.kind == "untrusted_state"
    assert "not in the key set (the pinned key set" in result.error.message, result.error.message
    assert created == [] and PLANTED_ORDER not in json.dumps(ledger(data)[before:])
    case = "state: planted checkpoint signed with a key registered in Redis, worker pinned"
    record(case, runtime, True, result.error.message[:300])


def test_an_unpinned_worker_refuses_a_planted_event_signed_with_a_registered_key(
    gated: FleetWorker, runtime: str
) -> None:
    """No pinned key set: the worker still acts only on what a key made on its host signed."""
    client, data = gated.client, gated.fleet.data_dir
    before = len(ledger(data))
    job, rid = suspended_refund(gated, runtime)
    r, keys = attacker_redis(gated)
    watch = ContainerWatch(gated.worker.owner_label)
    try:
        digest = plant_checkpoint(r, keys, job.job_id)
        event = {"status": "awaiting_approval", "waiting_for": [rid], "checkpoint_sha256": digest}
        append_event(r, keys, job.job_id, "state", event, key=attacker_key(gated))
        client.approve(rid, by="ana")
        result = job.result(timeout=JOB_TIMEOUT_S, verify=False)
        time.sleep(1.0)
        created = watch.created()
    finally:
        watch.close()
        r.close()
    assert gated.settings.trusted_keys is None and "SANDFLEET_TRUSTED_KEYS" not in json.dumps(
        gated.fleet.config.env
    )
    assert result.status == JobStatus.FAILED and result.error is not None, result
    assert result.error.kind == "untrusted_state", result.error
    assert "not in the key set (this host's keys in" in result.error.message, result.error.message
    assert created == [] and PLANTED_ORDER not in json.dumps(ledger(data)[before:])
    assert "issue_refund" not in [e["tool"] for e in ledger(data)[before:]]
    case = "state: planted checkpoint signed with a key registered in Redis, worker NOT pinned"
    record(case, runtime, True, result.error.message[:300])


def test_a_job_suspended_on_another_host_is_refused_by_an_unpinned_worker_naming_the_setting(
    fleet_worker: WorkerFactory,
) -> None:
    """The price of not trusting the register: the key of a worker of another host (its own state
    folder) is not trusted either until the operator pins the fleet's key set. Nothing runs."""
    first = gated_worker(fleet_worker, "first-host", approval_env())
    job, rid = suspended_refund(first, "runc")
    first.fleet.kill(first.worker, signal.SIGTERM)  # it holds nothing of the waiting job
    first.worker.process.wait(timeout=90)
    before = len(ledger(first.fleet.data_dir))
    other_host = first.fleet.folder / "other-host-state"
    second = first.fleet.start_worker(env={"SANDFLEET_WORKER_STATE_DIR": str(other_host)})
    first.client.approve(rid, by="ana")
    result = job.result(timeout=JOB_TIMEOUT_S)  # the second worker's own final record: it verifies
    assert job.record().worker == second.name
    assert result.status == JobStatus.FAILED and result.error is not None, result
    assert result.error.kind == "untrusted_state", result.error
    assert f"which is not in the key set (this host's keys in {other_host}" in result.error.message
    assert "SANDFLEET_TRUSTED_KEYS" in result.error.message, result.error.message
    assert ledger(first.fleet.data_dir)[before:] == []  # neither the refund nor the lookup ran again
    assert "keys were not made on this host" in second.log() and first.worker.name in second.log()


# -- the request an approver is shown, rewritten in Redis ---------------------------------------------
def test_a_request_rewritten_in_redis_is_shown_as_such_and_approving_it_runs_only_the_genuine_call(
    gated: FleetWorker,
) -> None:
    """The attacker rewrites a pending request's arguments (call hash kept, so a decision for it
    holds): ``approvals show`` says the request differs from the worker's signed ``requested``
    event, ``approvals approve`` and ``Client.approve`` refuse, and a decision signed anyway runs
    the program's own call."""
    client, data = gated.client, gated.fleet.data_dir
    job, rid = suspended_refund(gated, "runc")
    approver = {"SANDFLEET_APPROVER_KEY": gated.settings.approver_key or ""}
    genuine = cli(gated, "approvals", "show", rid)
    r, keys = attacker_redis(gated)
    try:
        stored = json.loads(r.hget(keys.approval(rid), "request") or "{}")
        assert stored["arguments"] == {"order_id": "O-1", "amount": 25.0}, stored
        stored["arguments"] = {"order_id": "O-9", "amount": 1.0}  # what the approver would be shown
        r.hset(keys.approval(rid), "request", json.dumps(stored))
        shown = cli(gated, "approvals", "show", rid)
        shown_json = cli(gated, "approvals", "show", rid, "--json")
        refused = cli(gated, "approvals", "approve", rid, **approver)
        assert client.approval(rid).status == ApprovalStatus.PENDING  # the command decided nothing
        with pytest.raises(ApprovalUnverifiedError) as from_python:  # the Python client checks too
            client.approve(rid, by="ana")
        assert client.approval(rid).status == ApprovalStatus.PENDING
        client.approve(rid, by="ana", trust_unverified_request=True)  # an approver who signs it anyway
        result = job.result(timeout=JOB_TIMEOUT_S)
    finally:
        r.close()
    assert genuine.returncode == 0 and "verified:    yes: tool, arguments, call hash" in genuine.stdout, (
        genuine
    )
    assert shown.returncode == 0, shown.stderr
    [signed_line] = [line for line in shown.stdout.splitlines() if line.startswith("verified:")]
    assert "NO, REWRITTEN IN REDIS: arguments differ from what the worker signed" in signed_line, shown.stdout
    verdict = json.loads(shown_json.stdout)["signed_request"]
    assert verdict["state"] == "differs" and verdict["differing"] == ["arguments"], verdict
    assert refused.returncode == 1 and "not the one its worker signed" in refused.stderr, refused
    assert "REWRITTEN IN REDIS: arguments differ" in str(from_python.value), from_python.value
    assert result.status == JobStatus.SUCCEEDED, result.error
    refunds = [e for e in ledger(data) if e["tool"] == "issue_refund"][-1:]
    assert [(e["order_id"], e["amount"]) for e in refunds] == [("O-1", 25.0)]  # the genuine call only
    assert "O-9" not in json.dumps(ledger(data))
    record(
        "approvals: a pending request's arguments rewritten in Redis",
        "runc",
        True,
        f"show: {signed_line[:200]}; approve exit {refused.returncode}; the genuine call ran",
    )


# -- row 5: a public key swapped under a genuine key id ----------------------------------------------
def test_a_public_key_swapped_under_a_genuine_key_id_is_flagged_refused_and_stops_the_worker(
    gated: FleetWorker,
) -> None:
    client = gated.client
    job = client.submit("Look up order five", tools=["lookup_order"], model=gated.model)
    genuine = job.result(timeout=JOB_TIMEOUT_S)
    assert genuine.status == JobStatus.SUCCEEDED, genuine.error
    r, keys = attacker_redis(gated)
    [kid] = {e["key"] for _id, e in r.xrange(keys.audit(job.job_id)) if e.get("key")}
    stored_info = r.hget(keys.signing_keys, kid)
    assert stored_info is not None
    original = KeyInfo.model_validate_json(stored_info)
    attacker = WorkerKey.generate(original.worker)
    swapped = original.model_copy(update={"public_key": attacker.info.public_key})
    record_before = r.hgetall(keys.job(job.job_id))
    entries_before = [fields for _id, fields in r.xrange(keys.audit(job.job_id))]
    # The forgery: the result changed, the seal committing to it, every entry re-signed with the
    # attacker's key but under the genuine key id, whose register entry now holds the attacker's key.
    data = json.loads(record_before["result"])
    data["result"] = {"order_id": "O-5", "paid": 1_000_000.0}
    forged_json = json.dumps(data)
    prev, forged_entries = "", []
    for index, fields in enumerate(entries_before):
        event = fields["event"]
        if index == len(entries_before) - 1:
            sealed = json.loads(event)
            sealed["data"]["record"] = record_commitment(forged_json)
            event = canonical_json(sealed)
        link = link_hash(prev, event)
        sig = attacker.sign(signed_message(job.job_id, link)) if index else ""
        forged_entries.append({**fields, "event": event, "hash": link, "sig": sig})
        prev = link
    out = gated.fleet.folder / "exported-keys.json"
    try:
        r.hset(keys.signing_keys, kid, swapped.model_dump_json())
        pipe = r.pipeline(transaction=True)
        pipe.delete(keys.audit(job.job_id))
        for fields in forged_entries:
            pipe.xadd(keys.audit(job.job_id), fields)
        pipe.hset(keys.job(job.job_id), mapping={"result": forged_json, "audit_head": prev})
        pipe.execute()
        listed = cli(gated, "keys", "list")
        listed_json = cli(gated, "keys", "list", "--json")
        exported = cli(gated, "keys", "export", "--out", str(out))
        shown = cli(gated, "result", job.job_id)
        audited = cli(gated, "audit", job.job_id, "--verify")
        restart = subprocess.run(
            [SANDFLEET, "worker", "--hostname", gated.worker.name],
            env=gated.fleet.worker_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        pipe = r.pipeline(transaction=True)
        pipe.hset(keys.signing_keys, kid, stored_info)
        pipe.delete(keys.audit(job.job_id), keys.job(job.job_id))
        pipe.hset(keys.job(job.job_id), mapping=record_before)
        for fields in entries_before:
            pipe.xadd(keys.audit(job.job_id), fields)
        pipe.execute()
        r.close()
    assert listed.returncode == 4, listed.stdout + listed.stderr
    [flagged] = [line for line in listed.stdout.splitlines() if line.startswith(kid)]
    assert "INVALID" in flagged and "not the hash of" in listed.stderr, listed.stdout + listed.stderr
    rows = [json.loads(line) for line in listed_json.stdout.splitlines()]
    assert {"key_id": kid, "status": "invalid"}.items() <= next(x for x in rows if x["key_id"] == kid).items()
    assert exported.returncode == 4 and not out.exists(), exported.stdout + exported.stderr
    assert kid in exported.stderr and "not the hash of its public key" in exported.stderr
    assert shown.returncode == 4 and shown.stdout == "" and "1000000" not in shown.stdout
    assert "registered entry is not used" in shown.stderr, shown.stderr
    assert audited.returncode == 1 and "BROKEN" in audited.stderr
    assert restart.returncode != 0 and "refusing to start" in restart.stderr, restart.stderr[-2000:]
    assert "is not its own public key" in restart.stderr, restart.stderr[-2000:]
    assert client.get(job.job_id).verify().verified  # restored: the genuine record verifies again
    record(
        "keys: attacker's public key stored under a genuine worker's key id",
        "redis",
        True,
        f"keys list exit 4 flagged; export exit 4, nothing written; result exit 4: {shown.stderr.strip()[:200]}; "
        f"worker restart: {restart.stderr.strip().splitlines()[-1][:200]}",
    )
