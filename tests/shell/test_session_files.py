"""Shell mode's file tools on a real session sandbox, under runc and gVisor: they work inside the
workspace, and every way out (symlinks, ``..``, absolute paths, ``/proc/self/root``) is refused by the
path's resolution INSIDE the container.

How the tests know it is that mechanism, not a string check on the host: the escapes are symlinks the
model made with sandbox_exec, which exist only in the container; the refusal names the path they
resolve to there; and paths that a string check would refuse but that resolve inside the workspace
(``/proc/self/root/workspace/...``, a symlink to a workspace folder) are allowed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sandfleet.worker.engine.shell.tools import ShellTools

OpenTools = Callable[..., ShellTools]

ESCAPES = {  # what sandbox_exec makes, for each path the file tools are then asked for
    "evil": "ln -s /etc/passwd evil",
    "etc/passwd": "ln -s /etc etc",
    "deep/er/out": "mkdir -p deep/er && ln -s ../../../etc/hostname deep/er/out",
    "../etc/passwd": "true",
    "sub/../../etc/passwd": "mkdir -p sub",
    "/etc/passwd": "true",
    "/proc/self/root/etc/passwd": "true",
    "/proc/self/cwd/../etc/passwd": "true",
    "loop": "ln -s /proc/self/root loop",
}


def test_write_read_and_list_in_the_workspace(open_tools: OpenTools) -> None:
    tools = open_tools()
    text = "naïve café ✓\nsecond line\n"
    assert tools.sandbox_write_file("reports/q3/summary.txt", text) == {
        "path": "reports/q3/summary.txt",
        "bytes": len(text.encode()),
    }
    assert tools.sandbox_read_file("reports/q3/summary.txt") == text
    assert tools.sandbox_read_file("/workspace/reports/q3/summary.txt") == text  # absolute, inside
    tools.sandbox_write_file("reports/q3/summary.txt", "replaced")
    assert tools.sandbox_read_file("reports/q3/summary.txt") == "replaced"
    listing = tools.sandbox_list_files("reports/q3")
    assert listing == {
        "path": "reports/q3",
        "entries": [{"name": "summary.txt", "kind": "file", "size": 8}],
        "left_out": 0,
    }
    top = {e["name"]: e["kind"] for e in tools.sandbox_list_files()["entries"]}
    assert top == {"reports": "dir"}  # no temporary file was left beside the target
    done = tools.sandbox_exec("cat reports/q3/summary.txt; pwd")
    assert done["stdout"] == "replaced/workspace\n" and done["exit_code"] == 0


@pytest.mark.parametrize("path", sorted(ESCAPES))
def test_paths_that_lead_out_of_the_workspace_are_refused(open_tools: OpenTools, path: str) -> None:
    tools = open_tools()
    assert tools.sandbox_exec(ESCAPES[path])["exit_code"] == 0
    with pytest.raises(PermissionError, match="outside the workspace /workspace") as refused:
        tools.sandbox_read_file(path)
    assert "resolves to /" in str(refused.value)  # the target as resolved in the container
    with pytest.raises(PermissionError, match="outside the workspace"):
        tools.sandbox_write_file(path, "overwritten")
    with pytest.raises(PermissionError, match="outside the workspace"):
        tools.sandbox_list_files(path)
    # Nothing outside was touched (the root file system is read-only anyway; /tmp is not).
    check = tools.sandbox_exec("grep -c overwritten /etc/passwd /etc/hostname || true")
    assert "overwritten" not in check["stdout"] and check["stdout"].strip().endswith(":0")


def test_a_symlinked_folder_cannot_carry_a_write_out(open_tools: OpenTools) -> None:
    tools = open_tools()
    tools.sandbox_exec("ln -s /tmp scratch")
    with pytest.raises(PermissionError, match=r"resolves to /tmp/new\.txt, outside the workspace"):
        tools.sandbox_write_file("scratch/new.txt", "escaped")
    assert tools.sandbox_exec("test -e /tmp/new.txt; echo $?")["stdout"] == "1\n"


def test_paths_that_resolve_inside_are_allowed(open_tools: OpenTools) -> None:
    """What a string check would refuse but the resolution shows to be inside the workspace."""
    tools = open_tools()
    tools.sandbox_write_file("data/a.txt", "inside")
    tools.sandbox_exec("ln -s data alias && ln -s /workspace/data/a.txt absolute-link")
    assert tools.sandbox_read_file("alias/a.txt") == "inside"
    assert tools.sandbox_read_file("absolute-link") == "inside"
    assert tools.sandbox_read_file("/proc/self/root/workspace/data/a.txt") == "inside"
    assert tools.sandbox_read_file("data/../data/./a.txt") == "inside"
    entries = {e["name"]: e for e in tools.sandbox_list_files()["entries"]}
    assert entries["alias"] == {"name": "alias", "kind": "symlink", "size": 0, "target": "data"}


def test_files_that_are_not_text_and_folders(open_tools: OpenTools) -> None:
    tools = open_tools()
    tools.sandbox_exec("head -c 100 /dev/zero > zeros.bin && printf '\\xff\\xfe' > latin.bin && mkdir folder")
    with pytest.raises(ValueError, match="NUL bytes"):
        tools.sandbox_read_file("zeros.bin")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        tools.sandbox_read_file("latin.bin")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        tools.sandbox_read_file("folder")
    with pytest.raises(IsADirectoryError):
        tools.sandbox_write_file("folder", "x")
    with pytest.raises(FileNotFoundError):
        tools.sandbox_read_file("missing.txt")
    with pytest.raises(NotADirectoryError):
        tools.sandbox_list_files("zeros.bin")
    with pytest.raises(TypeError, match="path must be a str"):
        tools.sandbox_read_file(3)  # type: ignore[arg-type]


def test_a_long_file_is_read_as_head_and_tail(open_tools: OpenTools) -> None:
    tools = open_tools(max_result_bytes=4096)
    tools.sandbox_exec("python3 -c \"print('FIRST'); print('x' * 100000); print('LAST')\" > big.txt")
    text = tools.sandbox_read_file("big.txt")
    assert text.startswith("FIRST\n") and text.endswith("LAST\n")
    assert "bytes left out: the stream was 100,012 bytes" in text and len(text) < 4096 + 200
