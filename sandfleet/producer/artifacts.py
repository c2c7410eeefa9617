"""Fetching a job's artifacts: the bytes of the files its program handed back, checked and written.

Only a verified record's listing is used (its audit chain proves each file's SHA-256), and each
file's bytes are hashed again as they are fetched: bytes changed at rest raise
ArtifactIntegrityError and are never written. Names are checked again before anything is written
(sandfleet.core.artifacts.safe_destination), so a file lands only inside the folder asked for, and
each is written whole (a temporary file renamed): sandfleet/core/artifact_files.py, shared with
``sandfleet ask --out``.
"""

from __future__ import annotations

from sandfleet.core.artifact_files import checked_bytes, write_artifacts
from sandfleet.core.artifacts import ArtifactStore
from sandfleet.core.contracts import JobResult

__all__ = ["checked_bytes", "fetch_artifact", "write_artifacts"]


def fetch_artifact(store: ArtifactStore, result: JobResult, name: str) -> bytes:
    """The bytes of artifact ``name`` of a verified ``result``.

    Raises:
        KeyError: the result lists no artifact of that name.
        ArtifactIntegrityError: its bytes are gone, or are not the ones the record lists.
    """
    info = next((a for a in result.artifacts if a.name == name), None)
    if info is None:
        listed = ", ".join(a.name for a in result.artifacts) or "none"
        raise KeyError(f"job {result.job_id} has no artifact {name!r} (it has: {listed})")
    return checked_bytes(store, result.job_id, info)
