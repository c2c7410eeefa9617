"""The pure parts of verifiable records, with no Redis: record commitments, Ed25519 keys and key files,
key sets, verdicts on hand-built evidence, and audit bundles."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sandfleet.core.audit import signed_entry
from sandfleet.core.bundle import BundleError, read_bundle, write_bundle
from sandfleet.core.chain import (
    GENESIS_HASH,
    ChainEntry,
    commitment_differences,
    encode_event,
    link_hash,
    record_commitment,
    sha256_hex,
    signed_message,
)
from sandfleet.core.contracts import AuditEvent, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import SigningKeyError
from sandfleet.core.signing import (
    FileSigner,
    KeyInfo,
    KeyRing,
    KeyStatus,
    WorkerKey,
    key_path,
    read_key,
    write_key,
)
from sandfleet.core.verify import JobEvidence, VerdictState, verify_job

WORKER = "w1@host"


def test_a_commitment_names_the_fields_that_changed() -> None:
    stored = JobResult(job_id="j", status=JobStatus.SUCCEEDED, result={"a": 1}).model_dump_json()
    commitment = record_commitment(stored)
    assert commitment_differences(commitment, stored) == []
    data = json.loads(stored)
    data["result"] = {"a": 2}
    del data["model"]
    data["extra"] = True
    assert commitment_differences(commitment, json.dumps(data)) == [
        "field 'result' differs from what the chain committed",
        "field 'model' was removed",
        "field 'extra' was added",
    ]
    respaced = json.dumps(json.loads(stored), indent=1)  # same values, other bytes
    assert commitment_differences(commitment, respaced) == [
        "the final record's bytes differ from what the chain committed (same fields)"
    ]
    assert commitment_differences(commitment, "not json") == ["the final record is not JSON"]


def test_a_key_ring_checks_signatures_and_says_why_not() -> None:
    key, other = WorkerKey.generate(WORKER), WorkerKey.generate(WORKER)
    ring = KeyRing([key.info], "test keys")
    message = signed_message("job", "abc")
    assert ring.check(key.key_id, message, key.sign(message)) is None
    assert "does not verify" in ring.check(key.key_id, message, other.sign(message))
    assert "does not verify" in ring.check(key.key_id, message, "not base64!")
    assert "not in the key set (test keys)" in ring.check(other.key_id, message, other.sign(message))
    revoked = ring.with_revocations([key.info.with_status(KeyStatus.REVOKED), other.info])
    assert "is revoked" in revoked.check(key.key_id, message, key.sign(message))
    assert other.key_id not in revoked  # revocations never add keys


def test_an_exported_key_set_reads_back_and_a_bad_one_is_refused() -> None:
    key = WorkerKey.generate(WORKER)
    exported = KeyRing([key.info], "x").export("fleet")
    assert KeyRing.from_export(json.loads(json.dumps(exported)), "file").get(key.key_id) == key.info
    with pytest.raises(SigningKeyError, match="not a Sandfleet key set"):
        KeyRing.from_export({"keys": []}, "file")
    with pytest.raises(SigningKeyError, match="invalid key entry"):
        KeyRing.from_export({**exported, "keys": [{"key_id": "x"}]}, "file")


def test_key_files_are_private_and_a_signer_follows_a_replaced_file(tmp_path: Path) -> None:
    path = key_path(tmp_path, "w1@host/../x")
    assert path.parent == tmp_path / "keys" and "/" not in path.name.removesuffix(".pem")
    signer = FileSigner(path, WORKER)  # made on first use
    assert (
        stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    )
    first = signer.key.key_id
    assert read_key(path, WORKER).key_id == first
    write_key(path, WorkerKey.generate(WORKER))  # a rotation, as `sandfleet keys rotate` does it
    sig, key_id = signer.sign(b"m")
    assert key_id != first and KeyRing([read_key(path, WORKER).info], "k").check(key_id, b"m", sig) is None
    path.unlink()
    with pytest.raises(SigningKeyError, match="is gone"):
        signer.sign(b"m")


def test_a_key_file_that_is_not_an_ed25519_key_is_refused(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "rsa.pem"
    path.write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(SigningKeyError, match="not an Ed25519 private key"):
        read_key(path, WORKER)
    path.write_text("garbage")
    with pytest.raises(SigningKeyError, match="cannot read the signing key"):
        read_key(path, WORKER)


class Signer:
    def __init__(self, key: WorkerKey) -> None:
        self.key, self.worker = key, key.worker

    def sign(self, message: bytes) -> tuple[str, str]:
        return self.key.sign(message), self.key.key_id

    def key_info(self) -> KeyInfo:
        return self.key.info


def evidence(key: WorkerKey, *, finish: bool = True) -> JobEvidence:
    """A job as the store writes one: queued (unsigned), running, a program, and its seal."""
    spec_json = JobSpec(question="q").model_dump_json()
    signer = Signer(key)
    queued = encode_event(
        AuditEvent(
            ts=1, job_id="j", kind="state", data={"status": "queued", "spec_sha256": sha256_hex(spec_json)}
        )
    )
    entries = [ChainEntry(queued, link_hash(GENESIS_HASH, queued))]
    running = {"status": "running", "worker": WORKER, "spec_sha256": sha256_hex(spec_json)}
    for kind, data in (("state", running), ("program", {"program": "print(1)"})):
        event = encode_event(AuditEvent(ts=2, job_id="j", kind=kind, data=data))
        entries.append(signed_entry(signer, "j", entries[-1].hash, event))
    record = {"job_id": "j", "status": "running", "spec": spec_json, "worker": WORKER}
    if finish:
        result_json = JobResult(job_id="j", status=JobStatus.SUCCEEDED, result=1).model_dump_json()
        data = {"status": "succeeded", "worker": WORKER, "record": record_commitment(result_json)}
        seal = encode_event(AuditEvent(ts=3, job_id="j", kind="state", data=data))
        entries.append(signed_entry(signer, "j", entries[-1].hash, seal))
        record.update(status="succeeded", result=result_json)
    record.update(audit_head=entries[-1].hash, audit_count=str(len(entries)))
    return JobEvidence("j", record, entries)


def test_verdicts_on_hand_built_evidence() -> None:
    key = WorkerKey.generate(WORKER)
    ring = KeyRing([key.info], "k")
    assert verify_job(evidence(key), ring).state == VerdictState.VERIFIED
    assert verify_job(evidence(key, finish=False), ring).state == VerdictState.UNFINISHED
    assert verify_job(JobEvidence("j", {}), ring).state == VerdictState.MISSING
    orphan = verify_job(JobEvidence("j", {}, evidence(key).entries), ring)
    assert orphan.state == VerdictState.MISMATCHED and orphan.problems == [
        "the job has audit events but no record"
    ]
    stranger = verify_job(evidence(WorkerKey.generate(WORKER)), ring)
    assert stranger.bad_index == 1 and "not in the key set" in stranger.problems[0]


def test_a_bundle_round_trips_and_a_broken_file_is_refused(tmp_path: Path) -> None:
    key = WorkerKey.generate(WORKER)
    path = tmp_path / "bundle.json"
    write_bundle(path, [evidence(key)], KeyRing([key.info], "k"), "fleet")
    [job], ring = read_bundle(path)
    assert verify_job(job, ring).verified and "inside the bundle" in ring.source
    path.write_text(json.dumps({"format": "sandfleet-audit-bundle/1", "jobs": [{"job_id": "j"}]}))
    with pytest.raises(BundleError, match="malformed"):
        read_bundle(path)
    path.write_text("{}")
    with pytest.raises(BundleError, match="not a Sandfleet audit bundle"):
        read_bundle(path)
