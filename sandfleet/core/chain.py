"""The audit hash chain and the final-record commitment, as pure functions.

Each entry of a job's audit stream carries ``hash = SHA-256(previous hash + canonical JSON of the
event)``, starting from the empty string; the job's record keeps the tip (``audit_head``,
``audit_count``). The link has no key, so anyone holding the entries can recompute it: what makes an
entry authentic is its Ed25519 signature (:mod:`sandfleet.core.signing`) over :func:`signed_message`,
made by the worker that wrote it. Changing, removing, reordering or inserting an entry changes every
later link, so every later signature fails.

The producer writes entry 0 (``queued``, unsigned, committing to the spec by hash); every later entry
is a worker's, signed. The last entry of a finished job is its seal: the final ``state`` event, written
in the same atomic step as the final record, whose ``record`` field commits to that record
(:func:`record_commitment`). So the answer a reader is served is the answer the chain proves.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: `sandfleet run` hashes its calls without building the job models
    from sandfleet.core.contracts import AuditEvent, JobSpec

GENESIS_HASH = ""
SIGNATURE_DOMAIN = b"sandfleet-audit-v1"


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def spec_commitment(spec: JobSpec) -> tuple[str, str]:
    """The spec's JSON exactly as the record stores it, and the SHA-256 of those bytes, which entry 0
    commits to. The client keeps the digest of what it submitted to compare with what a record proves
    (sandfleet/producer/checked.py): the same bytes, so no re-encoding can make two spellings of one spec."""
    spec_json = spec.model_dump_json()
    return spec_json, sha256_hex(spec_json)


def encode_event(event: AuditEvent) -> str:
    """The canonical JSON of an audit event: what the stream stores and the chain hashes.

    Values JSON cannot hold (a set, a path, an exception) are written as their ``str``.
    """
    return canonical_json(event.model_dump(mode="json", fallback=str))


def link_hash(prev_hash: str, event_json: str) -> str:
    """Hex SHA-256 of the previous hash followed by the event's JSON (no key: anyone can check it)."""
    return sha256_hex(prev_hash + event_json)


def signed_message(job_id: str, link: str) -> bytes:
    """What a worker signs for one entry: a domain tag, the job id and the entry's link hash."""
    return b"\n".join((SIGNATURE_DOMAIN, job_id.encode(), link.encode()))


@dataclass(frozen=True)
class ChainEntry:
    """One stream entry as stored: the event JSON, its link hash, and the writer's signature and key id
    (both empty for the producer's entry 0)."""

    event: str
    hash: str
    sig: str = ""
    key: str = ""

    def fields(self) -> dict[str, str]:
        """The stream entry's fields (``XADD``)."""
        return {"event": self.event, "hash": self.hash, "sig": self.sig, "key": self.key}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> ChainEntry:
        return cls(
            fields.get("event", ""), fields.get("hash", ""), fields.get("sig", ""), fields.get("key", "")
        )


def record_commitment(result_json: str) -> dict[str, Any]:
    """What the seal commits to: the stored final record's SHA-256, and one SHA-256 per field.

    ``result_json`` is the record's ``result`` field exactly as stored (the JobResult JSON), so any
    changed byte shows; the per-field digests say which field changed (status, result, final_program,
    attempts ... and artifacts, with their own hashes, once JobResult carries them).
    """
    data = json.loads(result_json)
    return {
        "sha256": sha256_hex(result_json),
        "fields": {name: sha256_hex(canonical_json(value)) for name, value in sorted(data.items())},
    }


def commitment_differences(commitment: dict[str, Any], result_json: str) -> list[str]:
    """Why ``result_json`` is not the record ``commitment`` committed to; empty when it is."""
    if sha256_hex(result_json) == commitment.get("sha256"):
        return []
    try:
        data = json.loads(result_json)
    except ValueError:
        return ["the final record is not JSON"]
    if not isinstance(data, dict):
        return ["the final record is not a JSON object"]
    committed: dict[str, str] = commitment.get("fields") or {}
    changed = [
        n for n in sorted(committed) if n in data and sha256_hex(canonical_json(data[n])) != committed[n]
    ]
    missing = sorted(set(committed) - set(data))
    added = sorted(set(data) - set(committed))
    parts = [f"field {n!r} differs from what the chain committed" for n in changed]
    parts += [f"field {n!r} was removed" for n in missing]
    parts += [f"field {n!r} was added" for n in added]
    return parts or ["the final record's bytes differ from what the chain committed (same fields)"]
