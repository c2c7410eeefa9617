"""Who created a batch, and which jobs are its own: pure functions, no Redis.

A batch id is a name anyone can type, so the name alone cannot say whose jobs belong to it. The
client that creates a batch holds a secret, its submitter token (``SANDFLEET_SUBMITTER_TOKEN``, or
one made once in the user's state folder: sandfleet/producer/submitter.py). The batch record (the ``creator``
field of ``{p}:batch:{id}:counts``, which lives exactly as long as the batch) keeps only
:func:`creator_digest` of it, and every job of the batch keeps the same digest in its record
(``batch_creator``). Submitting a job into a batch whose creator is another digest is refused in
the same Lua step that would write it (sandfleet/core/lua.py ``RECORD_QUEUED``): nothing is written.

The digest is an HMAC keyed with the token over the batch id, so it names one batch only: seeing a
batch's creator in Redis tells nothing about the token, nor about the creator of any other batch.
Readers (verify, results, ``replay --batch``, the batch webhook) take a listed job as the batch's
own only when its record names the batch and the batch's creator (:func:`is_own_job`).
"""

from __future__ import annotations

import hashlib
import hmac

CREATOR_DOMAIN = b"sandfleet-batch-creator-v1"
CREATOR_FIELD = "creator"  # in the batch's counts hash
RECORD_FIELD = "batch_creator"  # in each job record of the batch


def creator_digest(token: str, batch_id: str) -> str:
    """The batch record's creator: hex HMAC-SHA256 keyed with the submitter token, over the batch id."""
    if not token:
        raise ValueError("a batch's creator needs the submitter token; got an empty one")
    message = CREATOR_DOMAIN + b"\n" + batch_id.encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def is_own_job(batch_id: str, batch_creator: str | None, record: dict[str, str]) -> bool:
    """Whether a job record listed in batch ``batch_id`` is one of the batch's own jobs: it names this
    batch and the batch's creator. (A batch an older producer made has no creator, nor have its jobs.)"""
    return record.get("batch_id") == batch_id and record.get(RECORD_FIELD) == batch_creator
