"""A suspended shell job's saved /workspace, attacked: archives whoever can write Redis (or the model,
through what it left in its workspace) could hand a resuming worker. No Docker: the archive is read on
the host in memory and restored through a stand-in session that records what it was asked to write."""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import Any

import pytest

from sandfleet.core.artifacts import MemoryArtifactStore
from sandfleet.core.errors import UntrustedStateError
from sandfleet.worker.approval.checkpoint import WorkspaceArchive
from sandfleet.worker.engine.shell.workspace import (
    NOTE_NAME_CHARS,
    NOTE_NAMES,
    WorkspaceError,
    read_archive,
    restore_workspace,
    resume_note,
    safe_name,
)

CAP = 1024 * 1024


def tar_of(*members: tuple[str, Any], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar archive of ``(name, what)``: bytes (a file), "dir", ("sym", target), ("hard", target),
    "fifo", "chr", or a TarInfo to add as it is."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            data = None
            if isinstance(what, bytes):
                info.size, data = len(what), io.BytesIO(what)
            elif what == "dir":
                info.type = tarfile.DIRTYPE
            elif isinstance(what, tuple) and what[0] == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, what[1]
            elif isinstance(what, tuple) and what[0] == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, what[1]
            elif what == "fifo":
                info.type = tarfile.FIFOTYPE
            elif what == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info, data)
    return buffer.getvalue()


class FakeSession:
    """What restore_workspace writes, recorded instead of sent to a sandbox."""

    class _Container:
        class config:  # stands in for SandboxConfig
            workdir = "/workspace"

    container = _Container()

    def __init__(self) -> None:
        self.folders: list[str] = []
        self.files: dict[str, tuple[bytes, int]] = {}
        self.commands: list[list[str]] = []

    def execute(self, argv: list[str], **_caps: Any) -> Any:
        self.commands.append(argv)
        return type("Done", (), {"exit_code": 0})()

    def restore_files(self, folders: list[str], files: dict[str, tuple[bytes, int]]) -> None:
        self.folders += folders
        self.files.update(files)


def stored(data: bytes, job_id: str = "job-1") -> tuple[MemoryArtifactStore, WorkspaceArchive]:
    store = MemoryArtifactStore()
    digest = hashlib.sha256(data).hexdigest()
    store.put(job_id, digest, data)
    return store, WorkspaceArchive(sha256=digest, size=len(data))


def test_a_plain_workspace_is_restored_file_by_file_under_workspace_only() -> None:
    data = tar_of(
        (".", "dir"),
        ("./notes", "dir"),
        ("./notes/a.txt", b"hello"),
        ("./run.sh", b"#!/bin/sh\n"),
        ("./out", "dir"),
    )
    store, archive = stored(data)
    session = FakeSession()
    contents = restore_workspace(session, archive, store, "job-1", max_bytes=CAP)  # type: ignore[arg-type]
    assert session.folders == ["/workspace/notes", "/workspace/out"]
    assert session.files["/workspace/notes/a.txt"][0] == b"hello"
    assert set(session.files) == {"/workspace/notes/a.txt", "/workspace/run.sh"}
    assert all(path.startswith("/workspace/") for path in [*session.folders, *session.files])
    assert contents.skipped == []


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("/etc/passwd", "absolute"),
        ("../outside.txt", "'..'"),
        ("./notes/../../outside.txt", "'..'"),
        ("a/" * 40 + "deep.txt", "deeper"),
        ("x" * 2000, "longer"),
    ],
)
def test_a_name_out_of_the_workspace_refuses_the_whole_archive(name: str, why: str) -> None:
    data = tar_of(("./fine.txt", b"ok"), (name, b"planted"))
    with pytest.raises(WorkspaceError, match=why):
        read_archive(data, max_bytes=CAP)
    store, archive = stored(data)
    session = FakeSession()
    with pytest.raises(UntrustedStateError, match="refused"):
        restore_workspace(session, archive, store, "job-1", max_bytes=CAP)  # type: ignore[arg-type]
    assert session.files == {} and session.folders == []  # nothing of it written, not even fine.txt


def test_links_out_hard_links_devices_and_fifos_are_never_made_and_are_named_as_skipped() -> None:
    data = tar_of(
        ("./passwd", ("sym", "/etc/passwd")),
        ("./up", ("sym", "../..")),
        ("./inside", ("sym", "notes")),
        ("./hard", ("hard", "/etc/shadow")),
        ("./null", "chr"),
        ("./pipe", "fifo"),
        ("./up/escape.txt", b"written through a link?"),  # the link is not made: this lands in /workspace/up/
    )
    contents = read_archive(data, max_bytes=CAP)
    assert contents.links == {"inside": "notes"}  # the one link that stays inside /workspace
    assert sorted(contents.skipped) == sorted(
        [
            "passwd (link: not restored)",
            "up (link: not restored)",
            "hard (link: not restored)",
            "null (special file: not restored)",
            "pipe (special file: not restored)",
        ]
    )
    assert list(contents.files) == ["up/escape.txt"]  # a plain file in a plain folder of the workspace


def test_size_and_entry_caps_hold_and_compressed_or_broken_archives_are_refused() -> None:
    big = tar_of(("./a.bin", b"a" * 600), ("./b.bin", b"b" * 600))
    with pytest.raises(WorkspaceError, match="more than the cap of 1000"):
        read_archive(big, max_bytes=1000)  # refused before it is parsed
    assert len(read_archive(big, max_bytes=len(big)).files) == 2
    cut = big[:1100]  # a header promising 600 bytes the archive does not hold
    with pytest.raises(WorkspaceError, match=r"not a plain tar|not its header's"):
        read_archive(cut, max_bytes=CAP)
    many = tar_of(*[(f"./f{i}", b"") for i in range(30)])
    with pytest.raises(WorkspaceError, match="more than 20 entries"):
        read_archive(many, max_bytes=CAP, max_entries=20)
    gz = io.BytesIO()
    with tarfile.open(fileobj=gz, mode="w:gz") as tar:
        info = tarfile.TarInfo("./bomb")
        info.size = 100_000
        tar.addfile(info, io.BytesIO(b"\0" * 100_000))
    with pytest.raises(WorkspaceError, match="not a plain tar"):
        read_archive(gz.getvalue(), max_bytes=CAP)
    with pytest.raises(WorkspaceError, match="not a plain tar"):
        read_archive(b"not a tar archive at all" * 40, max_bytes=CAP)


def test_a_name_twice_or_a_file_under_a_file_refuses_the_archive() -> None:
    with pytest.raises(WorkspaceError, match="twice"):
        read_archive(tar_of(("./a", b"1"), ("./a", b"2")), max_bytes=CAP)
    with pytest.raises(WorkspaceError, match="which is a file"):
        read_archive(tar_of(("./a", b"1"), ("./a/b", b"2")), max_bytes=CAP)
    assert safe_name("./") is None and safe_name("./x/./y") == "x/y"
    with pytest.raises(WorkspaceError, match="NUL"):
        safe_name("a\0b")


def test_a_planted_or_missing_archive_is_never_restored() -> None:
    genuine = tar_of(("./a.txt", b"mine"))
    store, archive = stored(genuine)
    planted = tar_of(("./a.txt", b"planted by whoever can write Redis"))
    store.put("job-1", archive.sha256, planted)  # other bytes under the committed digest's key
    session = FakeSession()
    with pytest.raises(UntrustedStateError, match="was changed"):
        restore_workspace(session, archive, store, "job-1", max_bytes=CAP)  # type: ignore[arg-type]
    with pytest.raises(UntrustedStateError, match="missing"):
        restore_workspace(session, archive, MemoryArtifactStore(), "job-1", max_bytes=CAP)  # type: ignore[arg-type]
    assert session.files == {}


def test_the_resume_note_says_what_was_not_restored_in_bounded_text() -> None:
    """The model reads what its fresh session lacks; many (or long) skipped names cannot flood it."""
    plain = resume_note(read_archive(tar_of(("a.txt", b"x"), ("d", "dir")), max_bytes=CAP))
    assert "1 files, 1 folders" in plain and "processes you started" in plain and "/tmp" in plain
    assert "Not restored from /workspace" not in plain
    links = [(f"l{i}-" + "n" * 300, ("sym", "/etc/passwd")) for i in range(NOTE_NAMES + 5)]
    note = resume_note(read_archive(tar_of(("a.txt", b"x"), *links), max_bytes=CAP))
    assert note.count("(link") == 0 and note.count("l0-") == 1  # each name cut before its kind
    assert note.endswith("; and 5 more.")
    assert len(note) < 600 + NOTE_NAMES * (NOTE_NAME_CHARS + 2)


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("etc", "/etc"),  # absolute
        ("data", "/workspace/data"),  # absolute, even into /workspace
        ("top", ".."),  # above /workspace from its top
        ("a/up", "../.."),  # one folder deep, two up
        ("a/b/back", "../x/../.."),  # '..' after a name
        ("a/sneak", "x/../../.."),
        ("a/long", "x/" * 600),
    ],
)
def test_a_link_that_could_lead_out_of_the_workspace_is_never_made(name: str, target: str) -> None:
    data = tar_of(("./a/b", "dir"), ("./a/x", b"x"), (f"./{name}", ("sym", target)))
    store, archive = stored(data)
    session = FakeSession()
    contents = restore_workspace(session, archive, store, "job-1", max_bytes=CAP)  # type: ignore[arg-type]
    assert contents.links == {} and session.commands == []  # no ln ever ran
    assert contents.skipped == [f"{name} (link: not restored)"]


def test_a_chain_of_links_cannot_climb_out_and_links_inside_are_made_after_every_file() -> None:
    """``b/c -> ..`` stays inside (it is /workspace); ``a -> b/c/../..`` would climb through it to / if
    '..' were judged by name only: refused, as every '..' after a name is."""
    data = tar_of(
        ("./b", "dir"),
        ("./b/c", ("sym", "..")),
        ("./a", ("sym", "b/c/../..")),
        ("./b/data.csv", b"1,2"),
        ("./b/latest", ("sym", "data.csv")),
        ("./b/root", ("sym", "../b/data.csv")),
    )
    store, archive = stored(data)
    session = FakeSession()
    contents = restore_workspace(session, archive, store, "job-1", max_bytes=CAP)  # type: ignore[arg-type]
    assert contents.links == {"b/c": "..", "b/latest": "data.csv", "b/root": "../b/data.csv"}
    assert contents.skipped == ["a (link: not restored)"]
    assert set(session.files) == {"/workspace/b/data.csv"}  # written before any link exists
    [command] = session.commands
    assert command[:2] == ["sh", "-c"] and command[4:] == [
        "..", "/workspace/b/c", "data.csv", "/workspace/b/latest", "../b/data.csv", "/workspace/b/root",
    ]  # fmt: skip


def test_a_name_under_a_link_refuses_the_whole_archive() -> None:
    """A file named under a link would be written through it: the archive is refused, nothing made."""
    data = tar_of(("./notes", "dir"), ("./ln", ("sym", "notes")), ("./ln/planted.txt", b"through the link"))
    with pytest.raises(WorkspaceError, match="which is a link"):
        read_archive(data, max_bytes=CAP)
