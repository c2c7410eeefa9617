"""Artifacts at rest: where the files programs hand back are kept, and the rules for their names.

A program writes files under ``/workspace/out/``; the worker collects them after the run
(sandfleet/worker/program/artifacts.py), hashes each itself, stores the bytes here, lists them in the JobResult
(``ArtifactInfo``: name, size, media type, SHA-256) and records the digests in the audit chain, whose
seal commits to the record. Readers fetch the bytes by (job, SHA-256) and check each digest again, so
a file changed at rest is refused, never served (``ArtifactIntegrityError``).

Two stores, picked by ``Settings.artifact_store``:
- ``redis`` (default): one string per artifact, ``{p}:job:{id}:artifact:{sha256}``, expiring with the
  records' retention;
- ``filesystem``: ``{artifact_dir}/{job id}/{sha256}``, a folder every worker and reader mounts (a
  shared volume), for files too large to keep in Redis memory. Nothing expires it: the operator
  prunes it (a job's folder can go once its record has expired).

Both are content-addressed within a job, so a redelivered job that stores the same file again writes
the same bytes to the same place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import mimetypes
import os
import tempfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from sandfleet.core.redis_keys import FleetKeys, check_id

if TYPE_CHECKING:  # redis, the settings and the verifier (cryptography) load where a store is opened:
    # `sandfleet run` names artifacts with this module and opens no store
    import redis

    from sandfleet.core.settings import Settings
    from sandfleet.core.verify import JobEvidence

OUT_DIR_NAME = "out"  # under the sandbox's workdir: /workspace/out/
MAX_NAME_CHARS = 255  # the whole relative path of one artifact
MAX_NAME_DEPTH = 8  # folders below out/
DEFAULT_MEDIA_TYPE = "application/octet-stream"
# mimetypes reads /etc/mime.types when present, which differs by host; these are fixed everywhere.
_MEDIA_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".svg": "image/svg+xml",
    ".pdf": "application/pdf",
    ".csv": "text/csv",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".html": "text/html",
    ".parquet": "application/vnd.apache.parquet",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}


def sha256_bytes(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def media_type(name: str) -> str:
    """The media type of an artifact, by its name's extension (the bytes are never trusted to say)."""
    suffix = PurePosixPath(name).suffix.lower()
    return _MEDIA_TYPES.get(suffix) or mimetypes.guess_type(name, strict=True)[0] or DEFAULT_MEDIA_TYPE


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an artifact's name, or None: a relative ``/``-separated path in UTF-8 with
    no empty, ``.`` or ``..`` part, no control characters or backslashes, at most MAX_NAME_CHARS long and
    MAX_NAME_DEPTH folders deep. Checked by the worker when it collects and by the client before it
    writes a file, so a name can never point outside the folder it is written to."""
    if not name or len(name) > MAX_NAME_CHARS:
        return f"the name is empty or longer than {MAX_NAME_CHARS} characters"
    if any(ord(c) < 32 or c in "\\\x7f" for c in name):
        return "the name has control characters or backslashes"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8"
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "the name is not a plain relative path"
    if len(parts) > MAX_NAME_DEPTH + 1:
        return f"the file is more than {MAX_NAME_DEPTH} folders deep"
    return None


def safe_destination(folder: Path, name: str) -> Path:
    """Where artifact ``name`` goes under ``folder``; ValueError if it would land anywhere else."""
    problem = name_problem(name)
    if problem:
        raise ValueError(f"artifact name {name!r} refused: {problem}")
    root = folder.resolve()
    target = (root / name).resolve()
    if not target.is_relative_to(root) or target == root:
        raise ValueError(f"artifact name {name!r} refused: it leads outside {folder}")
    return target


class ArtifactStore(Protocol):
    """Where artifact bytes live, by (job id, SHA-256)."""

    def put(self, job_id: str, sha256: str, data: bytes | memoryview) -> None:
        """Keep ``data`` (whose digest is ``sha256``). Raises redis.RedisError or OSError."""

    def get(self, job_id: str, sha256: str) -> bytes | None:
        """The bytes kept under ``sha256``, None when there are none (expired, pruned, never kept)."""
        ...


class RedisArtifactStore:
    """Artifacts as Redis strings under the fleet's prefix, expiring with the records' retention."""

    def __init__(self, client: redis.Redis, keys: FleetKeys, retention_s: int) -> None:
        self._redis = binary_client(client)
        self._own = self._redis is not client  # a pool of its own, closed by close()
        self._keys = keys
        self._retention_s = retention_s

    def close(self) -> None:
        if self._own:
            self._redis.close()
            self._redis.connection_pool.disconnect()

    def put(self, job_id: str, sha256: str, data: bytes | memoryview) -> None:
        self._redis.set(self._keys.artifact(check_id(job_id), sha256), data, ex=self._retention_s)

    def get(self, job_id: str, sha256: str) -> bytes | None:
        value = self._redis.get(self._keys.artifact(check_id(job_id), sha256))
        return bytes(value) if value is not None else None  # type: ignore[arg-type]


class FileArtifactStore:
    """Artifacts as files ``{root}/{job id}/{sha256}``, written whole (a temporary file renamed)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, job_id: str, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a SHA-256 digest: {sha256!r}")
        return self.root / check_id(job_id) / sha256

    def put(self, job_id: str, sha256: str, data: bytes | memoryview) -> None:
        path = self._path(job_id, sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, job_id: str, sha256: str) -> bytes | None:
        try:
            return self._path(job_id, sha256).read_bytes()
        except FileNotFoundError:
            return None


class MemoryArtifactStore:
    """Artifacts in this process's memory: ``sandfleet ask`` and tests, where no fleet keeps them."""

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, str], bytes] = {}

    def put(self, job_id: str, sha256: str, data: bytes | memoryview) -> None:
        self.blobs[(job_id, sha256)] = bytes(data)  # not a view of a buffer that lives on

    def get(self, job_id: str, sha256: str) -> bytes | None:
        return self.blobs.get((job_id, sha256))


def open_artifact_store(settings: Settings, client: redis.Redis) -> ArtifactStore:
    """The store ``settings.artifact_store`` names (``client``: the fleet's Redis, any decoding)."""
    if settings.artifact_store == "filesystem":
        return FileArtifactStore(Path(settings.artifact_dir).expanduser())
    return RedisArtifactStore(client, FleetKeys(settings.key_prefix), settings.retention_s)


def binary_client(client: redis.Redis) -> redis.Redis:
    """A client on the same server as ``client`` that returns bytes (artifacts are not text)."""
    import redis

    pool = client.connection_pool
    if not pool.connection_kwargs.get("decode_responses"):
        return client
    kwargs = {**pool.connection_kwargs, "decode_responses": False}
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def with_artifact_digests(evidence: JobEvidence, store: ArtifactStore) -> JobEvidence:
    """``evidence`` with, for each artifact its record lists, the SHA-256 of the bytes stored for it
    (None: nothing stored), so that verifying it checks the files at rest too."""
    from sandfleet.core.verify import listed_artifacts

    found: dict[str, str | None] = {}
    for _name, digest in listed_artifacts(evidence.record.get("result")):
        data = store.get(evidence.job_id, digest)
        found[digest] = None if data is None else sha256_bytes(data)
    return dataclasses.replace(evidence, artifact_digests=found)
