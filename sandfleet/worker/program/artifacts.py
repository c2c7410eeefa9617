"""Artifacts, host side: collect what a program left in ``/workspace/out/``, check it, keep it.

After a program ran, the runtime asks the sandbox's agent for the files under the artifacts folder
(protocol.COLLECT, one round trip over the channel the program already used: no Docker archive call,
which cannot read a tmpfs workdir anyway). The agent skips symlinks, devices, fifos and sockets and
applies the caps; nothing it says is trusted: :func:`parse_collection` checks every name, size and
cap again, and hashes the bytes itself (:class:`ArrivalHasher` hashes each file while the rest of the
answer is still arriving, from the same bytes; files stay slices of the one receive buffer, uncopied). Past a cap a file is skipped and the run's ``limits_hit``
says ``artifacts``; the job still ends as its program did.

When the job ends, :func:`keep_artifacts` stores the final run's files (sandfleet/core/artifacts.py)
and writes one ``artifacts`` audit event with their digests before the seal, which commits to the
JobResult listing them: the chain proves each file's SHA-256.

Each attempt's sandbox is fresh and destroyed after its run (the pool never hands a used container
out again), so one job's files can never show up in another's.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandfleet.core import json_limits
from sandfleet.core.artifacts import OUT_DIR_NAME, ArtifactStore, media_type, name_problem, sha256_bytes
from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.errors import PolicyViolationError, SandboxError
from sandfleet.core.run_models import ArtifactInfo, ArtifactLimits, SkippedArtifact
from sandfleet.core.settings import (
    DEFAULT_ARTIFACT_MAX_FILE_BYTES,
    DEFAULT_ARTIFACT_MAX_FILES,
    DEFAULT_ARTIFACT_MAX_JOB_BYTES,
    Settings,
)
from sandfleet.core.vocabulary import AuditKind

if TYPE_CHECKING:
    from sandfleet.worker.sandbox.container import SandboxContainer

log = logging.getLogger("sandfleet.artifacts")

MAX_LISTING_BYTES = 1024**2  # the agent's listing of one folder, before the files' bytes
MAX_DEPTH = 8
MAX_SKIPPED_KEPT = 100  # skipped files named in a JobResult (as the agent lists at most)


@dataclass(frozen=True)
class ArtifactCaps:
    """The caps one job's artifacts live under: the operator's, lowered by the job's own."""

    max_file_bytes: int = DEFAULT_ARTIFACT_MAX_FILE_BYTES
    max_total_bytes: int = DEFAULT_ARTIFACT_MAX_JOB_BYTES
    max_files: int = DEFAULT_ARTIFACT_MAX_FILES

    @classmethod
    def for_job(cls, settings: Settings, limits: ArtifactLimits) -> ArtifactCaps:
        """The job's caps within the operator's ceilings.

        Raises:
            PolicyViolationError: the job asks for more than a ceiling (the setting is named).
        """
        caps = {}
        for name, ceiling, setting in (
            ("max_file_bytes", settings.artifact_max_file_bytes, "SANDFLEET_ARTIFACT_MAX_FILE_BYTES"),
            ("max_total_bytes", settings.artifact_max_job_bytes, "SANDFLEET_ARTIFACT_MAX_JOB_BYTES"),
            ("max_files", settings.artifact_max_files, "SANDFLEET_ARTIFACT_MAX_FILES"),
        ):
            asked = getattr(limits, name)
            if asked is not None and asked > ceiling:
                raise PolicyViolationError(
                    f"artifacts.{name} {asked} is above the operator's ceiling of {ceiling} ({setting})"
                )
            caps[name] = ceiling if asked is None else asked
        return cls(**caps)

    @property
    def enabled(self) -> bool:
        return self.max_files > 0


@dataclass(frozen=True)
class CollectedArtifact:
    """One file as the host received it: its listing entry and its bytes."""

    info: ArtifactInfo
    data: bytes | memoryview = field(repr=False)  # a slice of the receive buffer, not a copy


@dataclass
class Collection:
    """What one run left in the artifacts folder: files kept, files skipped, and whether a cap was hit."""

    kept: list[CollectedArtifact] = field(default_factory=list)
    skipped: list[SkippedArtifact] = field(default_factory=list)
    cap_hit: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(a.info.size for a in self.kept)


def out_dir(workdir: str) -> str:
    """The artifacts folder under a sandbox's workdir (``/workspace/out``)."""
    return f"{workdir.rstrip('/')}/{OUT_DIR_NAME}"


def collect_artifacts(container: SandboxContainer, caps: ArtifactCaps) -> Collection:
    """The artifacts a finished program left in ``container``; never raises for what the sandbox
    sends (a broken answer keeps nothing and says so)."""
    if not caps.enabled or container.destroyed:
        return Collection()
    hasher = ArrivalHasher()
    try:
        header, body = container.collect(
            out_dir(container.config.workdir),
            max_file=caps.max_file_bytes,
            max_total=caps.max_total_bytes,
            max_files=caps.max_files,
            max_depth=MAX_DEPTH,
            max_body=caps.max_total_bytes + MAX_LISTING_BYTES,
            watcher=hasher,
        )
    except SandboxError as e:
        return Collection(skipped=[SkippedArtifact(name="*", reason=f"not collected: {e}")])
    return parse_collection(header, body, caps, hasher)


class ArrivalHasher:
    """The SHA-256 of each file of a COLLECT answer, computed as its bytes arrive (a
    channel.BodyWatcher): the host hashes while the sandbox is still sending, not after.

    It reads the listing the same way :func:`parse_collection` does, from the same bytes, and hashes
    the bytes that follow it in listing order; :meth:`digests` hands them over only for the sizes
    parse_collection itself read. Anything odd stops it quietly (parse_collection then hashes, or
    refuses, by itself).
    """

    def __init__(self) -> None:
        self._listing_len = -1
        self._sizes: list[int] | None = None
        self._done: list[str] = []
        self._pos = 0  # body offset hashed up to
        self._file_end = 0  # body offset where the file being hashed ends
        self._sha = hashlib.sha256()
        self._stopped = False

    def begin(self, header: dict[str, Any], size: int) -> None:
        listing_len = header.get("listing_len")
        if isinstance(listing_len, int) and 0 <= listing_len <= min(size, MAX_LISTING_BYTES):
            self._listing_len = listing_len
        else:
            self._stopped = True

    def arrived(self, body: memoryview, filled: int) -> None:
        if self._stopped:
            return
        if self._sizes is None:
            if filled < self._listing_len:
                return
            try:
                sizes = [
                    int(f["size"])
                    for f in json_limits.loads(bytes(body[: self._listing_len]), "the listing")["files"]
                ]
            except (ValueError, KeyError, TypeError):
                self._stopped = True
                return
            if any(s < 0 for s in sizes):
                self._stopped = True
                return
            self._sizes, self._pos = sizes, self._listing_len
            self._file_end = self._pos + (sizes[0] if sizes else 0)
        sizes = self._sizes
        while len(self._done) < len(sizes):
            if self._pos < self._file_end:
                upto = min(filled, self._file_end)
                if upto <= self._pos:
                    return
                self._sha.update(body[self._pos : upto])
                self._pos = upto
                if self._pos < self._file_end:
                    return
            self._done.append(self._sha.hexdigest())
            self._sha = hashlib.sha256()
            if len(self._done) < len(sizes):
                self._file_end = self._pos + sizes[len(self._done)]

    def digests(self, sizes: list[int]) -> list[str] | None:
        """Each file's SHA-256 if every file of ``sizes`` (parse_collection's reading) was hashed."""
        if self._stopped or self._sizes != sizes or len(self._done) != len(sizes):
            return None
        return list(self._done)


def parse_collection(
    header: dict[str, Any],
    body: bytes | bytearray,
    caps: ArtifactCaps,
    hasher: ArrivalHasher | None = None,
) -> Collection:
    """The agent's answer to COLLECT, checked: names, sizes and caps enforced here, bytes hashed here
    (by ``hasher`` while they arrived, when it hashed exactly the files read here)."""
    try:
        listing_len = int(header.get("listing_len", -1))
        if not 0 <= listing_len <= min(len(body), MAX_LISTING_BYTES):
            raise ValueError("bad listing length")
        listing = json_limits.loads(bytes(body[:listing_len]), "the listing")
        files = listing["files"]
        skipped_raw = listing.get("skipped", [])
        if not isinstance(files, list) or not isinstance(skipped_raw, list):
            raise ValueError("not lists")
        sizes = [int(f["size"]) for f in files]
        names = [str(f["name"]) for f in files]
    except (ValueError, KeyError, TypeError) as e:
        return Collection(
            skipped=[SkippedArtifact(name="*", reason=f"the sandbox's listing is malformed ({e})")]
        )
    data = memoryview(body)[listing_len:]
    if any(s < 0 for s in sizes) or sum(sizes) != len(data):
        return Collection(
            skipped=[SkippedArtifact(name="*", reason="the sandbox sent other bytes than its listing says")]
        )
    out = Collection()
    _skipped_in_sandbox(out, skipped_raw, listing.get("skipped_more", 0))
    digests = hasher.digests(sizes) if hasher is not None else None
    offset = 0
    seen: set[str] = set()
    for index, (name, size) in enumerate(zip(names, sizes, strict=True)):
        chunk = data[offset : offset + size]
        offset += size
        problem = name_problem(name) or ("listed twice" if name in seen else None)
        if problem is None and size > caps.max_file_bytes:
            problem, out.cap_hit = f"larger than the cap of {caps.max_file_bytes} bytes per file", True
        elif problem is None and out.total_bytes + size > caps.max_total_bytes:
            problem, out.cap_hit = f"past the cap of {caps.max_total_bytes} bytes per job", True
        elif problem is None and len(out.kept) >= caps.max_files:
            problem, out.cap_hit = f"past the cap of {caps.max_files} files per job", True
        if problem is not None:
            out.skipped.append(SkippedArtifact(name=name[:300], size=size, reason=problem))
            continue
        seen.add(name)
        digest = digests[index] if digests is not None else sha256_bytes(chunk)
        info = ArtifactInfo(name=name, size=size, media_type=media_type(name), sha256=digest)
        out.kept.append(CollectedArtifact(info, chunk))
    return out


def _skipped_in_sandbox(out: Collection, skipped_raw: list[Any], more: Any) -> None:
    """The files the agent skipped itself (a symlink, a device, over a cap), as it names them."""
    for entry in skipped_raw[:MAX_SKIPPED_KEPT]:
        if isinstance(entry, dict):
            size = entry.get("size")
            out.skipped.append(
                SkippedArtifact(
                    name=str(entry.get("name", "?"))[:300],
                    size=size if isinstance(size, int) else None,
                    reason=str(entry.get("reason", "skipped"))[:300],
                )
            )
            out.cap_hit = out.cap_hit or bool(entry.get("cap"))
    if isinstance(more, int) and more > 0:
        out.skipped.append(SkippedArtifact(name="*", reason=f"{more} more files skipped"))


def keep_artifacts(
    store: ArtifactStore, job_id: str, collection: Collection | None, audit: AuditSink, attempt: int
) -> tuple[list[ArtifactInfo], list[SkippedArtifact]]:
    """Store the final run's files and record their digests in the audit chain; the listing for the
    JobResult. Nothing is written for a run that left no artifacts folder entries.

    Raises what the store raises (redis.RedisError, OSError): a job whose files cannot be kept is
    retried rather than finished without them.
    """
    if collection is None or not (collection.kept or collection.skipped):
        return [], []
    for artifact in collection.kept:
        store.put(job_id, artifact.info.sha256, artifact.data)
    infos = [a.info for a in collection.kept]
    audit.emit(
        AuditKind.ARTIFACTS,
        {
            "files": [i.model_dump(mode="json") for i in infos],
            "skipped": [s.model_dump(mode="json") for s in collection.skipped],
            "bytes": collection.total_bytes,
        },
        attempt,
    )
    return infos, list(collection.skipped)
