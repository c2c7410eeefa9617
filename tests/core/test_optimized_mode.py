"""Verification under ``python -O``, which strips every ``assert``: the checks that used to be asserts
in core/verify.py and core/key_registry.py (issue 23) must still fail a changed key ring and a
register that lost a key just written, instead of crashing on None or passing.

The checks run in a ``python -O`` subprocess (the test process keeps its asserts for pytest).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import redis

from sandfleet.core.verify import VerdictState

SCRIPT = r"""
import json, sys

import redis

from sandfleet.core.audit import signed_entry
from sandfleet.core.chain import GENESIS_HASH, ChainEntry, encode_event, link_hash, sha256_hex
from sandfleet.core.contracts import AuditEvent, JobSpec
from sandfleet.core.errors import SigningKeyError
from sandfleet.core.key_registry import KeyRegistry
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.signing import KeyRing, WorkerKey
from sandfleet.core.verify import JobEvidence, verify_job

WORKER = "w1@host"
key = WorkerKey.generate(WORKER)


class Signer:
    worker = WORKER

    def sign(self, message):
        return key.sign(message), key.key_id

    def key_info(self):
        return key.info


class ChangingRing(KeyRing):
    # the key checks out, then is gone when the check asks for its worker: the ring changed under it
    def get(self, key_id):
        return None


class ForgetfulRegistry(KeyRegistry):
    # Redis answers the write, then does not have it
    def get(self, key_id):
        return None


spec_json = JobSpec(question="q").model_dump_json()
queued = encode_event(
    AuditEvent(ts=1, job_id="j", kind="state", data={"status": "queued", "spec_sha256": sha256_hex(spec_json)})
)
entries = [ChainEntry(queued, link_hash(GENESIS_HASH, queued))]
running = {"status": "running", "worker": WORKER, "spec_sha256": sha256_hex(spec_json)}
event = encode_event(AuditEvent(ts=2, job_id="j", kind="state", data=running))
entries.append(signed_entry(Signer(), "j", entries[-1].hash, event))
record = {"job_id": "j", "status": "running", "spec": spec_json, "worker": WORKER,
          "audit_head": entries[-1].hash, "audit_count": str(len(entries))}
evidence = JobEvidence("j", record, entries)
out = {
    "optimize": sys.flags.optimize,
    "plain": verify_job(evidence, KeyRing([key.info], "k")).state,
}
changed = verify_job(evidence, ChangingRing([key.info], "k"))
out["changed"] = [changed.state, changed.problems]
client = redis.Redis.from_url(sys.argv[1])
try:
    ForgetfulRegistry(client, FleetKeys(sys.argv[2])).register(key.info)
    out["register"] = "returned"
except SigningKeyError as e:
    out["register"] = str(e)
print(json.dumps(out))
"""


def test_verification_fails_a_changed_key_ring_with_asserts_stripped(redis_server: str) -> None:
    prefix = f"opt-{uuid.uuid4().hex[:8]}:"
    try:
        done = subprocess.run(
            [sys.executable, "-O", "-c", SCRIPT, redis_server, prefix],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        client = redis.Redis.from_url(redis_server)
        if keys := list(client.scan_iter(match=f"{prefix}*")):
            client.delete(*keys)
        client.close()
    assert done.returncode == 0, done.stderr[-3000:]  # a stripped assert let None through: a crash
    out = json.loads(done.stdout)
    assert out["optimize"] == 1, out  # asserts were stripped
    assert out["plain"] == VerdictState.UNFINISHED, out  # the evidence itself holds
    state, problems = out["changed"]
    assert state == VerdictState.MISMATCHED, out
    assert any("left the key ring during the check" in p for p in problems), out
    assert "is not in the register right after it was written" in out["register"], out
