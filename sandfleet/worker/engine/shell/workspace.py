"""A shell job's /workspace across a suspension: saved as a tar archive, restored into a fresh session.

While a person decides a gated call, no container is kept: before the session is destroyed, the
sandbox's own ``tar`` writes its /workspace to ``/tmp/.sandfleet/workspace.tar`` (a tmpfs), the host
reads it back (at most ``SANDFLEET_APPROVAL_WORKSPACE_MAX_BYTES``), checks it as it will check it on
restore (:func:`read_archive`), and keeps it in the artifact store under its SHA-256, which the
checkpoint holds (and so the signed ``awaiting_approval`` event commits to it).

On resume, :func:`restore_workspace` takes the archive from the store and uses it only when its
SHA-256 is the checkpoint's (whoever can write Redis can plant bytes there; they cannot sign). Then
it is read on the host, in memory, never extracted onto the host's disk; nothing of it is trusted:

- plain tar only (no compression: what is read is bounded by what is stored), at most
  ``MAX_ENTRIES`` entries and the byte cap for the files' contents;
- names relative, without ``..``, NUL, or more than ``MAX_NAME_CHARS``/``MAX_DEPTH``; a file under
  another file's name, or a name twice, refuses the archive;
- folders and regular files are restored, written by the host through the fresh sandbox's agent
  to ``/workspace/<name>`` (mode: the owner's bits and the executable bits, never set-id);
- a symbolic link is made again (by the sandbox's own ``ln``, after every file) only when its target
  stays inside /workspace whatever the other links are (:func:`link_problem`: relative, its ``..``
  only leading and no more of them than the link's depth); hard links, devices, fifos and every
  other link are never made (named in the ``restored`` event as skipped), so no later write can
  follow a link out of /workspace.

The model is told what its fresh session lacks (:func:`resume_note`): the entries not restored, the
processes it started, everything outside /workspace.

An archive that fails these checks on save ends the job (``failed``, said why); on restore it is
state the job's chain does not vouch for: ``untrusted_state``, nothing of it used.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from sandfleet.core.artifacts import ArtifactStore
from sandfleet.core.errors import SandboxError, UntrustedStateError
from sandfleet.worker.approval.checkpoint import WorkspaceArchive
from sandfleet.worker.engine.shell.session import SessionSandbox

ARCHIVE_DIR = "/tmp/.sandfleet"
ARCHIVE_PATH = f"{ARCHIVE_DIR}/workspace.tar"
MAX_ENTRIES = 10_000
MAX_NAME_CHARS = 1024
MAX_DEPTH = 32
TAR_TIMEOUT_S = 60.0
MAX_SKIPPED_NAMED = 100
MAX_LINKS = 1000  # symbolic links made again on restore; past it they are skipped (named)
LINKS_PER_COMMAND = 200  # pairs of arguments per ``ln`` loop: well under the kernel's argument cap
LINK_LOOP = 'while [ "$#" -gt 1 ]; do ln -s -T -- "$1" "$2" || exit 1; shift 2; done'
NOTE_NAMES = 20  # skipped entries the resume note names (each cut at NOTE_NAME_CHARS), then a count
NOTE_NAME_CHARS = 200


class WorkspaceError(Exception):
    """The workspace cannot be saved or read back; ``str()`` says why."""


@dataclass
class ArchiveContents:
    """What an archive restores: folders and files by relative name, and what it skips."""

    folders: list[str] = field(default_factory=list)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # name -> (bytes, mode)
    links: dict[str, str] = field(default_factory=dict)  # name -> target (relative, inside /workspace)
    skipped: list[str] = field(default_factory=list)


def safe_name(raw: str) -> str | None:
    """The member's name relative to /workspace (None for the root itself).

    Raises:
        WorkspaceError: absolute, with ``..``, NUL or backslash-free trickery, too long or too deep.
    """
    if "\0" in raw or len(raw) > MAX_NAME_CHARS:
        raise WorkspaceError(f"archive entry {raw[:80]!r}: a name with NUL or longer than {MAX_NAME_CHARS}")
    if raw.startswith("/"):
        raise WorkspaceError(f"archive entry {raw[:80]!r}: an absolute name")
    parts = [p for p in PurePosixPath(raw).parts if p != "."]
    if any(p == ".." for p in parts):
        raise WorkspaceError(f"archive entry {raw[:80]!r}: a name with '..'")
    if len(parts) > MAX_DEPTH:
        raise WorkspaceError(f"archive entry {raw[:80]!r}: deeper than {MAX_DEPTH} folders")
    return "/".join(parts) or None


def read_archive(data: bytes, *, max_bytes: int, max_entries: int = MAX_ENTRIES) -> ArchiveContents:
    """The folders and files of a workspace archive, checked (see the module's docstring).

    Raises:
        WorkspaceError: the archive breaks a rule or is not a plain tar archive.
    """
    if len(data) > max_bytes:
        raise WorkspaceError(f"the workspace archive is {len(data)} bytes, more than the cap of {max_bytes}")
    out = ArchiveContents()
    kinds: dict[str, str] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for count, member in enumerate(tar, start=1):
                if count > max_entries:
                    raise WorkspaceError(f"the workspace archive has more than {max_entries} entries")
                name = safe_name(member.name)
                if name is None:
                    continue
                if member.isdir():
                    _claim(kinds, name, "dir")
                    out.folders.append(name)
                elif member.isreg() and not member.issparse():
                    total += member.size
                    if total > max_bytes:
                        raise WorkspaceError(f"the workspace's files hold more than {max_bytes} bytes")
                    _claim(kinds, name, "file")
                    handle = tar.extractfile(member)
                    body = handle.read(member.size + 1) if handle is not None else b""
                    if len(body) != member.size:
                        raise WorkspaceError(f"archive entry {name!r}: its size is not its header's")
                    out.files[name] = (body, (member.mode & 0o755) | 0o600)
                elif (
                    member.issym()
                    and len(out.links) < MAX_LINKS
                    and link_problem(name, member.linkname) is None
                ):
                    _claim(kinds, name, "link")
                    out.links[name] = member.linkname
                else:
                    what = "link" if member.issym() or member.islnk() else "special file"
                    if len(out.skipped) < MAX_SKIPPED_NAMED:
                        out.skipped.append(f"{name} ({what}: not restored)")
    except tarfile.TarError as e:
        raise WorkspaceError(f"the workspace archive is not a plain tar archive: {e}") from None
    return out


def link_problem(name: str, target: str) -> str | None:
    """Why the symbolic link ``name`` -> ``target`` is not made again (None: it is), judged without
    knowing the other links: a target that is relative, without NUL, whose ``..`` parts all come first
    and are no more than the folders above ``name``, ends inside /workspace however the links it
    passes through resolve (each of them is held to the same rule; names under a link are refused)."""
    if not target or "\0" in target or len(target) > MAX_NAME_CHARS:
        return "an empty, NUL or over-long target"
    if target.startswith("/"):
        return "an absolute target"
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
    if ".." in parts[ups:]:
        return "'..' after a name"
    if ups > name.count("/"):
        return "a target above /workspace"
    return None


def _claim(kinds: dict[str, str], name: str, kind: str) -> None:
    """Note ``name`` as a folder, a file or a link; refuse a name twice, or a name under a file or a
    link (a write there would follow the link)."""
    if name in kinds:
        raise WorkspaceError(f"archive entry {name!r} is in the archive twice")
    parts = name.split("/")
    for depth in range(1, len(parts)):
        parent = "/".join(parts[:depth])
        if kinds.get(parent) in ("file", "link"):
            raise WorkspaceError(f"archive entry {name!r} is under {parent!r}, which is a {kinds[parent]}")
        kinds.setdefault(parent, "dir")
    kinds[name] = kind


def save_workspace(
    session: SessionSandbox, store: ArtifactStore, job_id: str, *, max_bytes: int
) -> WorkspaceArchive:
    """Archive the session's /workspace into the artifact store (before the session is destroyed).

    Raises:
        WorkspaceError: the archive could not be made, is over the cap, or breaks a rule.
        SessionGoneError: the session had ended.
    """
    workdir = session.container.config.workdir
    done = session.execute(
        ["tar", "--create", "--format=pax", f"--file={ARCHIVE_PATH}", f"--directory={workdir}", "."],
        timeout_s=TAR_TIMEOUT_S,
        max_output=64 * 1024,
        tail=4096,
        mkdirs=[ARCHIVE_DIR],
    )
    if done.exit_code not in (0, 1):  # 1: a file changed while it was read (archived all the same)
        raise WorkspaceError(
            f"tar could not archive {workdir}: {(done.stderr or done.stdout).strip()[-300:]}"
        )
    try:
        data = session.read_file(ARCHIVE_PATH, max_bytes=max_bytes)
    except SandboxError as e:
        raise WorkspaceError(
            f"the archive of {workdir} could not be read back (cap {max_bytes} bytes): {e}"
        ) from e
    contents = read_archive(data, max_bytes=max_bytes)
    digest = hashlib.sha256(data).hexdigest()
    store.put(job_id, digest, data)
    return WorkspaceArchive(
        sha256=digest, size=len(data), files=len(contents.files), skipped=contents.skipped
    )


def restore_workspace(
    session: SessionSandbox, archive: WorkspaceArchive, store: ArtifactStore, job_id: str, *, max_bytes: int
) -> ArchiveContents:
    """Restore the saved /workspace into a fresh session, only if the stored bytes are the archive the
    (verified) checkpoint names.

    Raises:
        UntrustedStateError: the archive is missing, is not the one committed to, or breaks a rule.
        SessionGoneError: the session ended meanwhile.
    """
    data = store.get(job_id, archive.sha256)
    what = "the suspended shell job's saved /workspace"
    if data is None:
        raise UntrustedStateError(f"{what} is missing from the artifact store; not resumed")
    actual = hashlib.sha256(data).hexdigest()
    if actual != archive.sha256:
        raise UntrustedStateError(
            f"{what} is not the archive its verified audit chain commits to (SHA-256 {actual[:16]}..., "
            f"committed {archive.sha256[:16]}...): the stored archive was changed; not resumed"
        )
    try:
        contents = read_archive(data, max_bytes=max(max_bytes, archive.size))
    except WorkspaceError as e:
        raise UntrustedStateError(f"{what} is refused: {e}; not resumed") from None
    workdir = session.container.config.workdir.rstrip("/")
    session.restore_files(
        [f"{workdir}/{name}" for name in contents.folders],
        {f"{workdir}/{name}": body for name, body in contents.files.items()},
    )
    _make_links(session, workdir, contents)
    return contents


def _make_links(session: SessionSandbox, workdir: str, contents: ArchiveContents) -> None:
    """Make the archive's links that stay inside /workspace, after every file (no write follows them),
    by the sandbox's own ``ln``; those it could not make are named as skipped.

    Raises:
        SessionGoneError: the session ended meanwhile.
    """
    pairs = [(target, f"{workdir}/{name}") for name, target in contents.links.items()]
    for start in range(0, len(pairs), LINKS_PER_COMMAND):
        chunk = pairs[start : start + LINKS_PER_COMMAND]
        argv = ["sh", "-c", LINK_LOOP, "sh", *(arg for pair in chunk for arg in pair)]
        done = session.execute(argv, timeout_s=TAR_TIMEOUT_S, max_output=4096, tail=0)
        if done.exit_code != 0 and len(contents.skipped) < MAX_SKIPPED_NAMED:
            contents.skipped.append(f"{len(chunk)} links from {chunk[0][1]!r} (could not all be made)")


def resume_note(contents: ArchiveContents) -> str:
    """What the model reads when its shell job resumes in a fresh session sandbox: what came back, and
    what did not (without it, a model expecting its server or its /tmp files would be misled)."""
    lines = [
        "Note from the sandbox host: while this job waited for a person's decision its session sandbox "
        "was destroyed; your commands now run in a fresh one.",
        f"Restored: /workspace ({len(contents.files)} files, {len(contents.folders)} folders, "
        f"{len(contents.links)} links inside it, with packages installed into it).",
        "Not restored: processes you started (background jobs, servers), and everything outside "
        "/workspace (/tmp included).",
    ]
    if contents.skipped:
        named = [name[:NOTE_NAME_CHARS] for name in contents.skipped[:NOTE_NAMES]]
        more = len(contents.skipped) - len(named)
        lines.append(
            "Not restored from /workspace: " + "; ".join(named) + (f"; and {more} more" if more else "") + "."
        )
    return "\n".join(lines)
