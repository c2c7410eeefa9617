"""Hostile programs against artifact collection: each tries to make the host take back something other
than the regular files it wrote under /workspace/out/, in a real sandbox under runc and under runsc.

Collection (sandfleet/worker/sandbox/inside/agent.py ``collect_tree``, checked again by sandfleet/worker/program/artifacts.py) follows no
symlink, reads only regular files (lstat, then O_NOFOLLOW | O_NONBLOCK and fstat), applies the caps
before reading, and refuses names that are not plain relative paths. Each case asserts the mechanism
that refused it: the skipped entry's reason, and that no byte of a file outside the folder came back.
Outcomes go to ``artifacts/security-results.json`` (see SECURITY.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .helpers import program, record

PASSWD_MARK = b"root:x:0:0"  # /etc/passwd's first line, in every Debian image


def kept_bytes(run: Any) -> bytes:
    return b"".join(a.data for a in run.artifacts.kept)


def reasons(run: Any) -> dict[str, str]:
    return {s.name: s.reason for s in run.artifacts.skipped}


def test_symlinks_out_of_the_folder_are_never_followed(run: Callable[..., Any], runtime: str) -> None:
    source = program(
        r"""
        import os
        out = "/workspace/out"
        os.symlink("/etc/passwd", f"{out}/passwd")              # a file outside
        os.symlink("/etc", f"{out}/etc")                        # a folder outside
        os.symlink("../.sandfleet/program.py", f"{out}/own")    # a file inside the workdir
        os.makedirs(f"{out}/deep/er")
        os.symlink("/proc/1/environ", f"{out}/deep/er/environ")
        open(f"{out}/ok.txt", "w").write("fine")
        print("RESULT: 1")
        """
    )
    result = run(source, runtime)
    got = reasons(result)
    blocked = (
        [a.info.name for a in result.artifacts.kept] == ["ok.txt"]
        and all(
            got.get(n) == "a symbolic link (never followed)"
            for n in ("passwd", "etc", "own", "deep/er/environ")
        )
        and PASSWD_MARK not in kept_bytes(result)
    )
    record("artifacts: symlinks out of /workspace/out (file, folder, /proc)", runtime, blocked, got)
    assert blocked, got


def test_the_folder_itself_swapped_for_a_symlink_is_refused(run: Callable[..., Any], runtime: str) -> None:
    source = program(
        r"""
        import os
        os.rmdir("/workspace/out")
        os.symlink("/etc", "/workspace/out")
        print("RESULT: 1")
        """
    )
    result = run(source, runtime)
    got = reasons(result)
    blocked = not result.artifacts.kept and "not a folder" in got.get(".", "")
    record("artifacts: /workspace/out replaced by a symlink to /etc", runtime, blocked, got)
    assert blocked, got


def test_fifos_sockets_and_devices_are_refused_without_blocking(
    run: Callable[..., Any], runtime: str
) -> None:
    source = program(
        r"""
        import json, os, socket
        out = "/workspace/out"
        os.mkfifo(f"{out}/fifo")                                 # a reader that opens it would wait forever
        s = socket.socket(socket.AF_UNIX); s.bind(f"{out}/sock")
        try:
            os.mknod(f"{out}/null", 0o666 | 0o020000, os.makedev(1, 3))   # a character device
            made = "made"
        except OSError as e:
            made = e.errno
        print("RESULT: " + json.dumps({"mknod": made}))
        """
    )
    began = time.monotonic()
    result = run(source, runtime)
    took = time.monotonic() - began
    got = reasons(result)
    mknod = result.result["mknod"] if result.result_found else None
    blocked = (
        not result.artifacts.kept
        and got.get("fifo") == "a fifo, not a regular file"
        and got.get("sock") == "a socket, not a regular file"
        and (mknod == 1 or got.get("null") == "a device, not a regular file")  # EPERM: no CAP_MKNOD
        and took < 15
    )
    record(
        "artifacts: fifo, socket and device under /workspace/out", runtime, blocked, {**got, "mknod": mknod}
    )
    assert blocked, (got, mknod, took)


def test_caps_hold_against_a_sparse_giant_and_a_flood_of_files(run: Callable[..., Any], runtime: str) -> None:
    source = program(
        r"""
        import os
        out = "/workspace/out"
        with open(f"{out}/giant.bin", "wb") as f:
            f.truncate(50 * 1024**3)                              # 50 GiB, sparse: costs the tmpfs nothing
        for i in range(300):
            open(f"{out}/n{i:03d}.txt", "w").write(str(i))
        print("RESULT: 1")
        """
    )
    result = run(source, runtime)
    skipped = {s.name: s for s in result.artifacts.skipped}
    kept = result.artifacts.kept
    giant = skipped.get("giant.bin")
    blocked = (
        giant is not None
        and giant.reason.startswith("larger than the cap")
        and len(kept) == 100  # the default cap of files per job
        and result.artifacts.cap_hit
        and "artifacts" in result.limits_hit
        and result.artifacts.total_bytes < 1024
    )
    record(
        "artifacts: a 50 GiB sparse file and 300 files (caps per file and per job)",
        runtime,
        blocked,
        {"kept": len(kept), "giant": giant.reason if giant else None, "limits_hit": result.limits_hit},
    )
    assert blocked


def test_names_that_are_not_plain_paths_are_refused(run: Callable[..., Any], runtime: str) -> None:
    source = program(
        r"""
        import os
        out = b"/workspace/out"
        open(out + b"/new\nline.txt", "w").write("x")
        open(out + b"/back\\slash.txt", "w").write("x")
        open(out + b"/latin1-\xe9.txt", "w").write("x")           # not UTF-8
        open(out + b"/plain.txt", "w").write("x")
        print("RESULT: 1")
        """
    )
    result = run(source, runtime)
    kept = [a.info.name for a in result.artifacts.kept]
    refused = [s for s in result.artifacts.skipped if "name" in s.reason]
    blocked = kept == ["plain.txt"] and len(refused) == 3
    record(
        "artifacts: names with a newline, a backslash, non-UTF-8 bytes",
        runtime,
        blocked,
        [s.reason for s in refused],
    )
    assert blocked, (kept, result.artifacts.skipped)
