"""Fetching a job's artifacts: the bytes of the files its program handed back, checked and written.

Only a verified record's listing is used (its audit chain proves each file's SHA-256), and each
file's bytes are hashed again as they are fetched: bytes changed at rest raise
ArtifactIntegrityError and are never written. Names are checked again before anything is written
(sandfleet.core.artifacts.safe_destination), so a file lands only inside the folder asked for, and
each is written whole (a temporary file renamed).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sandfleet.core.artifacts import ArtifactStore, safe_destination, sha256_bytes
from sandfleet.core.contracts import ArtifactInfo, JobResult
from sandfleet.core.errors import ArtifactIntegrityError


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


def checked_bytes(store: ArtifactStore, job_id: str, info: ArtifactInfo) -> bytes:
    """The stored bytes of ``info``, once they hash to its SHA-256."""
    data = store.get(job_id, info.sha256)
    if data is None:
        problem = f"artifact {info.name!r}: its stored bytes are missing (expired, pruned or deleted)"
        raise ArtifactIntegrityError(f"job {job_id}: {problem}", [problem])
    digest = sha256_bytes(data)
    if digest != info.sha256:
        problem = (
            f"artifact {info.name!r}: its stored bytes are not the ones the chain commits to "
            f"(sha256 {digest[:16]}..., committed {info.sha256[:16]}...); not served"
        )
        raise ArtifactIntegrityError(f"job {job_id}: {problem}", [problem])
    return data


def write_artifacts(store: ArtifactStore, result: JobResult, folder: Path) -> list[Path]:
    """Write every artifact of a verified ``result`` under ``folder`` (made if missing); their paths.

    Every file is fetched and checked before the first is written, so a tampered one leaves the
    folder as it was.

    Raises:
        ArtifactIntegrityError: a file's bytes are gone or changed (nothing written).
        ValueError: a name would lead outside ``folder`` (nothing written).
    """
    planned = [
        (safe_destination(folder, a.name), checked_bytes(store, result.job_id, a)) for a in result.artifacts
    ]
    written = []
    for target, data in planned:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".sandfleet-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(target)
    return written
