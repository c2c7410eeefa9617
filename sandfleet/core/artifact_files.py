"""Writing a job's artifacts to a folder, each file checked against the digest its result lists.

Shared by the reader (``sandfleet artifacts JOB --out DIR``, ``JobHandle.download_artifacts``, in
sandfleet/producer/artifacts.py) and by ``sandfleet ask --out DIR``, which runs the job in its own process and
keeps the files in memory. Each file's bytes are hashed again before anything is written: bytes
changed at rest raise ArtifactIntegrityError and nothing is written. Names are checked again
(safe_destination), so a file lands only inside the folder asked for, and each is written whole (a
temporary file renamed).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sandfleet.core.artifacts import ArtifactStore, safe_destination, sha256_bytes
from sandfleet.core.contracts import ArtifactInfo, JobResult
from sandfleet.core.errors import ArtifactIntegrityError


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
    """Write every artifact of ``result`` under ``folder`` (made if missing); their paths.

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
