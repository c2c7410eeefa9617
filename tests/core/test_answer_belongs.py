"""The pure parts of "the answer belongs to the question", with no Redis: the spec digest a client
keeps and compares with entry 0, the batch creator's digest, the local ledger and the submitter token.

The hostile tests through a real worker and the CLI are in tests/security/test_answer_belongs.py.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from sandfleet.core.audit import signed_entry
from sandfleet.core.batch_creator import creator_digest, is_own_job
from sandfleet.core.chain import (
    GENESIS_HASH,
    ChainEntry,
    encode_event,
    link_hash,
    record_commitment,
    sha256_hex,
    spec_commitment,
)
from sandfleet.core.contracts import AuditEvent, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import ClientStateError, SpecMismatchError, UnverifiedResultError
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyInfo, KeyRing, WorkerKey
from sandfleet.core.verify import JobEvidence, VerdictState, committed_spec_sha256, verify_job
from sandfleet.producer.checked import checked_result, checked_verdict, unverified_error
from sandfleet.producer.ledger import LEDGER_NAME, SubmissionLedger
from sandfleet.producer.submitter import TOKEN_NAME, submitter_token

WORKER = "w1@host"
ASKED = JobSpec(question="What is six times seven?")
OTHER = JobSpec(question="Answer the other question")


class Signer:
    def __init__(self, key: WorkerKey) -> None:
        self.key, self.worker = key, key.worker

    def sign(self, message: bytes) -> tuple[str, str]:
        return self.key.sign(message), self.key.key_id

    def key_info(self) -> KeyInfo:
        return self.key.info


def job_evidence(key: WorkerKey, spec: JobSpec, *, finish: bool = True) -> JobEvidence:
    """A job whose record and entry 0 hold ``spec``, run and sealed by ``key``'s worker: exactly what a
    worker signs after someone rewrote the queued spec and entry 0 (their digests agree)."""
    spec_json, digest = spec_commitment(spec)
    signer = Signer(key)
    queued = encode_event(
        AuditEvent(ts=1, job_id="j", kind="state", data={"status": "queued", "spec_sha256": digest})
    )
    entries = [ChainEntry(queued, link_hash(GENESIS_HASH, queued))]
    running = encode_event(
        AuditEvent(
            ts=2,
            job_id="j",
            kind="state",
            data={"status": "running", "worker": WORKER, "spec_sha256": digest},
        )
    )
    entries.append(signed_entry(signer, "j", entries[-1].hash, running))
    record = {"job_id": "j", "status": "running", "spec": spec_json, "worker": WORKER}
    if finish:
        result_json = JobResult(job_id="j", status=JobStatus.SUCCEEDED, result=666).model_dump_json()
        data = {"status": "succeeded", "worker": WORKER, "record": record_commitment(result_json)}
        seal = encode_event(AuditEvent(ts=3, job_id="j", kind="state", data=data))
        entries.append(signed_entry(signer, "j", entries[-1].hash, seal))
        record.update(status="succeeded", result=result_json)
    record.update(audit_head=entries[-1].hash, audit_count=str(len(entries)))
    return JobEvidence("j", record, entries)


@pytest.fixture
def key() -> WorkerKey:
    return WorkerKey.generate(WORKER)


@pytest.fixture
def ring(key: WorkerKey) -> KeyRing:
    return KeyRing([key.info], "k")


# -- the spec digest --------------------------------------------------------------------------------
def test_the_digest_is_of_the_bytes_the_record_stores() -> None:
    spec_json, digest = spec_commitment(ASKED)
    assert spec_json == ASKED.model_dump_json() and digest == sha256_hex(spec_json)
    assert spec_commitment(JobSpec(question="What is six times seven?"))[1] == digest
    assert spec_commitment(JobSpec(question="What is six times seven!"))[1] != digest
    assert spec_commitment(ASKED.model_copy(update={"priority": 5}))[1] != digest


def test_a_proven_answer_to_another_spec_is_refused_naming_both_digests(
    key: WorkerKey, ring: KeyRing
) -> None:
    rewritten = job_evidence(key, OTHER)
    assert verify_job(rewritten, ring).verified  # the chain alone cannot tell: entry 0 is unsigned
    assert committed_spec_sha256(rewritten) == spec_commitment(OTHER)[1]

    asked = spec_commitment(ASKED)[1]
    checked = checked_result(rewritten, ring, asked)
    assert checked.result is None and checked.other_question
    assert checked.verdict.state == VerdictState.MISMATCHED
    [problem] = checked.verdict.problems
    assert "answers a different question than the one submitted" in problem
    assert spec_commitment(OTHER)[1][:16] in problem and asked[:16] in problem
    error = unverified_error([checked])
    assert isinstance(error, SpecMismatchError) and error.problems == [f"j: {problem}"]
    assert "job j: the record answers a different question" in str(error)

    unfinished = checked_verdict(job_evidence(key, OTHER, finish=False), ring, asked)
    assert unfinished.state == VerdictState.MISMATCHED  # refused before it even ends


def test_the_answer_to_the_spec_submitted_is_served(key: WorkerKey, ring: KeyRing) -> None:
    checked = checked_result(job_evidence(key, ASKED), ring, spec_commitment(ASKED)[1])
    assert checked.verified and not checked.other_question and checked.result is not None
    assert checked.result.result == 666
    unknown = checked_result(job_evidence(key, OTHER), ring, None)  # no digest kept: the chain only
    assert unknown.verified and not unknown.other_question


def test_a_broken_chain_stays_an_unverified_result_not_a_spec_mismatch(key: WorkerKey, ring: KeyRing) -> None:
    evidence = job_evidence(key, ASKED)
    evidence.record["result"] = evidence.record["result"].replace("666", "667")
    checked = checked_result(evidence, ring, spec_commitment(ASKED)[1])
    error = unverified_error([checked])
    assert type(error) is UnverifiedResultError and not checked.other_question
    assert checked_result(JobEvidence("j", {}), ring, "0" * 64).verdict.state == VerdictState.MISSING


# -- the batch creator ------------------------------------------------------------------------------
def test_a_creator_digest_names_one_batch_of_one_token() -> None:
    digest = creator_digest("token-a" * 4, "b-1")
    assert digest == creator_digest("token-a" * 4, "b-1") and len(digest) == 64
    assert digest != creator_digest("token-b" * 4, "b-1")  # another submitter
    assert digest != creator_digest("token-a" * 4, "b-2")  # another batch of the same submitter
    assert "token-a" not in digest
    with pytest.raises(ValueError, match="needs the submitter token"):
        creator_digest("", "b-1")


def test_only_records_naming_the_batch_and_its_creator_are_its_own() -> None:
    mine = creator_digest("t" * 20, "b")
    assert is_own_job("b", mine, {"batch_id": "b", "batch_creator": mine})
    assert not is_own_job("b", mine, {"batch_id": "b", "batch_creator": creator_digest("u" * 20, "b")})
    assert not is_own_job("b", mine, {"batch_id": "b"})  # written without a creator
    assert not is_own_job("b", mine, {"batch_id": "c", "batch_creator": mine})
    assert is_own_job("b", None, {"batch_id": "b"})  # a batch and its jobs from an older producer


# -- the ledger -------------------------------------------------------------------------------------
def test_the_ledger_remembers_digests_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "state" / LEDGER_NAME
    first = SubmissionLedger(path, max_jobs=100)
    first.remember([("a", "1" * 64), ("b", "2" * 64)])
    later = SubmissionLedger(path, max_jobs=100)  # another process of the same user
    assert later.spec_digest("a") == "1" * 64 and later.spec_digest("nope") is None
    later.remember([("c", "3" * 64)])
    assert first.spec_digests(["a", "b", "c", "d"]) == {"a": "1" * 64, "b": "2" * 64, "c": "3" * 64}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    first.close()
    later.close()


def test_the_ledger_keeps_only_the_newest_jobs(tmp_path: Path) -> None:
    ledger = SubmissionLedger(tmp_path / LEDGER_NAME, max_jobs=3)
    for n in range(5):
        ledger.remember([(f"job-{n}", f"{n}" * 64)])
    assert ledger.spec_digests([f"job-{n}" for n in range(5)]) == {f"job-{n}": f"{n}" * 64 for n in (2, 3, 4)}
    ledger.remember([(f"batch-{n}", "f" * 64) for n in range(10)])  # one batch larger than the bound
    assert len(ledger.spec_digests([f"batch-{n}" for n in range(10)] + ["job-4"])) == 3
    ledger.close()


def test_many_ids_are_looked_up_in_chunks(tmp_path: Path) -> None:
    ledger = SubmissionLedger(tmp_path / LEDGER_NAME, max_jobs=10_000)
    ledger.remember([(f"j{n}", f"{n:064d}") for n in range(1200)])
    assert len(ledger.spec_digests([f"j{n}" for n in range(1300)])) == 1200
    ledger.close()


def test_writers_in_many_threads_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_NAME
    ledgers = [SubmissionLedger(path, max_jobs=10_000) for _ in range(4)]

    def write(index: int) -> None:
        for n in range(50):
            ledgers[index].remember([(f"t{index}-{n}", "a" * 64)])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ledgers[0].spec_digests([f"t{i}-{n}" for i in range(4) for n in range(50)])) == 200
    for ledger in ledgers:
        ledger.close()


def test_reading_makes_no_ledger_and_an_unwritable_folder_is_named(tmp_path: Path) -> None:
    path = tmp_path / "never" / LEDGER_NAME
    assert SubmissionLedger(path, max_jobs=10).spec_digests(["a"]) == {}
    assert not path.parent.exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(ClientStateError, match="SANDFLEET_CLIENT_STATE_DIR") as caught:
        SubmissionLedger(blocked / LEDGER_NAME, max_jobs=10).remember([("a", "1" * 64)])
    assert "not a folder" not in str(caught.value)  # names the path, never quotes a file


def test_a_ledger_of_zero_jobs_is_none() -> None:
    assert SubmissionLedger.from_settings(Settings(client_ledger_max_jobs=0)) is None


# -- the submitter token ----------------------------------------------------------------------------
def test_the_token_is_made_once_and_kept_private(tmp_path: Path) -> None:
    settings = Settings(client_state_dir=str(tmp_path / "client"))
    token = submitter_token(settings)
    assert len(token) >= 40 and submitter_token(settings) == token
    path = tmp_path / "client" / TOKEN_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == token
    assert submitter_token(Settings(client_state_dir=str(tmp_path / "other"))) != token
    assert submitter_token(settings.model_copy(update={"submitter_token": "shared-by-the-team"})) == (
        "shared-by-the-team"
    )


def test_processes_racing_to_make_the_token_agree(tmp_path: Path) -> None:
    settings = Settings(client_state_dir=str(tmp_path / "client"))
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(submitter_token(settings))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(tokens)) == 1 and len(tokens) == 8
    assert os.listdir(tmp_path / "client") == [TOKEN_NAME]  # no drafts left behind


def test_a_short_token_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / TOKEN_NAME).write_text("short\n")
    with pytest.raises(ClientStateError, match="shorter than 16 characters: delete the file"):
        submitter_token(Settings(client_state_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="at least 16 characters"):
        Settings(submitter_token="short")
