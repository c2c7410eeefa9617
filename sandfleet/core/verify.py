"""Checking a job's evidence (its record and its audit entries) against a key set: pure, no Redis.

The same function checks a job read from Redis, and a job in an exported bundle on a machine with no
Redis at all. What holds when :func:`verify_job` says ``verified``:

- every entry links to the one before (SHA-256) and the record's tip is the last entry's hash;
- entry 0 is the producer's ``queued`` event and commits to the record's spec; every later entry is
  signed by a key of the set that is not revoked, by a worker that started the job (its ``running``
  event, signed by its own key, naming it and the same spec);
- a record with a final result has exactly one seal, last, signed by the worker the record names,
  committing to the record's bytes, status and worker; a record without one has no seal;
- the artifacts the record lists are the ones the chain's ``artifacts`` event recorded, and, when
  the evidence carries the digests of the stored bytes (``artifact_digests``), each file's stored
  bytes hash to the SHA-256 the record lists (a file changed or removed at rest shows).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandfleet.core.chain import (
    GENESIS_HASH,
    ChainEntry,
    commitment_differences,
    link_hash,
    sha256_hex,
    signed_message,
)
from sandfleet.core.contracts import AuditEvent, AuditKind, JobStatus
from sandfleet.core.signing import KeyRing

FINAL_VALUES = frozenset(s.value for s in JobStatus if s.is_final)


class VerdictState(StrEnum):
    VERIFIED = "verified"  # final record proven by its chain
    UNFINISHED = "unfinished"  # the chain holds so far; the job has not ended
    MISMATCHED = "mismatched"  # record and chain disagree, or the chain does not hold
    MISSING = "missing"  # no record (never submitted, or past retention)


class Verdict(BaseModel):
    """What checking one job found. ``verified`` is true only for a proven final record."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    state: VerdictState
    status: str | None = None
    events: int = 0
    problems: list[str] = Field(default_factory=list)
    bad_index: int | None = Field(None, description="the first entry that does not hold")
    signers: dict[str, str] = Field(default_factory=dict, description="key id -> worker")
    key_source: str = ""

    @property
    def verified(self) -> bool:
        return self.state == VerdictState.VERIFIED

    @property
    def holds(self) -> bool:
        """Whether nothing disagrees (verified, or unfinished so far)."""
        return self.state in (VerdictState.VERIFIED, VerdictState.UNFINISHED)

    def describe(self) -> str:
        if self.state == VerdictState.VERIFIED:
            signers = ", ".join(sorted(set(self.signers.values())))
            return f"verified: {self.events} events, final record proven ({self.status}; signed by {signers})"
        if self.state == VerdictState.UNFINISHED:
            return f"holds so far: {self.events} events, the job has not ended ({self.status})"
        if self.state == VerdictState.MISSING:
            return "missing: " + "; ".join(self.problems)
        return "MISMATCHED: " + "; ".join(self.problems)


@dataclass(frozen=True)
class JobEvidence:
    """One job as stored: its record's fields (empty when there is none) and its audit entries."""

    job_id: str
    record: dict[str, str]
    entries: list[ChainEntry] = field(default_factory=list)
    # listed SHA-256 -> SHA-256 of the bytes stored for it (None: nothing stored); None: not checked
    artifact_digests: dict[str, str | None] | None = None


def verify_job(evidence: JobEvidence, ring: KeyRing) -> Verdict:
    """Check one job's record against its chain and the chain against ``ring``."""
    return _Check(evidence, ring).run()


class _Check:
    def __init__(self, evidence: JobEvidence, ring: KeyRing) -> None:
        self.job_id = evidence.job_id
        self.record = evidence.record
        self.entries = evidence.entries
        self.artifact_digests = evidence.artifact_digests
        self.ring = ring
        self.problems: list[str] = []
        self.bad_index: int | None = None
        self.signers: dict[str, str] = {}
        self.events: list[AuditEvent | None] = []

    def fail(self, message: str, index: int | None = None) -> None:
        if index is not None:
            message = f"event {index}: {message}"
            self.bad_index = index if self.bad_index is None else min(self.bad_index, index)
        self.problems.append(message)

    def run(self) -> Verdict:
        if not self.record or "status" not in self.record:
            if not self.entries:
                return self.verdict(VerdictState.MISSING, ["no record (never submitted, or past retention)"])
            self.fail("the job has audit events but no record")
            return self.verdict(VerdictState.MISMATCHED)
        self.check_entries()
        self.check_tip()
        self.check_seal()
        self.check_artifacts(evidence_digests=self.artifact_digests)
        if self.problems:
            return self.verdict(VerdictState.MISMATCHED)
        final = self.record.get("status") in FINAL_VALUES
        return self.verdict(VerdictState.VERIFIED if final else VerdictState.UNFINISHED)

    def verdict(self, state: VerdictState, problems: list[str] | None = None) -> Verdict:
        return Verdict(
            job_id=self.job_id,
            state=state,
            status=self.record.get("status"),
            events=len(self.entries),
            problems=problems if problems is not None else self.problems,
            bad_index=self.bad_index,
            signers=self.signers,
            key_source=self.ring.source,
        )

    # -- the entries --------------------------------------------------------------------------------
    def check_entries(self) -> None:
        prev = GENESIS_HASH
        started: set[str] = set()  # workers whose running event came before
        spec_digest = sha256_hex(self.record.get("spec", ""))
        for index, entry in enumerate(self.entries):
            event = self.parse(index, entry)
            self.events.append(event)
            if link_hash(prev, entry.event) != entry.hash:
                self.fail(
                    "its hash does not chain to the entry before (edited, removed, inserted or moved)", index
                )
                return  # every later link differs too: the first break is the finding
            prev = entry.hash
            if event is None:
                return
            if index == 0:
                self.check_genesis(event, spec_digest)
                continue
            signer = self.check_signature(index, entry)
            if signer is None:
                return
            if event.kind == AuditKind.STATE and event.data.get("status") == JobStatus.RUNNING.value:
                if event.data.get("worker") != signer:
                    self.fail(
                        f"says worker {event.data.get('worker')!r} ran the job but is signed by the key "
                        f"of worker {signer!r}",
                        index,
                    )
                    return
                if event.data.get("spec_sha256") != spec_digest:
                    self.fail("the worker ran a spec other than the record's", index)
                started.add(signer)
            elif signer not in started and not _is_seal(event):  # a refusal is sealed without a start
                self.fail(f"signed by worker {signer!r}, which never started this job", index)
                return

    def parse(self, index: int, entry: ChainEntry) -> AuditEvent | None:
        try:
            event = AuditEvent.model_validate_json(entry.event)
        except ValidationError:
            self.fail("not an audit event", index)
            return None
        if event.job_id != self.job_id:
            self.fail(f"belongs to job {event.job_id}, not {self.job_id}", index)
            return None
        return event

    def check_genesis(self, event: AuditEvent, spec_digest: str) -> None:
        if event.kind != AuditKind.STATE or event.data.get("status") != JobStatus.QUEUED.value:
            self.fail("the chain does not start with the producer's queued event", 0)
        elif event.data.get("spec_sha256") != spec_digest:
            self.fail("the record's spec is not the one submitted", 0)

    def check_signature(self, index: int, entry: ChainEntry) -> str | None:
        """The signing worker's name, or None (problem recorded) if the signature does not hold."""
        if not entry.sig:
            self.fail("not signed", index)
            return None
        problem = self.ring.check(entry.key, signed_message(self.job_id, entry.hash), entry.sig)
        if problem is not None:
            self.fail(problem, index)
            return None
        info = self.ring.get(entry.key)
        if info is None:  # check() found it; a ring that changed under the check is a failure too
            self.fail(f"key {entry.key} left the key ring during the check", index)
            return None
        self.signers[entry.key] = info.worker
        return info.worker

    # -- the record ---------------------------------------------------------------------------------
    def check_tip(self) -> None:
        last = self.entries[-1].hash if self.entries else GENESIS_HASH
        if self.record.get("audit_head", GENESIS_HASH) != last:
            self.fail(
                "the record's chain tip is not the last entry's hash: entries were removed from the end "
                "or the tip was rewritten",
                len(self.entries),
            )
        count = self.record.get("audit_count")
        if count is not None and count != str(len(self.entries)):
            self.fail(f"the record counts {count} audit events; the stream holds {len(self.entries)}")

    def check_seal(self) -> None:
        sealed_events = [(i, e) for i, e in enumerate(self.events) if e is not None and _is_seal(e)]
        seals = [i for i, _e in sealed_events]
        result_json = self.record.get("result")
        status = self.record.get("status")
        if not result_json:
            if seals:
                sealed = sealed_events[0][1]
                self.fail(
                    f"the chain is sealed ({sealed.data.get('status')}) but the record has no final result"
                )
            elif status in FINAL_VALUES:
                self.fail(f"the record says {status} but has no final result")
            return
        if not seals:
            if self.bad_index is None:  # a broken chain was already reported
                self.fail("the record has a final result but the chain has no seal", len(self.entries))
            return
        if len(seals) > 1:
            self.fail("the chain has more than one final event", seals[1])
        index = seals[0]
        if index != len(self.entries) - 1:
            self.fail("events follow the seal", index + 1)
        seal = sealed_events[0][1]
        commitment = seal.data.get("record")
        if not isinstance(commitment, dict):
            self.fail("the final event commits to no record", index)
            return
        for difference in commitment_differences(commitment, result_json):
            self.fail(f"the final record is not the one the chain sealed: {difference}")
        if status != seal.data.get("status"):
            self.fail(f"the record's status {status!r} is not the sealed status {seal.data.get('status')!r}")
        if self.record.get("worker") != seal.data.get("worker"):
            self.fail(
                f"the record says worker {self.record.get('worker')!r} finished the job; "
                f"the seal names {seal.data.get('worker')!r}"
            )
        signer = self.signers.get(self.entries[index].key)
        if signer is not None and signer != seal.data.get("worker"):
            self.fail(f"the seal names worker {seal.data.get('worker')!r} but is signed by {signer!r}", index)

    # -- the artifacts ------------------------------------------------------------------------------
    def check_artifacts(self, evidence_digests: dict[str, str | None] | None) -> None:
        if not self.record.get("result"):  # nothing is listed before the final record; a delivery that
            return  # stored artifacts and died before its final write left their event behind
        listed = listed_artifacts(self.record.get("result"))
        recorded: list[dict[str, object]] = []
        for event in self.events:
            if event is not None and event.kind == AuditKind.ARTIFACTS:
                files = event.data.get("files")
                recorded = files if isinstance(files, list) else []
        in_chain = sorted((str(f.get("name")), str(f.get("sha256"))) for f in recorded if isinstance(f, dict))
        if sorted(listed) != in_chain:
            self.fail("the record's artifacts are not the ones the audit chain recorded")
        if evidence_digests is None:
            return
        for name, digest in listed:
            stored = evidence_digests.get(digest)
            if stored is None:
                self.fail(f"artifact {name!r}: its stored bytes are missing (expired, pruned or deleted)")
            elif stored != digest:
                self.fail(
                    f"artifact {name!r}: its stored bytes are not the ones the chain commits to "
                    f"(sha256 {stored[:16]}..., committed {digest[:16]}...)"
                )


def committed_spec_sha256(evidence: JobEvidence) -> str | None:
    """The spec digest the job's chain commits to: the ``spec_sha256`` of entry 0, the producer's
    ``queued`` event (every later entry is signed over a link that includes it); None if there is no
    entry 0 or it names none. A verified record's spec hashes to the same digest."""
    if not evidence.entries:
        return None
    try:
        event = AuditEvent.model_validate_json(evidence.entries[0].event)
    except ValidationError:
        return None
    digest = event.data.get("spec_sha256")
    return digest if isinstance(digest, str) else None


def listed_artifacts(result_json: str | None) -> list[tuple[str, str]]:
    """(name, sha256) of each artifact a stored JobResult lists; empty when it lists none or does not parse."""
    if not result_json:
        return []
    try:
        data = json.loads(result_json)
        return [(str(a["name"]), str(a["sha256"])) for a in data.get("artifacts") or []]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []


def _is_seal(event: AuditEvent) -> bool:
    return event.kind == AuditKind.STATE and event.data.get("status") in FINAL_VALUES


# -- many jobs --------------------------------------------------------------------------------------
class BatchVerdict(BaseModel):
    """Verdicts of many jobs, with counts by state and the time checking took."""

    model_config = ConfigDict(frozen=True)

    verdicts: list[Verdict]
    seconds: float = 0.0

    def count(self, state: VerdictState) -> int:
        return sum(v.state == state for v in self.verdicts)

    @property
    def events(self) -> int:
        return sum(v.events for v in self.verdicts)

    @property
    def verified(self) -> bool:
        """Every job's final record is proven."""
        return all(v.verified for v in self.verdicts)

    def summary(self) -> str:
        rate = f", {self.events / self.seconds:,.0f} events/s" if self.seconds > 0 else ""
        return (
            f"{len(self.verdicts)} jobs: {self.count(VerdictState.VERIFIED)} verified, "
            f"{self.count(VerdictState.MISMATCHED)} mismatched, {self.count(VerdictState.UNFINISHED)} "
            f"unfinished, {self.count(VerdictState.MISSING)} missing ({self.events} events in "
            f"{self.seconds:.2f} s{rate})"
        )


def verify_jobs(evidences: Iterable[JobEvidence], ring: KeyRing) -> BatchVerdict:
    began = time.perf_counter()
    verdicts = [verify_job(e, ring) for e in evidences]
    return BatchVerdict(verdicts=verdicts, seconds=time.perf_counter() - began)
